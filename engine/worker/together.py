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

Follow-ups are gathered (:class:`FollowUps`): where replies ended and nothing
is decoding, a prompt that arrives waits a few milliseconds for the others'
follow-ups, so that they are read in one decode.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from engine.worker.protocol import GenerateRequestMsg, ShutdownRequest, TokenizeRequest

if TYPE_CHECKING:
    from engine.generation.generator import GenerateRequest
    from engine.generation.parallel import Job
    from engine.worker.server import Worker


# the longest a prompt waits for the follow-ups of replies that ended before it (see FollowUps)
GATHER_S = 0.02
# replies that ended longer ago than this are not waited for: their clients are not sending back to back
EXPECT_S = 1.0


class FollowUps:
    """Follow-up requests expected from clients whose replies ended, until the next prompt is read.

    Clients sending back to back (agents, an editor, a benchmark's clients) answer replies that ended in
    the same step with new requests a few milliseconds apart: each reply's last events and each new
    request pass through the server one after another. Started as they came, the first prompt was read
    alone and the rest a step later, in a second decode: two passes over the weights where one would do
    (a prompt's few rows cost little beside a pass on a CPU), and that client then stayed a step ahead of
    the others, so it happened again at every turn (4 clients sending 32-token requests back to back: 3
    decodes per turn where llama-server made 1, ours 0.91x its tokens/s, and level with it on long
    replies). So where replies ended within :data:`EXPECT_S` and nothing is decoding (no running reply
    waits), a prompt waits up to :data:`GATHER_S` for as many requests as replies ended; a client that
    does not come back costs that wait once. A lone client (one ended, one came) never waits.
    """

    def __init__(self) -> None:
        self.ended = 0  # replies ended since a prompt was last read
        self.arrived = 0  # generate requests arrived since then
        self.last_end = 0.0

    def end(self, jobs: list[Job]) -> None:
        """``jobs`` ended in the last step. A reply cancelled or failed is no turn of a conversation: its
        client is not expected back soon."""
        n = sum(1 for job in jobs if job.result is not None and job.result.finish_reason != "cancelled")
        if n:
            self.ended += n
            self.last_end = time.monotonic()

    def arrive(self) -> None:
        self.arrived += 1

    def read(self) -> None:
        """Prompts are read in the coming step: whoever comes later is not waited for."""
        self.ended = self.arrived = 0

    def expected(self) -> bool:
        return self.arrived < self.ended and time.monotonic() - self.last_end < EXPECT_S


def serve_together(worker: Worker, first: GenerateRequestMsg, gen: GenerateRequest) -> None:
    """Run ``first`` and every generate request that arrives while any runs, then return."""
    from engine.generation.parallel import Job, ParallelGenerator

    if worker.together is None or worker.together.session is not worker.session:
        worker.together = ParallelGenerator(worker.session)
    engine = worker.together
    follow_ups: FollowUps = worker.follow_ups
    follow_ups.arrive()
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

    def take(request: Any) -> None:
        """A request read from the queue while generations run."""
        nonlocal closing
        if request is None or isinstance(request, ShutdownRequest):
            closing = True  # the running ones see worker.stopping() and end cancelled
            worker.deferred.append(request)
        elif isinstance(request, GenerateRequestMsg) and worker.deferred:
            worker.deferred.append(request)  # nothing overtakes a request that waits
        elif isinstance(request, GenerateRequestMsg):
            follow_ups.arrive()
            try:
                waiting.append((request, worker.generate_request(request)))
            except Exception as exc:
                worker.fail(request, exc)
                worker.finished(request.id)
        elif isinstance(request, TokenizeRequest):
            worker.serve_one(request)
        else:
            worker.deferred.append(request)

    def start() -> None:
        """Start what waits, as far as sequences are free (its prompt rendered, its sequence chosen)."""
        while waiting and engine.has_room:
            request, g = waiting.popleft()
            job = Job(g, should_stop=lambda rid=request.id: worker.stopping(rid), **worker.callbacks(request))
            running[id(job)] = request
            engine.add(job)
            if job.done:  # it could not start (its prompt does not fit, …)
                end(job)

    def take_arrived(deadline: float | None = None) -> None:
        """What arrived meanwhile; with ``deadline`` (monotonic), also what arrives before it while
        follow-ups are expected, each started as it comes (starting one costs ~1 ms: overlapped with the
        wait, not paid after it, 8 at a time)."""
        while not closing:
            try:
                if deadline is None or not follow_ups.expected():
                    request = worker.requests.get_nowait()
                elif (left := deadline - time.monotonic()) > 0:
                    request = worker.requests.get(timeout=left)
                else:
                    return
            except queue.Empty:
                return
            take(request)
            if deadline is not None:
                start()

    try:
        while waiting or not engine.idle:
            if waiting:
                if not any(r.prefilled for r in engine.running):  # no running reply would wait
                    start()
                    take_arrived(time.monotonic() + GATHER_S)
                follow_ups.read()
            start()
            worker.current = next(iter(running.values())).id if running else None
            ended = engine.step()
            follow_ups.end(ended)
            for job in ended:
                end(job)
            take_arrived()
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

