"""How to load a model: the one type the app, the CLI, the protocol's ``load``
request and the session pass, checked before the loaded model is let go of.

No llama.cpp here: the protocol module (which the app imports) carries it whole,
and the worker turns it into a load plan (``engine.generation.load_plan``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.errors import ContextError

MAX_THREADS = 512  # GGML_MAX_N_THREADS, ggml's own ceiling (its per-thread arrays are that long)
MAX_PARALLEL = 64  # sequences decoded together; each has its own KV cells and sampler
# a draft vocabulary smaller than this would leave out common words of any real tokenizer
MIN_DRAFT_VOCAB = 1024
MAX_STATE_CACHE_MIB = 2**20  # 1 TiB: a bound on typing mistakes, not on memory (only what is saved is used)
MAX_N_CTX = 2**24  # 16M tokens; llama.cpp's n_ctx is 32-bit and far smaller sizes already exhaust memory


@dataclass(frozen=True)
class LoadOptions:
    path: str | None = None  # None: the embedded default model (the load plan finds it)
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_threads: int = 1
    n_batch: int = 512
    # threads of the MTP draft context; 0: the same as n_threads. A one-row
    # draft decode has little to split, and fewer threads can be faster.
    n_threads_draft: int = 0
    mtp: bool = True  # prepare MTP if the model (or sidecar) has it
    sidecar: str | None = None
    fold: bool = True  # fold the MTP catch-up into the next draft (see engine/speculative/mtp.py)
    # ggml RPC servers (host:port) to split the trunk across; the MTP head stays
    # local (engine/generation/placement.py, docs/multi-machine.md)
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()  # one share per device: remote ones first, this machine last
    main_device: int | None = None  # the whole model on that device instead of a split
    # a vision projector (mmproj-*.gguf) loaded with the model: it then takes images (docs/vision.md)
    mmproj: str | None = None
    # sequences decoded together (engine/generation/parallel.py): each holds n_ctx tokens, and the
    # contexts are sized for all of them; 1: one reply at a time; 0: as many as fit in memory, up to 4
    # (engine/store/parallel_fit.py, resolved by the load plan)
    parallel: int = 1
    # the MTP head drafts only among token ids [0, draft_vocab) (0: the whole vocabulary): its LM head is
    # most of a draft step at a real vocabulary, and byte-pair vocabularies number frequent tokens first.
    # The target verifies over every token, so output is the same; only what can be drafted changes.
    draft_vocab: int = 0
    # host memory (MiB) for earlier prompts' states, so that a conversation the contexts let go of is
    # taken up again without its prefill (engine/generation/state_cache.py); 0: none kept
    state_cache_mib: int = 2048
    # a sliding-window model (Gemma 3, Step 3.5) keeps every cell of its windowed layers, as llama-server's
    # --swa-full: any earlier point of a conversation can be gone back to without a copy, but those layers'
    # cache grows with the context (5x the memory on a Gemma 3 27B). Off: each windowed layer keeps its window
    # and a copy of it is taken at every prompt's end to go back to (engine/generation/checkpoints.py).
    swa_full: bool = False
    # with parallel > 1, one pool of cells for every sequence (llama.cpp's kv_unified): a request takes another's
    # prompt cells without copying them, and a batch of everyone's rows is one graph; but attention then spans
    # every sequence's cells for each row. False: a pool per sequence, as llama-server's --parallel N: each row
    # attends over its own sequence's cells only (faster with long contexts at high concurrency:
    # docs/parallel.md, "Known limits"), a shared start is copied, and uneven batches split into several graphs.
    kv_unified: bool = True


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
    if not 0 <= options.n_threads_draft <= MAX_THREADS:
        raise ContextError(
            f"n_threads_draft must be between 0 (the same as n_threads) and {MAX_THREADS}, got "
            f"{options.n_threads_draft}; this machine has {os.cpu_count() or 1} CPU threads."
        )
    if options.rpc:
        from engine.rpc import parse_endpoints

        parse_endpoints(options.rpc)  # a malformed host:port is refused before anything is let go of
    if isinstance(options.draft_vocab, bool) or not (options.draft_vocab == 0
                                                     or MIN_DRAFT_VOCAB <= options.draft_vocab):
        raise ContextError(f"draft_vocab must be 0 (the whole vocabulary) or at least {MIN_DRAFT_VOCAB:,} "
                           f"tokens, got {options.draft_vocab}; 32768 suits vocabularies of 150k tokens and more.")
    if isinstance(options.state_cache_mib, bool) or not 0 <= options.state_cache_mib <= MAX_STATE_CACHE_MIB:
        raise ContextError(f"state_cache_mib (--cache-ram) must be between 0 (keep no earlier prompts' states) and "
                           f"{MAX_STATE_CACHE_MIB:,} MiB, got {options.state_cache_mib}")
    if isinstance(options.parallel, bool) or not 0 <= options.parallel <= MAX_PARALLEL:
        raise ContextError(f"parallel must be between 1 and {MAX_PARALLEL} sequences (0: as many as fit), got "
                           f"{options.parallel}")
    if not 0 <= options.n_ctx <= MAX_N_CTX:
        raise ContextError(
            f"n_ctx must be between 0 (the model's training context) and {MAX_N_CTX:,} tokens, got "
            f"{options.n_ctx}; choose a context size your memory holds (4096 is a safe start)."
        )
