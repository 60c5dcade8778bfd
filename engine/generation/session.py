"""A loaded model ready to generate: target model and context, and the MTP
drafter when speculation is available. Everything is checked from GGUF
metadata before llama.cpp sees a file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.generation import state_cache
from engine.generation.load_plan import LoadPlan
from engine.generation.prefix_cache import PrefixCache
from engine.generation.state_cache import StateCache
from engine.load_options import LoadOptions, check_options  # LoadOptions: benches and tests import it from here
from engine.runtime import Context, ContextParams, Model
from engine.runtime.mtmd import Projector
from engine.speculative import rollback
from engine.speculative.choice import DrafterChoice
from engine.speculative.depth import DepthPolicy
from engine.speculative.drafter import Drafter
from engine.speculative.mtp import MTPDrafter
from engine.speculative.ngram import NgramDrafter
from engine.speculative.settings import MAX_DRAFT, SpeculativeSettings, deepest_draft

# Architectures whose attention depends on where cells sit in the KV pool, not only on what they hold
# (deepseek4's compressed KV: its drafts changed with other sequences beside it in a shared pool, and
# with an MTP row kept instead of decoded again; tests/engine/test_parallel.py, test_catch_up_rows.py).
# A multi-sequence session gives each sequence a pool of its own (one graph per sequence in a mixed
# batch), and the MTP drafter decodes id_last's row again as llama.cpp's driver does.
CELL_ORDER_SENSITIVE = frozenset({"deepseek4"})

if TYPE_CHECKING:
    from engine.generation.placement import Placement


class Session:
    """Owns the native objects of one loaded model; :meth:`close` frees them in order."""

    def __init__(self, options: LoadOptions, plan: LoadPlan | None = None) -> None:
        """``plan``: the one the worker made from these options before letting go of the
        previous model (the headers are read once per load); None: read it here."""
        plan = plan if plan is not None else LoadPlan.read(options)  # SidecarMismatch propagates
        options = plan.options  # the path resolved
        self.options = options
        self.facts = plan.facts
        self.sidecar_facts = plan.sidecar_facts
        self.mtp_status = "off"
        self.mtp_unavailable_reason = plan.mtp_unavailable_reason
        self.parallel_reason = plan.parallel_reason  # why this many sequences, where the load chose them
        want_mtp, mtp_in_target = plan.want_mtp, plan.mtp_in_target

        self.placement: Placement | None = None
        model_kwargs: dict[str, Any] = {"n_gpu_layers": options.n_gpu_layers}
        if options.rpc:
            from engine.generation.placement import plan as place

            self.placement = place(options.rpc, block_count=self.facts.block_count,
                                   mtp_blocks=self.facts.nextn_layers if mtp_in_target else 0,
                                   tensor_split=options.tensor_split, main_device=options.main_device)
            model_kwargs = self.placement.model_kwargs()
        self.model = Model(plan.path, load_mtp=mtp_in_target, **model_kwargs)
        self.mtp_model: Model | None = None
        self._own_mtp_model = False
        self.mtp_drafter: MTPDrafter | None = None
        self.rollback_strategy = "kv"
        self._hybrid = self.model.is_hybrid or self.model.is_recurrent
        try:
            self.target = Context(self.model, self._target_params(want_mtp))
        except Exception:  # the model goes now, not when the garbage collector finds it (a retry loads it again)
            self.model.close()
            raise
        # what the target context holds between generations, for the next prompt to reuse
        self.prefix = PrefixCache()
        # earlier prompts' states in host memory, for going back to a conversation the contexts let go of
        self.states = StateCache(state_cache.budget(self.options.state_cache_mib, mapped=plan.host_read_bytes()),
                                 self.model.n_swa, self.model.is_hybrid or self.model.is_recurrent)
        self.prepared_for_mtp = want_mtp
        self.prepared_for_drafts = want_mtp
        # None until a context asked for recurrent snapshots (llama.cpp clamps
        # n_rs_seq to 0 for architectures without rollback support)
        self._snapshots_supported: bool | None = self.target.n_rs_seq > 0 if (want_mtp and self._hybrid) else None
        # the drafters and adaptive depth policies a request chooses from, kept between replies: the
        # n-gram map lives as long as this model, adaptive depth's measurements carry over (choice.py)
        self.drafters = DrafterChoice()
        self._mtp_lanes: dict[int, MTPDrafter] = {}  # per sequence of a multi-sequence session (mtp_lane)
        # the vision projector, when the load names one: the model then takes images (engine/generation/images.py)
        self.projector: Projector | None = None
        try:
            if want_mtp:
                self._init_mtp(mtp_in_target)
            if options.mmproj:
                self.projector = Projector(options.mmproj, self.model, n_threads=options.n_threads,
                                           use_gpu=options.n_gpu_layers != 0)
        except Exception:
            self.close()
            raise

    def _target_params(self, drafts: bool) -> ContextParams:
        """Target context settings: drafting adds per-token recurrent snapshots
        (``n_rs_seq``, hybrid targets only) that plain decoding does not pay for."""
        n_rs_seq = MAX_DRAFT if (drafts and self._hybrid) else 0
        n_seq = self.options.parallel
        verify_rows = n_seq * (MAX_DRAFT + 1)  # the most one step's verify decode carries
        return ContextParams(
            n_ctx=self.options.n_ctx * n_seq, n_batch=max(self.options.n_batch, verify_rows),
            # every sequence's verify rows fit one ubatch whatever the prompt chunk: the multi-sequence engine
            # keeps a decode within one (engine/generation/parallel.py, decode_rows), and with a ubatch smaller
            # than the running sequences' verify rows a newcomer's prompt would get no row at all
            n_ubatch=max(verify_rows, min(self.options.n_batch, max(512, 1 + n_rs_seq))),
            n_threads=self.options.n_threads, n_rs_seq=n_rs_seq, n_seq_max=n_seq, kv_unified=self.kv_unified,
            # Only a verify batch needs logits on several rows (one per sequence's round); sizing the
            # output buffer for it (not n_batch rows) saves ~0.5 GB on a 262k vocabulary.
            n_outputs_max=n_seq * (MAX_DRAFT + 1),
            swa_full=self.options.swa_full or self._hybrid,  # a hybrid's checkpoints are for its recurrent state
        )

    def prepare(self, mtp: bool, drafts: bool | None = None) -> None:
        """Make the target context exactly what this generation needs.

        ``drafts``: rejected draft rows will be rolled back (any drafter, MTP
        or n-gram; default: ``mtp``). "Off" must be plain decoding, not
        speculation with no drafts: speed ratios against it would be biased.
        Without MTP the target stops exporting hidden states; a hybrid target
        gets recurrent snapshots while drafting and is recreated without them
        when not (a recreated context starts empty: the prefix cache holds
        nothing for it).
        """
        mtp = mtp and self.mtp_drafter is not None
        drafts = mtp if drafts is None else drafts
        if (mtp, drafts) == (self.prepared_for_mtp, self.prepared_for_drafts):
            return
        snapshots = drafts and self._hybrid
        if self._hybrid and snapshots != (self.target.n_rs_seq > 0) and self._snapshots_supported is not False:
            self.target.close()
            self.target = Context(self.model, self._target_params(snapshots))
            if snapshots:
                self._snapshots_supported = self.target.n_rs_seq > 0
            if self.mtp_drafter is not None:
                self.mtp_drafter.target = self.target
        if self.mtp_drafter is not None:
            self.target.set_embeddings_nextn(mtp, False)
        if drafts:
            self.rollback_strategy = rollback.choose(self.target, self._hybrid, MAX_DRAFT)
        self.prepared_for_mtp, self.prepared_for_drafts = mtp, drafts

    @property
    def ngram_drafter(self) -> NgramDrafter | None:
        """The n-gram drafter, once a request drafted n-grams (benchmarks make it forget)."""
        return self.drafters.ngram

    def set_threads(self, n_threads: int, n_threads_draft: int = 0) -> None:
        """Decode with other thread counts from now on, without reloading (autotune times
        them); a target context recreated later (hybrid models) keeps them."""
        self.options = replace(self.options, n_threads=n_threads, n_threads_draft=n_threads_draft)
        check_options(self.options)
        self.target.set_threads(n_threads)
        if self.mtp_drafter is not None:
            self.mtp_drafter.ctx.set_threads(n_threads_draft or n_threads)

    def set_draft_vocab(self, n: int) -> None:
        """Draft among token ids below ``n`` from now on (0: the whole vocabulary), without reloading
        (autotune times both); a head-less session only remembers it."""
        self.options = replace(self.options, draft_vocab=n)
        check_options(self.options)
        if self.mtp_drafter is not None:
            self.mtp_drafter.ctx.set_draft_vocab(n)

    def speculation(self, settings: SpeculativeSettings) -> tuple[SpeculativeSettings, Drafter, DepthPolicy]:
        """What a generation asking for ``settings`` runs with: the settings this model allows
        (the one place the model's limits apply), the drafter (plain decoding's drafts nothing)
        and the depth policy, as :class:`DrafterChoice` chooses them for every sequence of every
        session. The target context is prepared for them."""
        spec, drafter, policy = self.drafters.choose(settings, self.mtp_drafter, self.target.threads, alone=True)
        self.prepare(mtp=spec.uses_mtp, drafts=spec.enabled)
        return spec, drafter, policy

    def _init_mtp(self, mtp_in_target: bool) -> None:
        if mtp_in_target:
            self.mtp_model = self.model
        else:
            assert self.options.sidecar is not None
            where = self.placement.local_kwargs() if self.placement else {"n_gpu_layers": self.options.n_gpu_layers}
            self.mtp_model = Model(self.options.sidecar, load_mtp=True, **where)
            self._own_mtp_model = True
        self.target.set_embeddings_nextn(True, False)
        self.mtp_drafter = MTPDrafter(self.target, self.mtp_model, fold=self.options.fold,
                                      n_threads=self.options.n_threads_draft or self.options.n_threads,
                                      n_seq=self.options.parallel, kv_unified=self.kv_unified)
        if self.facts.architecture in CELL_ORDER_SENSITIVE:
            self.mtp_drafter.skip_drafted_row = False
        if self.options.draft_vocab:
            self.mtp_drafter.ctx.set_draft_vocab(self.options.draft_vocab)
        self.rollback_strategy = rollback.choose(self.target, self._hybrid, MAX_DRAFT)
        self.mtp_status = "chained" if self.mtp_drafter.chained else "single"

    @property
    def kv_unified(self) -> bool:
        """Several sequences share one pool of cells, so a batch of all their rows is one graph, unless the load
        asks a pool per sequence (``LoadOptions.kv_unified``; :data:`CELL_ORDER_SENSITIVE` always keep one)."""
        return self.options.parallel > 1 and self.options.kv_unified and \
            self.facts.architecture not in CELL_ORDER_SENSITIVE

    @property
    def n_seq(self) -> int:
        """Sequences the contexts hold (``LoadOptions.parallel``): replies decoded together."""
        return self.options.parallel

    @property
    def mtp_context(self) -> Context | None:
        """The MTP context (whose rows the single-sequence prefix cache follows), or None without a head."""
        return self.mtp_drafter.ctx if self.mtp_drafter is not None else None

    def save_conversation(self) -> None:
        """Before a prompt that reuses none of what the contexts hold (one with images), copy what they hold
        to host memory, so that its conversation is taken up again without its prefill (state_cache.py)."""
        state_cache.save_held(self.states, self.prefix, self.target, self.mtp_context, [])

    def mtp_lane(self, seq: int) -> MTPDrafter | None:
        """The MTP drafter of sequence ``seq`` (sequence 0's is :attr:`mtp_drafter`); None without a head."""
        if self.mtp_drafter is None or seq == 0:
            return self.mtp_drafter
        lane = self._mtp_lanes.get(seq)
        if lane is None:
            lane = self._mtp_lanes[seq] = self.mtp_drafter.lane(seq)
        lane.target = self.target  # a hybrid's target context is recreated when drafting starts or stops
        return lane

    @property
    def is_hybrid(self) -> bool:
        """The target keeps recurrent state (hybrid or recurrent): it rolls back only where state was kept."""
        return self._hybrid

    @property
    def window_checkpoints(self) -> bool:
        """A sliding-window target (not a hybrid) that keeps every cell (``swa_full``): where each prompt ended
        is marked, and a state saved to host memory gets its window's cells there too, so that it can go back
        there (state_cache.window_checkpoint)."""
        return bool(self.model.n_swa) and not self._hybrid and self.options.swa_full

    @property
    def window_cache(self) -> bool:
        """A sliding-window target (not a hybrid) whose windowed layers keep only their window (not
        ``swa_full``): a copy of the window's cells is taken at each prompt's end, to go back to where the
        cells before the window are gone (a long reply regenerated, an edited message; checkpoints.py)."""
        return bool(self.model.n_swa) and not self._hybrid and not self.options.swa_full

    @property
    def n_heads(self) -> int:
        return self.mtp_drafter.n_heads if self.mtp_drafter else 0

    @property
    def max_draft(self) -> int:
        """The deepest draft this model can be asked for (0: it cannot draft)."""
        return deepest_draft(self.mtp_drafter.n_heads, self.mtp_drafter.chained) if self.mtp_drafter else 0

    def describe(self) -> dict[str, Any]:
        facts = self.model.facts()
        facts.update(
            {
                "n_ctx": self.target.n_ctx,
                "n_threads": self.options.n_threads,
                "n_threads_draft": self.options.n_threads_draft or self.options.n_threads,
                "draft_vocab": self.mtp_drafter.ctx.draft_vocab if self.mtp_drafter else 0,
                "n_seq": self.n_seq,
                "parallel_reason": self.parallel_reason,
                "kv_unified": self.kv_unified,
                "has_chat_template": self.facts.has_chat_template,
                "mtp": self.mtp_status,
                "mtp_heads": self.n_heads,
                "max_draft": self.max_draft,
                "mtp_unavailable_reason": self.mtp_unavailable_reason,
                "rollback": self.rollback_strategy if self.mtp_drafter else "none",
                "n_rs_seq": self.target.n_rs_seq,
                "sidecar": str(Path(self.options.sidecar)) if self.options.sidecar else None,
                "placement": self.placement.lines if self.placement else [],
                "mmproj": str(self.projector.path) if self.projector is not None else None,
                "vision": self.projector is not None and self.projector.vision,
            }
        )
        return facts

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "projector", None) is not None:  # before the model it was loaded against
            self.projector.close()
            self.projector = None
        self.drafters.close()
        if self.mtp_drafter is not None:
            self.mtp_drafter.close()
            self.mtp_drafter = None
        if getattr(self, "target", None) is not None:
            self.target.close()
        if self._own_mtp_model and self.mtp_model is not None:
            self.mtp_model.close()
        self.mtp_model = None
        self.model.close()
