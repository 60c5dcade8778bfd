"""The comparison benchmarks' pure parts: percentiles, one load run's figures,
per-sequence acceptance, the two servers' command lines (same per-sequence
context), and the build script's llama-server option (never in the default
build). Nothing here is timed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from engine.bench import concurrency as C
from engine.bench import servers as S

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packaging"))
import build_reference_driver as brd  # noqa: E402


def record(client: int, ttft: float, tokens: int = 10, drafted: int = 0, accepted: int = 0,
           text: str = "x", prompt: str = "p", prompt_tokens: int = 20, cached: int = 0) -> dict[str, object]:
    return {"client": client, "ttft": ttft, "tokens": tokens, "drafted": drafted, "accepted": accepted,
            "text": text, "prompt": prompt, "seconds": 1.0, "prompt_tokens": prompt_tokens, "cached": cached}


def test_percentile_interpolates_between_ranks_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert C.percentile(values, 0.5) == 2.5
    assert C.percentile(values, 0.0) == 1.0 and C.percentile(values, 1.0) == 4.0
    assert math.isclose(C.percentile(values, 0.95), 3.85)
    assert C.percentile([7.0], 0.95) == 7.0
    assert math.isnan(C.percentile([], 0.5))


def test_summarize_counts_tokens_over_the_wall_time_and_acceptance_per_client():
    records = [record(0, 0.1, drafted=6, accepted=6), record(0, 0.3, drafted=6, accepted=3),
               record(1, 0.2, drafted=12, accepted=0), record(2, 0.4)]
    fig = C.summarize(records, wall_s=2.0, clients=3)
    assert fig.tokens == 40 and fig.requests == 4 and fig.total_tps == 20.0
    assert math.isclose(fig.ttft_p50_s, 0.25) and math.isclose(fig.ttft_p95_s, 0.385)
    assert (fig.drafted, fig.accepted) == (24, 9) and fig.acceptance == 9 / 24
    assert fig.per_sequence == [0.75, 0.0, None]  # client 2 drafted nothing: no rate, not 0 %
    assert C.format_acceptance(fig) == "38 % (0–75)"
    assert fig.to_json()["acceptance"] == 9 / 24


def test_acceptance_shows_a_dash_when_nothing_was_drafted():
    fig = C.summarize([record(0, 0.1), record(1, 0.1)], wall_s=1.0, clients=2)
    assert fig.acceptance is None and C.format_acceptance(fig) == "–"


def test_texts_are_compared_per_prompt_with_the_reference_servers():
    records = [record(0, 0.1, text="a", prompt="p1"), record(1, 0.1, text="b", prompt="p2")]
    assert C.texts_match(records, {}) == "reference"
    assert C.texts_match(records, {"p1": "a", "p2": "c"}) == "1/2 same"


def test_prompts_are_the_same_for_every_server_and_differ_between_clients():
    assert C.prompt_for(0, 0) == C.prompt_for(0, 0)
    prompts = {C.prompt_for(k, j) for k in range(8) for j in range(2)}
    assert len(prompts) == 16


def test_a_clients_next_prompt_starts_as_its_last_one_more_than_as_any_other_clients():
    """What a server can reuse comes from the client's own last request (its sequence is free when the next
    one arrives), not from whichever other client's prompt happens to be held: otherwise reuse depends on
    whether replies end in the same step. With a system prompt, every client's prompts share it."""
    from engine.generation.prefix_cache import common_prefix

    for system in (0, 40):
        for k in range(8):
            for j in range(1, 4):
                own = common_prefix(list(C.prompt_for(k, j - 1, system)), list(C.prompt_for(k, j, system)))
                others = max(common_prefix(list(C.prompt_for(m, i, system)), list(C.prompt_for(k, j, system)))
                             for m in range(8) if m != k for i in range(4))
                assert own >= others + 10 and others >= len(C.preamble(system))


def test_table_has_one_row_per_server_and_count():
    fig = C.summarize([record(0, 0.05, drafted=3, accepted=3, prompt_tokens=30, cached=12)], wall_s=1.0,
                      clients=1, server_cpu_s=0.25)
    table = C.format_table([(1, "ours, MTP n_max 3", C.Repeated([fig], [1.0]), "reference")]).splitlines()
    assert len(table) == 3
    assert table[2] == ("| 1 | ours, MTP n_max 3 | 10.0 | 1.00 | 50 ms | 50 ms | 100 % | 25.0 ms | 18 of 30 | "
                        "reference |")


def test_rounds_give_medians_the_range_and_the_median_of_paired_ratios():
    """Three rounds of one server: the median tokens/s with its range, the median of each round's ratio to
    ours-off (not the ratio of medians), acceptance summed over the rounds with every sequence's spread."""
    figs = [C.summarize([record(0, ttft, drafted=4, accepted=acc), record(1, ttft, drafted=4, accepted=2)],
                        wall_s=wall, clients=2, server_cpu_s=0.1)
            for ttft, acc, wall in ((0.05, 4, 1.0), (0.07, 3, 2.0), (0.06, 1, 0.5))]
    rep = C.Repeated(figs, [1.2, 0.9, 1.05])
    (row,) = C.format_table([(2, "ours, MTP n_max 3 adaptive", rep, "12/12 same")]).splitlines()[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    tps = sorted(f.total_tps for f in figs)
    assert cells[2] == f"{tps[1]:.1f} ({tps[0]:.0f}–{tps[2]:.0f})"
    assert cells[3] == "1.05" and cells[4] == "60 ms"
    assert cells[6] == "58 % (25–100)"  # (4+2 + 3+2 + 1+2) / 24, per-sequence rates from 1/4 to 4/4
    assert C._texts_over_rounds(["reference", "6/6 same", "5/6 same"]) == "11/12 same"


def test_draft_counts_prefer_our_extension_and_fall_back_to_llama_servers_timings():
    ours = {"timings": {"draft_n": 9, "draft_n_accepted": 4}, "speculative": {"drafted": 9, "accepted": 5}}
    assert S.draft_counts(ours) == (9, 5)
    assert S.draft_counts({"timings": {"draft_n": 8, "draft_n_accepted": 2}}) == (8, 2)
    assert S.draft_counts({"timings": {}}) == (0, 0) and S.draft_counts({}) == (0, 0)


def test_both_servers_get_the_same_context_per_sequence_threads_and_depth():
    ours = S.command(S.ServerSpec("ours", "m.gguf", parallel=4, n_ctx=1024, threads=1, n_max=3), 9000)
    assert ours[1:4] == ["-m", "engine", "serve"]
    joined = " ".join(ours)
    assert "--parallel 4" in joined and "--ctx 1024" in joined and "--threads 1" in joined
    assert "--speculative mtp --n-max 3 --p-min 0" in joined and "--adaptive" not in joined
    off = " ".join(S.command(S.ServerSpec("ours", "m.gguf", parallel=2, n_max=0), 9000))
    assert "--speculative off" in off
    ls = " ".join(S.command(S.ServerSpec("llama-server", "m.gguf", parallel=4, n_ctx=1024, threads=1, n_max=3,
                                         binary="/b/llama-server"), 9000))
    # llama-server splits -c over its slots when the KV buffer is not unified
    assert ls.startswith("/b/llama-server -m m.gguf") and "-np 4 -c 4096 --no-kv-unified" in ls
    assert "-t 1 -tb 1" in ls and "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0" in ls
    ls_off = " ".join(S.command(S.ServerSpec("llama-server", "m.gguf", n_max=0, binary="b"), 9000))
    assert "--spec-type" not in ls_off


def test_the_default_build_leaves_llama_server_out_and_server_builds_only_it(monkeypatch, tmp_path):
    calls: list[tuple[tuple[str, ...], list[str]]] = []
    monkeypatch.setattr(brd, "tool_path", lambda backend, target: tmp_path / backend / target)
    monkeypatch.setattr(brd, "_build_targets", lambda backend, targets, options: calls.append((targets, options)))
    brd.build("cpu")
    brd.build_server("cpu")
    (default_targets, default_options), (server_targets, server_options) = calls
    assert "llama-server" not in default_targets and "-DLLAMA_BUILD_SERVER=OFF" in default_options
    assert server_targets == ("llama-server",)
    # no curl or OpenSSL (the shared options), no web UI fetched at build time
    assert {"-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"} <= set(server_options)
    assert brd.server_path("cpu") == tmp_path / "cpu" / "llama-server"


def test_the_conversation_table_puts_the_servers_side_by_side():
    from engine.bench.conversation import ServedTurns, format_served

    def turn(ttft: float, cached: int, prompt_ms: float) -> S.Completion:
        return S.Completion(seconds=1.0, ttft=ttft, text="t", tokens=4, prompt_tokens=50, cached=cached,
                            drafted=0, accepted=0, prompt_ms=prompt_ms)

    rows = [ServedTurns("ours, MTP off", [turn(0.2, 0, 150), turn(0.1, 40, 60)], (0.5, 0.05)),
            ServedTurns("llama-server, MTP off", [turn(0.1, 0, 80), turn(0.2, 45, 170.4)], (0.4, 0.04))]
    lines = format_served(rows).splitlines()
    assert lines[0] == ("| turn | prompt tokens | ours, MTP off: reused | ours, MTP off: TTFT | "
                        "ours, MTP off: prompt | llama-server, MTP off: reused | llama-server, MTP off: TTFT | "
                        "llama-server, MTP off: prompt | llama-server, MTP off / ours, MTP off |")
    assert lines[1].count("---:") == 9
    assert lines[3] == "| 2 | 50 | 40 | 100 ms | 60 ms | 45 | 200 ms | 170 ms | 2.00x |"


def test_the_conversation_verdict_counts_turns_and_the_time_outside_each_decode():
    from engine.bench.conversation import ServedTurns, verdict

    def turn(ttft: float, prompt_ms: float) -> S.Completion:
        return S.Completion(seconds=1.0, ttft=ttft, text="t", tokens=4, prompt_tokens=50, cached=0,
                            drafted=0, accepted=0, prompt_ms=prompt_ms)

    ours = ServedTurns("ours", [turn(0.100, 90), turn(0.200, 190), turn(0.150, 141)], (0.5, 0.05))
    theirs = ServedTurns("theirs", [turn(0.110, 107), turn(0.180, 176), turn(0.150, 147)], (0.4, 0.04))
    assert verdict([ours, theirs]).splitlines() == [
        "ours quicker at 1 of 3 turns; median theirs / ours TTFT 1.00x",
        "outside the prompt's decode, median: ours 10.0 ms (range 9.0-10.0), theirs 3.0 ms (range 3.0-4.0)"]


def test_extra_llama_server_arguments_go_last_and_name_the_row():
    spec = S.ServerSpec("llama-server", "m.gguf", binary="b", extra=("--ctx-checkpoints", "4"))
    assert S.command(spec, 9000)[-2:] == ["--ctx-checkpoints", "4"]
    assert spec.label == "llama-server --ctx-checkpoints 4, MTP off"


def test_a_full_size_window_cache_is_asked_of_both_servers_alike():
    for engine in ("ours", "llama-server"):
        spec = S.ServerSpec(engine, "m.gguf", binary="b", swa_full=True)
        assert "--swa-full" in S.command(spec, 9000)
        assert "--swa-full" not in S.command(S.ServerSpec(engine, "m.gguf", binary="b"), 9000)
        assert spec.label == f"{engine} --swa-full, MTP off"


def test_a_pool_of_cells_is_asked_of_both_servers_alike():
    """Each server's own default unless asked: ours one pool, llama-server --parallel N a pool each;
    --kv-pool asks the same of both."""
    assert "--no-kv-unified" not in S.command(S.ServerSpec("ours", "m.gguf"), 9000)
    assert "--no-kv-unified" in S.command(S.ServerSpec("llama-server", "m.gguf", binary="b"), 9000)
    for engine in ("ours", "llama-server"):
        each = S.command(S.ServerSpec(engine, "m.gguf", binary="b", kv_unified=False), 9000)
        one = S.command(S.ServerSpec(engine, "m.gguf", binary="b", kv_unified=True), 9000)
        assert "--no-kv-unified" in each and "--no-kv-unified" not in one
    assert "--kv-unified" in S.command(S.ServerSpec("llama-server", "m.gguf", binary="b", kv_unified=True), 9000)
    assert S.ServerSpec("ours", "m.gguf", kv_unified=False).label == "ours --no-kv-unified, MTP off"


def test_serve_asks_a_pool_per_sequence_of_the_worker_with_no_kv_unified():
    """The flag reaches the load the worker gets (serve, chat and bench-serve share the model options)."""
    import argparse

    from engine.server.cli import add_model_args
    from engine.server.engine_link import load_request_for

    p = argparse.ArgumentParser()
    add_model_args(p)
    assert p.parse_args([]).kv_unified and not p.parse_args(["--no-kv-unified"]).kv_unified
    assert not load_request_for("m.gguf", parallel=4, kv_unified=False).options.kv_unified
    assert load_request_for("m.gguf", parallel=4).options.kv_unified
