"""The worker serving several generate requests at once, on a session that holds several sequences.

When the loaded model was loaded with ``parallel`` > 1, the first generate
request starts a :class:`~engine.generation.parallel.ParallelGenerator`; while
it runs, the worker keeps reading its queue between steps: a generate request
joins as soon as a sequence is free (in arrival order), a tokenize request is
answered at once, and anything that must not run beside generations (a load,
an unload, shutting down) waits until every running one has ended, ahead of
what arrives later. A request with images joins like any other (its prompt is
decoded into its own sequence as it starts: engine/generation/parallel.py). Each request gets exactly the
events it would get alone, ending with its ``done``.
"""

from __future__ import annotations

import queue
from collections import deque
from typing import TYPE_CHECKING

from engine.worker.protocol import GenerateRequestMsg, ShutdownRequest, TokenizeRequest

if TYPE_CHECKING:
    from engine.generation.generator import GenerateRequest
    from engine.worker.server import Worker


def serve_together(worker: Worker, first: GenerateRequestMsg, gen: GenerateRequest) -> None:
    """Run ``first`` and every generate request that arrives while any runs, then return."""
    from engine.generation.parallel import Job, ParallelGenerator

    if worker.together is None or worker.together.session is not worker.session:
        worker.together = ParallelGenerator(worker.session)
    engine = worker.together
    waiting: deque[tuple[GenerateRequestMsg, GenerateRequest]] = deque([(first, gen)])
    running: dict[int, GenerateRequestMsg] = {}  # id(job) -> its request
    closing = False

    def end(job: Job) -> None:
        request = running.pop(id(job))
        if job.error is not None:
            worker.fail(request, job.error)
        else:
            worker.done(request, job.result)
        worker.finished(request.id)

    try:
        while waiting or not engine.idle:
            while waiting and engine.has_room:
                request, g = waiting.popleft()
                job = Job(g, should_stop=lambda rid=request.id: worker.stopping(rid), **worker.callbacks(request))
                running[id(job)] = request
                engine.add(job)
                if job.done:  # it could not start (its prompt does not fit, …)
                    end(job)
            worker.current = next(iter(running.values())).id if running else None
            for job in engine.step():
                end(job)
            while not closing:  # what arrived meanwhile
                try:
                    request = worker.requests.get_nowait()
                except queue.Empty:
                    break
                if request is None or isinstance(request, ShutdownRequest):
                    closing = True  # the running ones see worker.stopping() and end cancelled
                    worker.deferred.append(request)
                elif isinstance(request, GenerateRequestMsg) and worker.deferred:
                    worker.deferred.append(request)  # nothing overtakes a request that waits
                elif isinstance(request, GenerateRequestMsg):
                    try:
                        waiting.append((request, worker.generate_request(request)))
                    except Exception as exc:
                        worker.fail(request, exc)
                        worker.finished(request.id)
                elif isinstance(request, TokenizeRequest):
                    worker.serve_one(request)
                else:
                    worker.deferred.append(request)
    except BaseException as exc:
        for job in engine.cancel_all(exc):
            end(job)
        for request, _ in waiting:
            worker.fail(request, exc)
            worker.finished(request.id)
        if not isinstance(exc, Exception):
            raise
    finally:
        worker.current = None

