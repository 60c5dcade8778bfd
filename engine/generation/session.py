"""A loaded model ready to generate: target model and context, and the MTP
drafter when speculation is available. Everything is checked from GGUF
metadata before llama.cpp sees a file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import gguf_info, sidecar
from engine.errors import ContextError, SpeculativeUnavailable
from engine.runtime import Context, ContextParams, Model
from engine.speculative import rollback
from engine.speculative.mtp import MTPDrafter
from engine.speculative.settings import MAX_DRAFT, deepest_draft


@dataclass(frozen=True)
class LoadOptions:
    path: str
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_threads: int = 1
    n_batch: int = 512
    mtp: bool = True  # prepare MTP if the model (or sidecar) has it
    sidecar: str | None = None
    fold: bool = True  # fold the MTP catch-up into the next draft (see engine/speculative/mtp.py)


MAX_THREADS = 512  # GGML_MAX_N_THREADS, ggml's own ceiling (its per-thread arrays are that long)
MAX_N_CTX = 2**24  # 16M tokens; llama.cpp's n_ctx is 32-bit and far smaller sizes already exhaust memory


def check_options(options: LoadOptions) -> None:
    """Refuse thread counts and context sizes llama.cpp would crash or fail on.

    Called before the loaded model is let go of: a request llama.cpp refuses
    late must not leave the user with nothing loaded.

    Raises:
        ContextError: naming the setting, the range it takes and what was asked.
    """
    if not 1 <= options.n_threads <= MAX_THREADS:
        raise ContextError(
            f"n_threads must be between 1 and {MAX_THREADS}, got {options.n_threads}; this machine has "
            f"{os.cpu_count() or 1} CPU threads, and more threads than that rarely helps."
        )
    if not 0 <= options.n_ctx <= MAX_N_CTX:
        raise ContextError(
            f"n_ctx must be between 0 (the model's training context) and {MAX_N_CTX:,} tokens, got "
            f"{options.n_ctx}; choose a context size your memory holds (4096 is a safe start)."
        )


class Session:
    """Owns the native objects of one loaded model; :meth:`close` frees them in order."""

    def __init__(self, options: LoadOptions) -> None:
        check_options(options)
        self.options = options
        self.facts = gguf_info.read_facts(options.path)
        self.sidecar_facts = gguf_info.read_facts(options.sidecar) if options.sidecar else None
        self.mtp_status = "off"
        self.mtp_unavailable_reason: str | None = None
        want_mtp = options.mtp or options.sidecar is not None
        mtp_in_target = False
        if want_mtp:
            try:
                if self.sidecar_facts is not None:
                    sidecar.check_sidecar(self.facts, self.sidecar_facts)
                else:
                    sidecar.check_target_has_mtp(self.facts)
                    mtp_in_target = True
            except SpeculativeUnavailable as exc:
                self.mtp_unavailable_reason = str(exc)
                want_mtp = False
        # SidecarMismatch propagates: the user asked for that sidecar explicitly.

        self.model = Model(options.path, n_gpu_layers=options.n_gpu_layers, load_mtp=mtp_in_target)
        self.mtp_model: Model | None = None
        self._own_mtp_model = False
        self.drafter: MTPDrafter | None = None
        self.rollback_strategy = "kv"
        self._hybrid = self.model.is_hybrid or self.model.is_recurrent
        self.target = Context(self.model, self._target_params(want_mtp))
        self.prepared_for_mtp = want_mtp
        self._mtp_n_rs_seq = self.target.n_rs_seq if want_mtp else 0
        if want_mtp:
            try:
                self._init_mtp(mtp_in_target)
            except Exception:
                self.close()
                raise

    def _target_params(self, mtp: bool) -> ContextParams:
        """Target context settings: MTP adds per-token recurrent snapshots
        (``n_rs_seq``, hybrid targets only) that plain decoding does not pay for."""
        n_rs_seq = MAX_DRAFT if (mtp and self._hybrid) else 0
        return ContextParams(
            n_ctx=self.options.n_ctx, n_batch=self.options.n_batch,
            n_ubatch=min(self.options.n_batch, max(512, 1 + n_rs_seq)),
            n_threads=self.options.n_threads, n_rs_seq=n_rs_seq,
            # Only a verify batch needs logits on several rows; sizing the
            # output buffer for it (not n_batch rows) saves ~0.5 GB on a
            # 262k vocabulary.
            n_outputs_max=MAX_DRAFT + 1,
        )

    def prepare(self, mtp: bool) -> None:
        """Make the target context exactly what this generation needs.

        "Off" must be plain decoding, not MTP with no drafts: speed ratios
        against it would be biased. With MTP off the target stops exporting
        hidden states, and a hybrid target whose context keeps recurrent
        snapshots is recreated without them (each generation starts from an
        empty context anyway, so nothing is lost but the allocation).
        """
        mtp = mtp and self.drafter is not None
        if mtp == self.prepared_for_mtp:
            return
        # only where the MTP context really got snapshots (llama.cpp clamps
        # n_rs_seq to 0 for architectures without rollback support)
        if self._mtp_n_rs_seq and self.drafter is not None:
            self.target.close()
            self.target = Context(self.model, self._target_params(mtp))
            self.drafter.target = self.target
        if self.drafter is not None:
            self.target.set_embeddings_nextn(mtp, False)
        self.prepared_for_mtp = mtp

    def _init_mtp(self, mtp_in_target: bool) -> None:
        if mtp_in_target:
            self.mtp_model = self.model
        else:
            assert self.options.sidecar is not None
            self.mtp_model = Model(self.options.sidecar, n_gpu_layers=self.options.n_gpu_layers, load_mtp=True)
            self._own_mtp_model = True
        self.target.set_embeddings_nextn(True, False)
        self.drafter = MTPDrafter(self.target, self.mtp_model, fold=self.options.fold)
        self.rollback_strategy = rollback.choose(self.target, self._hybrid, MAX_DRAFT)
        self.mtp_status = "chained" if self.drafter.chained else "single"

    @property
    def n_heads(self) -> int:
        return self.drafter.n_heads if self.drafter else 0

    @property
    def max_draft(self) -> int:
        """The deepest draft this model can be asked for (0: it cannot draft)."""
        return deepest_draft(self.drafter.n_heads, self.drafter.chained) if self.drafter else 0

    def describe(self) -> dict[str, Any]:
        facts = self.model.facts()
        facts.update(
            {
                "n_ctx": self.target.n_ctx,
                "n_threads": self.options.n_threads,
                "has_chat_template": self.facts.has_chat_template,
                "mtp": self.mtp_status,
                "mtp_heads": self.n_heads,
                "max_draft": self.max_draft,
                "mtp_unavailable_reason": self.mtp_unavailable_reason,
                "rollback": self.rollback_strategy if self.drafter else "none",
                "n_rs_seq": self.target.n_rs_seq,
                "sidecar": str(Path(self.options.sidecar)) if self.options.sidecar else None,
            }
        )
        return facts

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        if getattr(self, "target", None) is not None:
            self.target.close()
        if self._own_mtp_model and self.mtp_model is not None:
            self.mtp_model.close()
        self.mtp_model = None
        self.model.close()
