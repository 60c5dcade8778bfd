"""``bench-concurrency`` against a real ``mtp-studio serve --parallel 2``
(engine/bench/servers.py, engine/bench/concurrency.py): the stream is read
as the benchmark reads it (tokens, draft counts from our ``speculative``
extension, reused prompt tokens), and two concurrent clients give one
acceptance per sequence. Nothing timed is asserted."""

from __future__ import annotations

from engine.bench import concurrency as C
from engine.bench import servers as S


def test_the_benchmark_reads_our_stream_and_two_clients_run_on_two_sequences(model_path):
    spec = S.ServerSpec("ours", model_path, parallel=2, n_ctx=1024, threads=1, n_max=3)
    with S.RunningServer(spec) as server:
        first = S.complete(server.port, "hello world the", 12)
        assert first.tokens == 12 and first.text and 0 < first.ttft <= first.seconds
        assert first.drafted > 0 and 0 < first.accepted <= first.drafted
        again = S.complete(server.port, "hello world the", 12)
        assert again.text == first.text and again.cached > 0  # the sequence kept the prompt
        clients = C._Clients()
        cpu0 = server.cpu_seconds()
        try:
            records, wall = clients.load(server.port, clients=2, requests=2, max_tokens=8)
        finally:
            clients.close()
        cpu = server.cpu_seconds() - cpu0
    fig = C.summarize(records, wall, clients=2, server_cpu_s=cpu)
    assert cpu > 0 and fig.cpu_ms_per_token > 0  # the worker's decoding counts: it is the server's child
    assert fig.requests == 4 and fig.tokens == 32 and fig.total_tps > 0
    assert {r["client"] for r in records} == {0, 1}
    assert len(fig.per_sequence) == 2 and all(a is not None and a > 0 for a in fig.per_sequence)


def test_the_conversation_replay_reuses_each_turns_prompt_on_our_server(model_path):
    from engine.bench import conversation

    prompts = [conversation.PARAGRAPHS[0], conversation.PARAGRAPHS[0] + "\n\n" + conversation.PARAGRAPHS[1]]
    served = conversation.replay(S.ServerSpec("ours", model_path, n_ctx=2048, threads=1), prompts, 6)
    assert [t.tokens for t in served.turns] == [6, 6]
    assert served.turns[0].cached == 0 and served.turns[1].cached >= served.turns[0].prompt_tokens - 1
    assert served.label == "ours, MTP off" and all(t > 0 for t in served.twice)
