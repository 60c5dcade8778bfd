"""``mtp-studio serve``: the OpenAI-compatible server, headless (docs/server.md).
Its benchmark, ``mtp-studio serve-bench``, is engine/bench/serve.py."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from engine.hardware import default_threads
from engine.load_options import LoadOptions
from engine.server import config as C


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (docs/server.md)")
    add_model_args(p)
    p.add_argument("--host", default=C.DEFAULT_HOST, help="address to bind (default 127.0.0.1; others need a key)")
    p.add_argument("--port", type=int, default=C.DEFAULT_PORT, help=f"port (default {C.DEFAULT_PORT}; 0: any)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (MTP_STUDIO_API_KEY does the same, "
                   "unseen by other users' ps; default: none on loopback, the key stored by the app's panel on "
                   "other addresses)")
    p.add_argument("--alias", help="the model name clients use (default: the file's name without .gguf)")
    p.add_argument("--chat-template", metavar="generic|FILE",
                   help="render chat requests with this template instead of the model's: 'generic' (ChatML, "
                        "with Hermes-style tools; for a model without a template) or a Jinja file")
    p.add_argument("--allow-local-images", action="store_true",
                   help="let an image_url part name a file on this machine (a path or file://); data URLs are "
                        "always taken, remote URLs never fetched")
    p.add_argument("--strict-model", action="store_true",
                   help="refuse requests naming another model (default: any name is served by the loaded model)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser calls from this origin (repeatable; default: CORS off)")
    p.add_argument("--queue", type=int, default=C.DEFAULT_QUEUE, help="requests that may wait; more get 503")
    p.add_argument("--queue-timeout", type=float, default=C.DEFAULT_QUEUE_TIMEOUT_S,
                   help="seconds a request may wait for its turn")
    p.add_argument("--timeout", type=float, default=C.DEFAULT_REQUEST_TIMEOUT_S,
                   help="seconds one generation may run before it is cancelled (504)")
    p.add_argument("--max-body", type=int, default=C.DEFAULT_BODY_LIMIT, help="largest request body in bytes")
    p.add_argument("--parallel", type=int, default=None,
                   help="requests decoded together (the model is loaded with this many sequences, each of "
                   "--ctx tokens; docs/parallel.md); default 4 where their KV cache fits in memory (a GPU's own "
                   "where layers are offloaded), else 2, else 1; 1: one at a time, the rest queue")
    p.add_argument("--cache-ram", type=int, default=LoadOptions.state_cache_mib, metavar="MIB",
                   help="host memory for earlier prompts' states (a client going back to a conversation the "
                   "sequences let go of skips its prefill; docs/mtp.md); 0: none kept")
    p.set_defaults(func=cmd_serve)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF file (default: the embedded Gemma 3 270M)")
    p.add_argument("--sidecar", help="MTP-only GGUF to draft with, next to the target")
    p.add_argument("--mmproj", help="the model's vision projector (mmproj-*.gguf): requests may then send images")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    p.add_argument("--threads", type=int, default=default_threads(), help="CPU threads")
    p.add_argument("--gpu-layers", type=int, default=0)
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="the MTP head drafts only among token ids below N (its LM head is most of a draft step "
                        "at a real vocabulary; output is unchanged); 0: the whole vocabulary; default: the "
                        "model's autotune profile where it measured one, else 0")
    p.add_argument("--speculative", choices=("auto", "off", "mtp", "ngram", "mtp+ngram"), default="auto",
                   help="speculation for requests that do not choose: auto = the model's autotune profile, "
                   "else off (default); mtp, ngram or mtp+ngram with --n-max/--p-min")
    p.add_argument("--adaptive", action="store_true", help="choose each round's draft length (at most --n-max)")
    p.add_argument("--n-max", type=int, default=3, help="most draft tokens per round (with --speculative mtp)")
    p.add_argument("--p-min", type=float, default=0.0, help="stop drafting below this probability")
    p.add_argument("--draft-sampling", choices=("match", "probabilistic"), default="match",
                   help="for sampled requests: probabilistic keeps sampled drafts by rejection sampling (more "
                        "accepted at high temperature, not the same seeded reply); with --speculative mtp")
    p.add_argument("--swa-full", action="store_true",
                   help="a sliding-window model (Gemma 3, Step 3.5) keeps every cell of its windowed layers, as "
                        "llama-server's --swa-full: going back in a conversation needs no copy of the window, and "
                        "requests at once share a common prompt's cells, but those layers' cache grows with --ctx "
                        "(docs/mtp.md)")
    p.add_argument("--no-kv-unified", dest="kv_unified", action="store_false",
                   help="with --parallel above 1, a pool of cells per sequence, as llama-server's --parallel N: "
                        "each reply attends over its own context only (faster with long contexts and many "
                        "requests at once), and a request takes a copy of a common prompt's cells rather than "
                        "sharing them (docs/parallel.md)")
    p.add_argument("--verbose", action="store_true", help="show the engine's log")


def start_link(args: argparse.Namespace) -> tuple[object, str]:
    """A worker with the model loaded, and a line saying which speculation requests get by default (and,
    where the MTP head drafts among part of the vocabulary, a second line saying so)."""
    from engine.autotune.profiles import ProfileMatch
    from engine.server.engine_link import WorkerLink, find_profile, load_request_for, profile_speculative
    from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
    from engine.store.parallel_fit import AUTO

    # commands without --parallel load one sequence; serve without it as many as fit (the worker chooses:
    # it alone can ask llama.cpp how much GPU memory is free; engine/store/parallel_fit.py)
    parallel = getattr(args, "parallel", 1)
    parallel = AUTO if parallel is None else parallel
    draft_vocab = getattr(args, "draft_vocab", 0)
    match = ProfileMatch(None, False)
    if args.speculative == "auto" or draft_vocab is None:
        path = profile_path(args)
        match = find_profile(path) if path else match
    if draft_vocab is None:  # the profile's choice where autotune measured one (engine/autotune/draft_vocab.py)
        draft_vocab = (match.profile.draft_vocab or 0) if match.profile else 0
    cache_mib = getattr(args, "cache_ram", LoadOptions.state_cache_mib)  # bench-serve has none: serve's default
    load = load_request_for(args.model, sidecar=args.sidecar, n_ctx=args.ctx, n_threads=args.threads,
                            n_gpu_layers=args.gpu_layers, mmproj=getattr(args, "mmproj", None), parallel=parallel,
                            draft_vocab=draft_vocab, state_cache_mib=cache_mib,
                            swa_full=getattr(args, "swa_full", False), kv_unified=getattr(args, "kv_unified", True))
    link = WorkerLink(load, verbose=args.verbose)
    model = link.model()
    assert model is not None
    parallel = model.n_seq  # what loaded (Auto's choice, or one where Auto's did not fit)
    if args.speculative in ("mtp", "ngram", "mtp+ngram"):
        setting = SpeculativeSettings(args.speculative, args.n_max, 0, args.p_min,
                                      depth="adaptive" if args.adaptive else "fixed",
                                      draft_sampling=getattr(args, "draft_sampling", "match"))
        link.set_default_speculative(setting.limited_to(model.max_draft if model.can_draft else 0))
        line = f"speculation by default: {link.default_speculative().label}"
    elif args.speculative == "off":
        link.set_default_speculative(SPECULATION_OFF)
        line = "speculation by default: off"
    else:
        profile, line = profile_speculative(model, match, parallel)
        if profile is None:
            link.set_default_speculative(SPECULATION_OFF)
        else:  # each request gets the choice for the generations running as it starts
            link.set_default_speculative(profile.setting_for(parallel),
                                         by_concurrency=lambda n: profile.setting_for(min(n, parallel)))
    if not model.can_draft and not link.default_speculative().enabled:
        line = f"speculation off: {model.mtp_unavailable_reason or 'this model has no MTP head'}"
    if model.can_draft and 0 < model.draft_vocab < model.n_vocab:  # what the worker loaded, not what was asked
        chosen = "--draft-vocab" if getattr(args, "draft_vocab", 0) else "autotune profile"
        line += (f"\nthe MTP head drafts among the first {model.draft_vocab:,} of {model.n_vocab:,} tokens "
                 f"({chosen}; --draft-vocab 0: all of them)")
    return link, line


def profile_path(args: argparse.Namespace) -> str | None:
    """The model file whose autotune profile applies: ``--model``, else the embedded default (None where it
    cannot be assembled: the worker's load then says why)."""
    from engine.default_model import default_model_path
    from engine.errors import ModelFileError

    try:
        return args.model or str(default_model_path())
    except ModelFileError:
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.server import api_key
    from engine.server.runner import bind, serve_forever

    # MTP_STUDIO_API_KEY keeps the key out of the process list, where --api-key shows
    key = args.api_key or os.environ.get("MTP_STUDIO_API_KEY") or (
        None if C.is_loopback(args.host) else api_key.get_key())
    config = C.ServerConfig(host=args.host, port=args.port, api_key=key, model_id=args.alias,
                            cors_origins=tuple(args.cors_origin), max_queue=args.queue, parallel=args.parallel or 1,
                            queue_timeout_s=args.queue_timeout, request_timeout_s=args.timeout,
                            max_body_bytes=args.max_body, strict_model=args.strict_model,
                            local_images=args.allow_local_images)
    if args.chat_template:
        from engine.generation import chat_template

        if args.chat_template == "generic":
            config = replace(config, chat_template=chat_template.GENERIC_TEMPLATE)
        else:
            try:
                config = replace(config, chat_template=Path(args.chat_template).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                print(f"error: cannot read the chat template {args.chat_template}: {exc}", file=sys.stderr)
                return 2
    try:
        C.check(config)
    except C.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # before the model loads: a taken port should not cost a load
        sock = bind(config.host, config.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}. "
              "Choose another --port or stop the program using it.", file=sys.stderr)
        return 2
    link, line = start_link(args)
    model = link.model()  # type: ignore[attr-defined]
    config = replace(config, parallel=model.n_seq)  # --parallel, or what the worker found fits
    print(f"model: {model.path} ({model.architecture}, MTP {model.mtp})", file=sys.stderr)
    print(line, file=sys.stderr)
    if model.parallel_reason:
        print(model.parallel_reason, file=sys.stderr)
    url = replace(config, port=sock.getsockname()[1]).base_url
    print(f"serving {url}  (API key {'required' if key else 'not required'}); Ctrl+C stops",
          file=sys.stderr, flush=True)
    try:
        serve_forever(link, config, sock)  # type: ignore[arg-type]
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then passed Ctrl+C on: a normal stop
        pass
    finally:
        link.close()  # type: ignore[attr-defined]
    return 0
