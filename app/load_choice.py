"""One way to load a model (:class:`LoadChoice`): what a ``load`` request carries, remembered in
the settings. No Qt: the load sheet, the model controller and the tests build it."""

from __future__ import annotations

from dataclasses import dataclass

from app.settings import Settings
from engine.worker import protocol as P


@dataclass(frozen=True)
class LoadChoice:
    """One way to load a model: what a ``load`` request carries."""

    path: str | None  # None: the built-in model
    sidecar: str | None
    n_ctx: int
    n_threads: int
    n_gpu_layers: int
    mtp: bool
    mmproj: str | None = None  # the vision projector (None: the model takes no images)

    @classmethod
    def from_settings(cls, s: Settings) -> LoadChoice:
        return cls(s.model_path, s.sidecar_path, s.n_ctx, s.n_threads, s.n_gpu_layers, s.speculative != "off",
                   s.mmproj_path)

    def options(self, s: Settings) -> P.LoadOptions:
        """The load request's options: this choice, with the settings' draft threads, this model's draft
        vocabulary, sequences (replies at once), memory for earlier conversations and RPC servers."""
        return P.LoadOptions(path=self.path, n_ctx=self.n_ctx, n_threads=self.n_threads,
                             n_gpu_layers=self.n_gpu_layers, mtp=self.mtp, sidecar=self.sidecar, mmproj=self.mmproj,
                             n_threads_draft=s.n_threads_draft, parallel=s.parallel,
                             draft_vocab=s.draft_vocab_for(self.path), state_cache_mib=s.state_cache_mib,
                             swa_full=s.swa_full, kv_unified=s.kv_unified,
                             rpc=tuple(r.strip() for r in s.rpc_servers.split(",") if r.strip()))

    def apply_to(self, s: Settings) -> None:
        """Remember this choice. MTP off means replies decode plainly; turning it back on
        returns to "auto" (the autotune profile), not to a fixed depth."""
        s.model_path, s.sidecar_path, s.mmproj_path = self.path, self.sidecar, self.mmproj
        s.n_ctx, s.n_threads, s.n_gpu_layers = self.n_ctx, self.n_threads, self.n_gpu_layers
        if not self.mtp:
            s.speculative = "off"
        elif s.speculative == "off":
            s.speculative = "auto"
