"""The worker process: owns llama.cpp, serves the protocol on stdin/stdout.

Run as ``python -m engine.worker``. A native abort here ends this process,
never the app. Native code prints to file descriptor 1, so before anything
loads llama_cpp the protocol stream moves to a duplicate of fd 1 and fd 1 is
pointed at stderr: stray native output can never corrupt the protocol.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import sys
import threading
import traceback
from typing import IO, Any

from engine.errors import EngineError, ProtocolError
from engine.unicode_text import first_bad_text, printable
from engine.worker import parent_watch, protocol
from engine.worker.events import (
    AckEvent,
    ByeEvent,
    DoneEvent,
    EngineBuild,
    ErrorEvent,
    Event,
    LoadedEvent,
    ModelInfo,
    PrefillEvent,
    ReadyEvent,
    StatsEvent,
    TokenEvent,
    TokenLogprobs,
    TokensEvent,
    UnloadedEvent,
)
from engine.worker.fields import build
from engine.worker.protocol import (
    CancelRequest,
    GenerateRequestMsg,
    LoadRequest,
    ShutdownRequest,
    TokenizeRequest,
    UnloadRequest,
)
from engine.worker.rpc_stop import RpcStop
from engine.worker.together import FollowUps

MAX_LINE_BYTES = 256 * 2**20  # a request line longer than this is refused unread
EXIT_GRACE_S = 5.0  # after stdin closes, how long the work in hand may take before the process ends anyway
PARENT_CHECK_S = 1.0  # how often the worker looks whether the process that started it is still there


class EventWriter:
    """Writes events as JSON lines; safe from the reader and the main thread.

    A closed pipe means the app is gone: ``on_broken`` is told once and later
    events are dropped, so the worker winds down instead of dying mid-reply
    with a traceback."""

    def __init__(self, stream: IO[str], on_broken: Any = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._on_broken = on_broken
        self.broken = False

    def send(self, event: Event) -> None:
        line = protocol.encode(event)
        if first_bad_text(line) is not None:  # never expected (requests are checked); not a broken pipe either
            line = printable(line)
        with self._lock:
            if self.broken:
                return
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # ValueError: the stream was closed
                self.broken = True
        if self.broken and self._on_broken is not None:
            self._on_broken()


class Worker:
    """The request loop. A reader thread parses stdin so ``cancel`` is seen mid-generation.

    Cancellation is by request id: the reader marks a waiting or running
    generate request cancelled, and the generation (decode loop, template
    rendering) asks :meth:`stopping` between steps. When stdin closes (the
    app is gone) everything in hand is cancelled and the process ends, at the
    latest :data:`EXIT_GRACE_S` later."""

    def __init__(self, writer: EventWriter, stdin: IO[bytes]) -> None:
        self.out = writer
        self.stdin = stdin
        self.requests: queue.Queue[Any] = queue.Queue()
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self.pending: list[str] = []  # generate requests queued or running, in order
        self.cancelled: set[str] = set()
        self.current: str | None = None  # id of the running generate request (the first, when several run)
        # requests read while several generations ran that wait for them to end (load, unload, images)
        self.deferred: list[Any] = []
        # the multi-sequence engine of the loaded session (engine/worker/together.py), kept between
        # bursts of requests: each sequence remembers what it holds, for the next prompt to reuse
        self.together: Any = None
        # follow-up requests expected from clients whose replies ended (engine/worker/together.py)
        self.follow_ups = FollowUps()
        self.session: Any = None
        # Stop's deadline for a reply waiting on a remote server that stopped answering
        self.rpc_stop = RpcStop(lambda: self.current, self._end_stopped_reply, say)
        self._stop_ended: str | None = None  # the reply ended by that deadline (its answer goes out once)

    # -- reader thread ------------------------------------------------------
    def read_loop(self) -> None:
        while not self.closing.is_set():
            line = self.stdin.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            try:
                self._read_line(line)
            except ProtocolError as exc:
                self.out.send(ErrorEvent(None, exc.kind, str(exc)))
            except Exception as exc:  # whatever a line does, the reader keeps reading
                say(traceback.format_exc())
                self.out.send(ErrorEvent(None, "protocol", f"the worker could not read a request: {exc!r}"))
        self.close("stdin closed: the app is gone")

    def _read_line(self, line: bytes) -> None:
        if len(line) > MAX_LINE_BYTES:
            self._skip_rest_of_line(line)
            raise ProtocolError(f"a request line is longer than {MAX_LINE_BYTES // 2**20} MiB; it was skipped")
        if not line.strip():
            return
        try:
            request = protocol.decode_request(line)
        except ProtocolError as exc:
            self.out.send(ErrorEvent(protocol.request_id(line), exc.kind, str(exc), final=True))
            return
        if isinstance(request, CancelRequest):
            target = self._cancel(request.target)
            self.out.send(AckEvent(request.id, target=target))
            session = self.session
            if target is not None and target == self.current and session is not None:
                self.rpc_stop.arm(target, tuple(session.options.rpc))
            return
        if isinstance(request, GenerateRequestMsg):
            with self._lock:
                taken = request.id in self.pending
                if not taken:
                    self.pending.append(request.id)
            if taken:  # an answer with this id would read as the first one's (and end it): say it without
                self.out.send(ErrorEvent(None, "protocol", f"a generate request with id {request.id!r} is "
                                         "still waiting or running; this one was refused (give each request "
                                         "its own id)", final=False))
                return
        elif isinstance(request, ShutdownRequest):  # no reply is worth finishing once the app asks to quit
            with self._lock:
                self.cancelled.update(self.pending)
        self.requests.put(request)

    def _skip_rest_of_line(self, line: bytes) -> None:
        while line and not line.endswith(b"\n"):
            line = self.stdin.readline(MAX_LINE_BYTES)

    def _cancel(self, target: str | None) -> str | None:
        """Mark ``target`` (None: the running request, else the first waiting one) cancelled; which one it was."""
        with self._lock:
            if target is None:
                target = self.current or (self.pending[0] if self.pending else None)
            if target is None or target not in self.pending:
                return None
            self.cancelled.add(target)
            return target

    def close(self, why: str) -> None:
        """The app is gone: cancel everything, stop serving, and end the process soon whatever it is doing."""
        if self.closing.is_set():
            return
        # the way out first, the words after: the app that would read them may be gone (a broken or
        # full stderr pipe), and a diagnostic must never keep an orphaned worker alive
        self.closing.set()
        timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(0,))
        timer.daemon = True
        timer.start()
        self.requests.put(None)
        say(f"worker: {why}; exiting")

    def watch_parent(self) -> None:
        """Close when the parent process is gone, even if stdin never ends (another
        process may hold the pipe open): an orphaned worker must not run on. The
        fallback where the kernel's parent-death signal is missing (parent_watch)."""
        gone = parent_watch.parent_gone()
        while not self.closing.wait(PARENT_CHECK_S):
            if gone():
                self.close("the process that started the worker is gone")

    def stopping(self, request_id: str) -> bool:
        return request_id in self.cancelled or self.closing.is_set()

    # -- main loop ------------------------------------------------------------
    def serve(self) -> None:
        from engine.runtime import native
        from engine.speculative.settings import MAX_DRAFT

        self.out.send(ReadyEvent(protocol=protocol.PROTOCOL_VERSION, pid=os.getpid(),
                                 engine=EngineBuild(**native.build_info()), max_draft=MAX_DRAFT))
        threading.Thread(target=self.read_loop, name="protocol-reader", daemon=True).start()
        threading.Thread(target=self.watch_parent, name="parent-watch", daemon=True).start()
        while True:
            request = self.deferred.pop(0) if self.deferred else self.requests.get()
            if request is None or self.closing.is_set() or isinstance(request, ShutdownRequest):
                self._unload()
                self.out.send(ByeEvent(request.id if isinstance(request, ShutdownRequest) else None))
                return
            self.serve_one(request)

    def serve_one(self, request: Any) -> None:
        generating = isinstance(request, GenerateRequestMsg)
        try:
            if isinstance(request, LoadRequest):
                self._load(request)
            elif generating:
                self._generate(request)
            elif isinstance(request, UnloadRequest):
                self._unload()
                self.out.send(UnloadedEvent(request.id))
            elif isinstance(request, TokenizeRequest):
                self._tokenize(request)
        except Exception as exc:
            self.fail(request, exc)
        finally:
            if generating:
                self.finished(request.id)

    def fail(self, request: Any, exc: BaseException) -> None:
        """Answer a request that failed: a generate request always ends with "done"; others with the error."""
        generating = isinstance(request, GenerateRequestMsg)
        kind = exc.kind if isinstance(exc, EngineError) else "internal"
        if not isinstance(exc, EngineError):  # a bug: report it, keep serving
            say("".join(traceback.format_exception(exc)))
        message = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
        self.out.send(ErrorEvent(request.id, kind, message, final=not generating))
        if generating:
            self.out.send(DoneEvent(request.id, finish_reason="error"))

    def finished(self, request_id: str) -> None:
        with self._lock:
            if request_id in self.pending:
                self.pending.remove(request_id)
            if request_id not in self.pending:
                self.cancelled.discard(request_id)

    def _load(self, request: LoadRequest) -> None:
        from engine.generation.load_plan import LoadPlan

        # Check the files and settings before letting go of the current model:
        # a bad request must not leave the user with nothing loaded. The session
        # loads from the same plan: each header is read once.
        plan = LoadPlan.read(request.options)
        previous = self.session.options if self.session is not None else None
        self._unload()
        try:
            self.session = self._session(plan)
        except EngineError as exc:
            if previous is not None:
                self._reload(previous, exc)
            raise
        if plan.options.rpc:
            from engine.runtime import rpc

            rpc.on_abort(self._on_native_abort)
        from engine.generation import tool_calls

        model = ModelInfo(**self.session.describe(), is_default_model=request.options.path is None,
                          tool_syntax=tool_calls.family_of(self.session.facts.chat_template))
        self.out.send(LoadedEvent(request.id, model))

    @staticmethod
    def _session(plan: Any) -> Any:
        """The session for ``plan``. Sequences chosen by what fits (``parallel_auto``) may still not fit where
        the estimate is wrong (a GPU's buffers it does not model): a load refused with several is tried with
        one."""
        from dataclasses import replace

        from engine.errors import ContextError
        from engine.generation.session import Session

        try:
            return Session(plan.options, plan)
        except ContextError as exc:
            if not plan.parallel_auto or plan.options.parallel == 1:
                raise
            say(f"worker: {plan.options.parallel} sequences did not load ({exc}); loading one")
            one = replace(plan, options=replace(plan.options, parallel=1),
                          parallel_reason=f"1 request at once ({plan.options.parallel} did not load: {exc})")
            return Session(one.options, one)

    def _on_native_abort(self, message: str) -> None:
        """ggml is ending this process (with remote servers: most often one stopped
        answering). Say so on the protocol first: the reply in hand ends with an
        ``rpc`` error and ``done``; the app then sees the worker exit and restarts it."""
        say(f"worker: ggml aborts: {message}")
        if self.current is not None and self.current == self.rpc_stop.severed:  # Stop cut the wait short
            self._end_stopped_reply(self.current, self.rpc_stop.message)
            return
        servers = ", ".join(self.session.options.rpc) if self.session is not None else ""
        message = re.sub(r"^\S+:\d+: ", "", message)  # ggml's source file:line prefix
        remote = "RPC" in message or "connect" in message
        text = (f"A remote RPC server ({servers}) stopped answering, so the engine stopped ({message.strip()}). "
                "Check that `mtp-studio rpc-server` still runs there (`mtp-studio rpc-probe HOST:PORT`), "
                "then restart the engine and load the model again; the conversation is kept."
                if remote else f"llama.cpp aborted: {message.strip()}")
        rid = self.current
        self.out.send(ErrorEvent(rid, "rpc" if remote else "internal", text, final=rid is None))
        if rid is not None:
            self.out.send(DoneEvent(rid, finish_reason="error"))

    def _end_stopped_reply(self, rid: str, text: str) -> None:
        """End a stopped reply whose wait on a remote server Stop's deadline cut short (``rpc_stop``)."""
        with self._lock:
            if self._stop_ended == rid:
                return
            self._stop_ended = rid
        self.out.send(ErrorEvent(rid, "rpc", text, final=False))
        self.out.send(DoneEvent(rid, finish_reason="cancelled"))

    def _reload(self, previous: Any, failure: EngineError) -> None:
        """Load the previous model again after llama.cpp refused the new one late (past
        every header check), as the protocol promises; say so in ``failure``'s message."""
        from engine.generation.session import Session

        try:
            self.session = Session(previous)
        except Exception as exc:  # the previous model loaded before; if it no longer does, say both
            failure.args = (f"{failure} The previous model could not be loaded again either: {exc}",)
            return
        failure.args = (f"{failure} The previous model is still loaded.",)

    def _unload(self) -> None:
        self.together = None
        if self.session is not None:
            self.session.close()
            self.session = None

    def _tokenize(self, request: TokenizeRequest) -> None:
        from engine.errors import NoModelLoaded
        from engine.generation.prompt import check_prompt_chars

        if self.session is None:
            raise NoModelLoaded("No model is loaded; send a load request first.")
        model = self.session.model
        if request.text is not None:
            check_prompt_chars(len(request.text), self.session.target.n_ctx)
            tokens = model.tokenize(request.text, add_special=request.add_special, parse_special=True)
        else:
            tokens = request.tokens or []
            bad = next((t for t in tokens if not 0 <= t < model.n_vocab), None)
            if bad is not None:
                raise ProtocolError(f"token {bad} is not in this model's vocabulary (0 to {model.n_vocab - 1})")
        pieces = [model.piece(t, special=True) for t in tokens]
        self.out.send(TokensEvent(request.id, tokens, [p.decode("utf-8", errors="replace") for p in pieces],
                                  b"".join(pieces).decode("utf-8", errors="replace")))

    def _generate(self, request: GenerateRequestMsg) -> None:
        from engine.generation.generator import generate

        gen = self.generate_request(request)
        if self.session.n_seq > 1:  # a multi-sequence session: others may join it (images too: docs/parallel.md)
            from engine.worker.together import serve_together

            serve_together(self, request, gen)
            return
        self.together = None  # a generation alone may clear the context: the sequences hold nothing known
        self.current = request.id
        try:
            result = generate(self.session, gen, should_stop=lambda: self.stopping(request.id),
                              **self.callbacks(request))
        finally:
            self.current = None
        self.done(request, result)

    def generate_request(self, request: GenerateRequestMsg) -> Any:
        """The engine's request for a protocol one, checked against the loaded model (notices sent).

        Raises:
            EngineError: no model, or a value this model cannot take.
        """
        from engine.errors import NoModelLoaded
        from engine.generation.generator import GenerateRequest

        if self.session is None:
            raise NoModelLoaded("No model is loaded; send a load request first.")
        check_generate(request)
        pictures = decode_images(request.images)
        if pictures and self.session.projector is None:
            from engine.errors import ImageError
            from engine.generation.images import NO_PROJECTOR

            raise ImageError(NO_PROJECTOR)
        if pictures and request.speculative.enabled and request.speculative.mode != "mtp":
            from engine.generation.images import MTP_OFF_WITH_IMAGES

            self.out.send(ErrorEvent(request.id, "speculative_unavailable", MTP_OFF_WITH_IMAGES, final=False))
        elif request.speculative.uses_mtp and self.session.mtp_drafter is None:
            notice = self.session.mtp_unavailable_reason or "This model has no MTP head."
            notice += " Drafting with n-grams only." if request.speculative.uses_ngram else " Decoding plainly."
            self.out.send(ErrorEvent(request.id, "speculative_unavailable", notice, final=False))
        n_vocab = self.session.model.n_vocab
        for token in request.logit_bias:
            if int(token) >= n_vocab:
                raise ProtocolError(f"logit_bias names token {token}; this model's tokens are 0 to {n_vocab - 1}")
        return GenerateRequest(
            prompt=request.prompt,
            messages=tuple(request.messages) if request.messages is not None else None,
            sampling=request.sampling,
            max_tokens=request.max_tokens,
            stop=tuple(request.stop),
            speculative=request.speculative,
            tools=tuple(request.tools) if request.tools else None,
            grammar=request.grammar,
            grammar_triggers=tuple(request.grammar_triggers),
            grammar_after_thinking=request.grammar_after_thinking,
            logit_bias=tuple((int(token), bias if bias > -100 else float("-inf"))
                             for token, bias in request.logit_bias.items()),
            logprobs=request.logprobs,
            template=request.template,
            template_kwargs=request.template_kwargs,
            continue_final_message=request.continue_final_message,
            split_reasoning=request.split_reasoning,
            images=pictures,
        )

    def callbacks(self, request: GenerateRequestMsg) -> dict[str, Any]:
        """What a generation calls as it goes: each sends the request's events."""
        rid = request.id
        return {
            "on_text": lambda text, draft: self.out.send(TokenEvent(rid, text, draft)),
            "on_text_logprobs": None if request.logprobs < 0 else lambda text, draft, entries: self.out.send(
                TokenEvent(rid, text, draft, logprobs=[build(TokenLogprobs, e, "logprobs") for e in entries])),
            "on_stats": lambda stats: self.out.send(StatsEvent(rid, stats.snapshot())),
            "on_prefill": lambda done, total: self.out.send(PrefillEvent(rid, done, total)),
            "on_reasoning": lambda text: self.out.send(TokenEvent(rid, text, reasoning=True)),
        }

    def done(self, request: GenerateRequestMsg, result: Any) -> None:
        """The request's last event: how it ended, with its statistics."""
        logprobs = [build(TokenLogprobs, entry, "logprobs") for entry in result.logprobs] \
            if request.logprobs >= 0 else None
        self.out.send(DoneEvent(request.id, result.finish_reason, result.stats.snapshot(), result.prompt_mode,
                                len(result.tokens), logprobs, result.stop))


def say(text: str) -> None:
    """A diagnostic line on stderr, never an error: stderr is often a pipe to an app that may be gone
    (a ``BrokenPipeError`` here once killed the very threads that end an orphaned worker)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def decode_images(images: list[str]) -> tuple[bytes, ...]:
    """The encoded images of a generate request, from their base64.

    Raises:
        ProtocolError: naming the image whose base64 does not decode.
    """
    import base64
    import binascii

    out = []
    for i, text in enumerate(images):
        try:
            out.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise ProtocolError(f"generate.images[{i}] is not base64; send each image file as base64 text") from None
    return tuple(out)


def check_generate(request: GenerateRequestMsg) -> None:
    """Refuse what the decode loop cannot honour, before any work: a prompt and
    messages at once, a negative token limit, or text that is not Unicode (a
    lone surrogate from a JSON escape such as ``\\ud800`` cannot be tokenized)."""
    if (request.prompt is None) == (request.messages is None):
        raise ProtocolError("generate needs exactly one of 'prompt' or 'messages'")
    if request.max_tokens < 0:
        raise ProtocolError(f"generate.max_tokens must be 0 or more, got {request.max_tokens}")
    texts = [request.prompt or "", *request.stop]
    texts += [value for message in request.messages or () for value in message.values() if isinstance(value, str)]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ProtocolError(
                f"the request's text holds a lone surrogate ({text[exc.start]!r} at offset {exc.start}), "
                "which is not Unicode; send valid text"
            ) from None


def main() -> int:
    parent_watch.arm_death_signal()  # first: from here on the app's death ends this process
    proto_fd = os.dup(1)
    os.dup2(2, 1)  # anything native (or print) that writes to fd 1 now lands on stderr
    sys.stdout = sys.stderr
    stream = os.fdopen(proto_fd, "w", encoding="utf-8", buffering=1)
    if os.environ.get("MTP_STUDIO_WORKER_VERBOSE"):
        from engine.runtime import native

        native.set_verbose(True)
    worker: Worker | None = None
    writer = EventWriter(stream, on_broken=lambda: worker and worker.close("the app stopped reading events"))
    worker = Worker(writer, sys.stdin.buffer)
    worker.serve()
    # End here, not through interpreter shutdown: the reader thread may be blocked
    # reading stdin, and finalizing a buffered stream another thread holds aborts.
    for finished in (stream, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the app may have closed the pipe
            finished.flush()
    os._exit(0)
