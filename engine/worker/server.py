"""The worker process: owns llama.cpp, serves the protocol on stdin/stdout.

Run as ``python -m engine.worker``. A native abort here ends this process,
never the app. Native code prints to file descriptor 1, so before anything
loads llama_cpp the protocol stream moves to a duplicate of fd 1 and fd 1 is
pointed at stderr: stray native output can never corrupt the protocol.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
from typing import IO, Any

from engine.errors import EngineError, ProtocolError
from engine.worker import protocol
from engine.worker.events import (
    ByeEvent,
    DoneEvent,
    EngineBuild,
    ErrorEvent,
    Event,
    LoadedEvent,
    ModelInfo,
    ReadyEvent,
    StatsEvent,
    TokenEvent,
    UnloadedEvent,
)
from engine.worker.protocol import (
    CancelRequest,
    GenerateRequestMsg,
    LoadRequest,
    ShutdownRequest,
    UnloadRequest,
)


class EventWriter:
    """Writes events as JSON lines; safe from the reader and the main thread."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, event: Event) -> None:
        line = protocol.encode(event)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class Worker:
    """The request loop. A reader thread parses stdin so ``cancel`` is seen mid-generation."""

    def __init__(self, writer: EventWriter, stdin: IO[str]) -> None:
        self.out = writer
        self.stdin = stdin
        self.requests: queue.Queue[Any] = queue.Queue()
        self.cancel = threading.Event()
        self.current: str | None = None  # id of the running generate request
        self.session: Any = None

    # -- reader thread ------------------------------------------------------
    def read_loop(self) -> None:
        for line in self.stdin:
            if not line.strip():
                continue
            try:
                request = protocol.decode_request(line)
            except ProtocolError as exc:
                self.out.send(ErrorEvent(protocol.request_id(line), exc.kind, str(exc), final=True))
                continue
            if isinstance(request, CancelRequest):
                if request.target is None or request.target == self.current:
                    self.cancel.set()
                continue
            self.requests.put(request)
        self.requests.put(None)  # stdin closed: the app is gone

    # -- main loop ------------------------------------------------------------
    def serve(self) -> None:
        from engine.runtime import native
        from engine.speculative.settings import MAX_DRAFT

        self.out.send(ReadyEvent(protocol=protocol.PROTOCOL_VERSION, pid=os.getpid(),
                                 engine=EngineBuild(**native.build_info()), max_draft=MAX_DRAFT))
        threading.Thread(target=self.read_loop, name="protocol-reader", daemon=True).start()
        while True:
            request = self.requests.get()
            if request is None or isinstance(request, ShutdownRequest):
                self._unload()
                self.out.send(ByeEvent(getattr(request, "id", None)))
                return
            generating = isinstance(request, GenerateRequestMsg)
            try:
                if isinstance(request, LoadRequest):
                    self._load(request)
                elif generating:
                    self._generate(request)
                elif isinstance(request, UnloadRequest):
                    self._unload()
                    self.out.send(UnloadedEvent(request.id))
            except Exception as exc:
                kind = exc.kind if isinstance(exc, EngineError) else "internal"
                if not isinstance(exc, EngineError):  # a bug: report it, keep serving
                    traceback.print_exc(file=sys.stderr)
                message = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
                # A generate request always ends with "done"; others end with this error.
                self.out.send(ErrorEvent(request.id, kind, message, final=not generating))
                if generating:
                    self.out.send(DoneEvent(request.id, finish_reason="error"))

    def _load(self, request: LoadRequest) -> None:
        from engine import default_model, gguf_info, sidecar
        from engine.errors import SpeculativeUnavailable
        from engine.generation.session import LoadOptions, Session

        path = request.path or str(default_model.default_model_path())
        # Check the files before letting go of the current model: a bad path
        # must not leave the user with nothing loaded.
        target = gguf_info.read_facts(path)
        if request.sidecar:
            try:
                sidecar.check_sidecar(target, gguf_info.read_facts(request.sidecar))
            except SpeculativeUnavailable:
                pass  # the session loads the model without MTP and says why
        self._unload()
        self.session = Session(
            LoadOptions(
                path=path, n_ctx=request.n_ctx, n_gpu_layers=request.n_gpu_layers,
                n_threads=request.n_threads, mtp=request.mtp, sidecar=request.sidecar,
            )
        )
        model = ModelInfo(**self.session.describe(), is_default_model=request.path is None)
        self.out.send(LoadedEvent(request.id, model))

    def _unload(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def _generate(self, request: GenerateRequestMsg) -> None:
        from engine.errors import NoModelLoaded
        from engine.generation.generator import GenerateRequest, generate
        from engine.runtime import SamplingParams

        if self.session is None:
            raise NoModelLoaded("No model is loaded; send a load request first.")
        if (request.prompt is None) == (request.messages is None):
            raise ProtocolError("generate needs exactly one of 'prompt' or 'messages'")
        if request.speculative.enabled and self.session.drafter is None:
            notice = self.session.mtp_unavailable_reason or "This model has no MTP head; decoding plainly."
            self.out.send(ErrorEvent(request.id, "speculative_unavailable", notice, final=False))
        gen = GenerateRequest(
            prompt=request.prompt,
            messages=tuple(request.messages) if request.messages is not None else None,
            sampling=SamplingParams(request.temperature, request.top_k, request.top_p, request.min_p,
                                    request.seed),
            max_tokens=request.max_tokens,
            stop=tuple(request.stop),
            speculative=request.speculative,
        )
        self.cancel.clear()
        self.current = request.id
        try:
            result = generate(
                self.session, gen,
                on_text=lambda text, draft: self.out.send(TokenEvent(request.id, text, draft)),
                on_stats=lambda stats: self.out.send(StatsEvent(request.id, stats.snapshot())),
                should_stop=self.cancel.is_set,
            )
        finally:
            self.current = None
        self.out.send(DoneEvent(request.id, result.finish_reason, result.stats.snapshot(), result.prompt_mode,
                                len(result.tokens)))


def main() -> int:
    proto_fd = os.dup(1)
    os.dup2(2, 1)  # anything native (or print) that writes to fd 1 now lands on stderr
    sys.stdout = sys.stderr
    stream = os.fdopen(proto_fd, "w", encoding="utf-8", buffering=1)
    if os.environ.get("MTP_STUDIO_WORKER_VERBOSE"):
        from engine.runtime import native

        native.set_verbose(True)
    Worker(EventWriter(stream), sys.stdin).serve()
    return 0
