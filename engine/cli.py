"""Headless command line: ``mtp-studio <command>``. Every engine capability
runs here without a screen; the GUI is one more client of the same engine."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import EngineError
from engine.hardware import default_threads

if TYPE_CHECKING:
    from engine.sampling import SamplingParams

Handler = Callable[[argparse.Namespace], int]


def _add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF file (default: the embedded Gemma 3 270M)")
    p.add_argument("--sidecar", help="MTP-only GGUF to draft with, next to the target")
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    p.add_argument("--threads", type=int, default=default_threads(),
                   help="CPU threads (default: every physical core but one, up to 8: with all of them, one "
                        "busy core stalls every decode)")
    p.add_argument("--threads-draft", type=int, default=0,
                   help="threads of the MTP draft context (default 0: the same as --threads)")
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="the MTP head drafts only among token ids below N (its LM head is most of a draft step "
                        "at a real vocabulary; output is unchanged); default 0: the whole vocabulary")
    p.add_argument("--gpu-layers", type=int, default=0)
    p.add_argument("--rpc", help="split the model across ggml RPC servers, host:port[,host:port…] "
                                 "(`mtp-studio rpc-server` there); the MTP head stays here")
    p.add_argument("--tensor-split", help="with --rpc: each device's share, comma-separated, remote devices "
                                          "first and this machine last (default: by free memory)")
    p.add_argument("--main-device", type=int, help="with --rpc: the whole model on this one device instead")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mtp", action="store_true", help="draft with the model's MTP head(s)")
    p.add_argument("--n-max", type=int, default=3, help="most draft tokens per round")
    p.add_argument("--n-min", type=int, default=0, help="discard drafts shorter than this")
    p.add_argument("--p-min", type=float, default=0.0, help="stop drafting below this probability")
    p.add_argument("--adaptive", action="store_true",
                   help="choose each round's draft length (at most --n-max) from measured acceptance and timings")
    p.add_argument("--ngram", action="store_true",
                   help="draft what followed the same tokens earlier in the context (any model, no MTP head "
                        "needed); with --mtp: both, by the policy in docs/mtp.md")
    p.add_argument("--draft-sampling", choices=("match", "probabilistic"), default="match",
                   help="with a temperature above 0: match (drafts are the head's top token, kept while they "
                        "equal the target's sample; the same reply as without drafting) or probabilistic "
                        "(sampled drafts kept by rejection sampling: the same distribution, more accepted at "
                        "high temperature, not the same seeded reply), as llama.cpp's --spec-draft-sampling")


def spec_mode(args: argparse.Namespace) -> str:
    """The speculative mode the flags ask for: off, mtp, ngram or mtp+ngram."""
    return {(False, False): "off", (True, False): "mtp", (False, True): "ngram", (True, True): "mtp+ngram"}[
        (bool(args.mtp), bool(getattr(args, "ngram", False)))]


# flag -> SamplingParams field; a flag left out keeps the preset's value
_SAMPLING_FLAGS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
}


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    from engine.sampling import PRESETS

    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="start from the app's preset (default: plain greedy, every penalty off)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default 0)")
    p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, help="keep tokens whose probabilities add up to p")
    p.add_argument("--min-p", type=float, help="drop tokens less likely than min-p x the top one")
    p.add_argument("--repeat-penalty", type=float, help="divide a seen token's logit by this (1: off)")
    p.add_argument("--repeat-last-n", type=int, help="how many recent tokens the penalties look at (-1: all)")
    p.add_argument("--presence-penalty", type=float, help="subtract from a seen token's logit once (0: off)")
    p.add_argument("--frequency-penalty", type=float, help="subtract this x times seen (0: off)")
    p.add_argument("--seed", type=int, help="random seed for sampling (default: a new one each run)")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    """The generate request's sampling: the preset (or plain greedy), then each flag given.

    Raises ValueError (naming the field) for a value out of range.
    """
    from dataclasses import replace

    from engine.sampling import PRESETS, SamplingParams

    base = PRESETS[args.preset] if args.preset else SamplingParams()
    given = {field: getattr(args, flag) for flag, field in _SAMPLING_FLAGS.items() if getattr(args, flag) is not None}
    return replace(base, **given)


def cmd_chat(args: argparse.Namespace) -> int:
    from engine.speculative import stats_text
    from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings
    from engine.worker import protocol as P
    from engine.worker.client import WorkerClient

    try:
        sampling = sampling_from_args(args)  # a bad value is said before minutes of loading, not after
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        images = [Path(path).read_bytes() for path in args.image or ()]
    except OSError as exc:
        print(f"error: cannot read the image {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    if images and not args.mmproj:
        print("error: --image needs the model's vision projector: --mmproj mmproj-….gguf", file=sys.stderr)
        return 2
    stderr = sys.stderr if args.verbose else None
    with WorkerClient(stderr=stderr) as client:
        loaded = client.call(
            P.LoadRequest(id=client.new_id(), options=P.LoadOptions(
                path=args.model, n_ctx=args.ctx, n_threads=args.threads, n_threads_draft=args.threads_draft,
                draft_vocab=args.draft_vocab,
                n_gpu_layers=args.gpu_layers, mtp=args.mtp, sidecar=args.sidecar, mmproj=args.mmproj,
                **rpc_load_fields(args)))
        )[-1]
        if isinstance(loaded, P.ErrorEvent):
            print(f"error: {loaded.message}", file=sys.stderr)
            return 2
        assert isinstance(loaded, P.LoadedEvent)
        for line in loaded.model.placement or ():  # with --rpc: which device holds which blocks
            print(f"placement: {line}", file=sys.stderr)
        if not loaded.model.has_chat_template:
            print("(this model has no chat template: it continues your text)", file=sys.stderr)
        # the images first, then the question, as llama.cpp's mtmd-cli asks
        text = "".join(f"{P.IMAGE_MARKER}\n" for _ in images) + args.prompt
        content = {"prompt": text} if args.raw else {"messages": [{"role": "user", "content": text}]}
        try:
            speculative = (SpeculativeSettings(spec_mode(args), args.n_max, args.n_min, args.p_min,
                                               depth="adaptive" if args.adaptive else "fixed",
                                               draft_sampling=args.draft_sampling)
                           if spec_mode(args) != "off" else SPECULATION_OFF)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        request = P.GenerateRequestMsg(
            id=client.new_id(), **content, max_tokens=args.max_tokens, sampling=sampling,
            stop=args.stop or [], speculative=speculative,
            images=[base64.b64encode(image).decode("ascii") for image in images],
        )
        client.send(request)
        final: P.DoneEvent | None = None
        for ev in client.events_until_done(request.id):
            if isinstance(ev, P.TokenEvent):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, P.ErrorEvent):
                print(f"\n[{ev.kind}] {ev.message}", file=sys.stderr)
            elif isinstance(ev, P.DoneEvent):
                final = ev
        print()
        if final is not None and final.stats is not None:
            print(stats_text.report(final.stats, final.finish_reason), file=sys.stderr)
            if args.json:
                print(json.dumps(final.stats.to_dict(), indent=2), file=sys.stderr)
        return 0 if final is not None and final.finish_reason != "error" else 1


def rpc_load_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The load options' multi-machine fields from ``--rpc``, ``--tensor-split``, ``--main-device``."""
    from engine.rpc.endpoints import parse_endpoints

    if not getattr(args, "rpc", None):
        return {}
    split = tuple(float(x) for x in args.tensor_split.split(",")) if args.tensor_split else ()
    return {"rpc": tuple(str(e) for e in parse_endpoints(args.rpc)), "tensor_split": split,
            "main_device": args.main_device}


def cmd_info(args: argparse.Namespace) -> int:
    from engine.gguf.facts import read_facts

    facts = read_facts(args.file)
    if args.json:
        data = {k: v for k, v in facts.__dict__.items() if k not in ("tensor_names", "chat_template")}
        data["path"] = str(facts.path)
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(facts.summary_lines()))
    return 0


def cmd_default_model(args: argparse.Namespace) -> int:
    from engine import default_model

    path = default_model.default_model_path()
    print(path)
    if args.verify:
        ok = default_model.verify(path)
        print("sha256 ok" if ok else "sha256 MISMATCH")
        return 0 if ok else 1
    return 0


def _register_extras(sub: argparse._SubParsersAction) -> None:
    """Commands that live in their own modules register themselves here."""
    from engine.synth import cli as synth_cli

    synth_cli.register(sub)
    from engine.bench import cli as bench_cli

    bench_cli.register(sub)
    from engine.bench import policies_cli

    policies_cli.register(sub)
    from engine.bench import conversation

    conversation.register(sub)
    from engine.hardware import cli as hardware_cli

    hardware_cli.register(sub)
    from engine.autotune import cli as autotune_cli

    autotune_cli.register(sub)
    from engine.store import cli as store_cli

    store_cli.register(sub)
    from engine.server import cli as server_cli

    server_cli.register(sub)
    from engine.bench import serve as serve_bench

    serve_bench.register(sub)
    from engine.bench import concurrency as concurrency_bench

    concurrency_bench.register(sub)
    from engine.rpc import cli as rpc_cli

    rpc_cli.register(sub)
    from engine.bench import rpc as rpc_bench

    rpc_bench.register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtp-studio",
        description="MTP Studio: local LLMs, faster with multi-token prediction. "
        "Without a command it opens the desktop app.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser("chat", help="stream a reply in the terminal")
    chat.add_argument("prompt")
    _add_load_args(chat)
    chat.add_argument("--mmproj", help="the model's vision projector (mmproj-*.gguf), to send images")
    chat.add_argument("--image", action="append",
                      help="an image file (PNG, JPEG, …) the prompt asks about, with --mmproj (repeatable)")
    _add_spec_args(chat)
    chat.add_argument("--max-tokens", type=int, default=256)
    _add_sampling_args(chat)
    chat.add_argument("--stop", action="append", help="stop string (repeatable)")
    chat.add_argument("--raw", action="store_true", help="send the text as a raw prompt, no chat template")
    chat.add_argument("--json", action="store_true", help="also print the full statistics as JSON")
    chat.add_argument("--verbose", action="store_true", help="show the engine's log")
    chat.set_defaults(func=cmd_chat)

    info = sub.add_parser("info", help="facts about a GGUF file, read without loading it")
    info.add_argument("file", type=Path)
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_info)

    dm = sub.add_parser("default-model", help="assemble the embedded default model and print its path")
    dm.add_argument("--verify", action="store_true", help="check its sha256 again")
    dm.set_defaults(func=cmd_default_model)

    _register_extras(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
