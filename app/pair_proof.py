"""Proof that the engine can use a target + sidecar pair (after a repair):
load the pair in a fresh worker and draft a few tokens.

It runs in its own worker process through the same client as the chat (and
so the same process wrapper): a native abort while loading a bad pair ends
that worker, and the outcome says how.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.engine_client import EngineClient
from engine.speculative.settings import mtp
from engine.worker import protocol as P
from engine.worker.events import DoneEvent, ErrorEvent, LoadedEvent, ReadyEvent

PROOF_PROMPT = " the"
PROOF_TOKENS = 8


class PairProof(QObject):
    """Signals:
        sig_proved(str): "loaded with MTP (single); 3 rounds, 4/6 drafts accepted".
        sig_failed(str): the engine could not use the pair; the text says why.
    """

    sig_proved = Signal(str)
    sig_failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = EngineClient(self)
        self.client.sig_ready.connect(self._on_ready)
        self.client.sig_loaded.connect(self._on_loaded)
        self.client.sig_done.connect(self._on_done)
        self.client.sig_error.connect(self._on_error)
        self.client.sig_died.connect(lambda reason: self._fail(reason))
        self._pair: tuple[str, str] = ("", "")
        self._mtp = "off"

    def start(self, target: str, sidecar: str) -> None:
        self.client.stop(wait_ms=500)
        self._pair = (target, sidecar)
        self.client.start()

    def stop(self) -> None:
        self.client.stop(wait_ms=500)

    def _on_ready(self, _ev: ReadyEvent) -> None:
        target, sidecar = self._pair
        self.client.load(P.LoadOptions(path=target, n_ctx=256, sidecar=sidecar))

    def _on_loaded(self, ev: LoadedEvent) -> None:
        self._mtp = ev.model.mtp
        self.client.generate(prompt=PROOF_PROMPT, max_tokens=PROOF_TOKENS, speculative=mtp(2))

    def _on_done(self, ev: DoneEvent) -> None:
        self.client.stop(wait_ms=2000)
        s = ev.stats
        if ev.finish_reason == "error" or s is None:
            return  # the error event said why
        self.sig_proved.emit(f"loaded with MTP ({self._mtp}); {s.rounds} rounds, "
                             f"{s.accepted}/{s.drafted} drafts accepted")

    def _on_error(self, ev: ErrorEvent) -> None:
        if ev.kind != "speculative_unavailable":
            self._fail(ev.message)

    def _fail(self, reason: str) -> None:
        self.client.stop(wait_ms=500)
        self.sig_failed.emit(f"the engine could not use the pair: {reason}")
