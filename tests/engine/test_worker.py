"""The real worker process on the real default model."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from engine.sampling import SamplingParams
from engine.speculative.settings import MAX_DRAFT
from engine.worker import protocol as P
from engine.worker.client import WorkerClient, WorkerDied

PROMPT = "The capital of France is"


def load_default(worker: WorkerClient) -> P.ModelInfo:
    events = worker.call(P.LoadRequest(id=worker.new_id(), options=P.LoadOptions(n_ctx=512, n_threads=1)))
    assert isinstance(events[-1], P.LoadedEvent), events
    return events[-1].model


def text_of(events: list[P.Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, P.TokenEvent))


def test_handshake_reports_protocol_and_engine_build(worker: WorkerClient):
    assert isinstance(worker.hello, P.ReadyEvent)
    assert worker.hello.protocol == P.PROTOCOL_VERSION
    assert worker.hello.engine.llama_cpp_python == "0.3.36"
    assert worker.hello.engine.backend
    # the engine is patched: the handshake names the series the installed wheel was built with, and it is
    # this checkout's (otherwise rebuild it: packaging/bootstrap.sh)
    series = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "packaging" / "patches").glob("*.patch"))
    assert worker.hello.engine.patches == series and series
    assert worker.hello.engine.patch_hash
    assert worker.hello.max_draft == MAX_DRAFT  # the app's limits come from here


def test_load_generate_round_trip_streams_tokens_and_stats(worker: WorkerClient):
    model = load_default(worker)
    assert model.architecture == "gemma3" and model.is_default_model
    assert model.has_chat_template is False and model.max_draft == 0  # no MTP head: no drafts
    events = worker.call(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=12))
    kinds = [e.type for e in events]
    assert kinds[-1] == "done" and kinds.count("token") >= 2
    done = events[-1]
    assert isinstance(done, P.DoneEvent)
    assert done.finish_reason == "length" and done.n_tokens == 12
    assert done.stats.generated_tokens == 12 and done.stats.prompt_tokens > 0
    assert "Paris" in text_of(events) or "France" in text_of(events)


def test_greedy_output_is_identical_across_two_runs(worker: WorkerClient):
    load_default(worker)
    first = text_of(worker.call(P.GenerateRequestMsg(id="a", prompt=PROMPT, max_tokens=24)))
    second = text_of(worker.call(P.GenerateRequestMsg(id="b", prompt=PROMPT, max_tokens=24)))
    assert first == second and len(first) > 20


def test_seeded_sampling_repeats_and_different_seeds_differ(worker: WorkerClient):
    load_default(worker)

    def run(seed: int) -> str:
        return text_of(worker.call(P.GenerateRequestMsg(
            id=f"s{seed}-{time.monotonic()}", prompt="Once upon a time", max_tokens=30,
            sampling=SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed))))

    assert run(1) == run(1)
    assert len({run(1), run(2), run(3)}) > 1


def test_cancel_mid_stream_ends_cancelled_within_one_decode_step(worker: WorkerClient):
    load_default(worker)
    worker.send(P.GenerateRequestMsg(id="long", prompt=PROMPT, max_tokens=400))
    tokens_before = 0
    while tokens_before < 5:
        ev = worker.next_event(60)
        tokens_before += isinstance(ev, P.TokenEvent)
    worker.send(P.CancelRequest(id="c", target="long"))
    after = []
    for ev in worker.events_until_done("long", timeout=60):
        after.append(ev)
    assert after[-1].finish_reason == "cancelled"
    # Tokens already in the pipe when cancel was sent, plus at most one decode step.
    assert sum(isinstance(e, P.TokenEvent) for e in after) <= 3


def test_bad_requests_get_typed_errors_and_the_worker_keeps_serving(worker: WorkerClient):
    load_default(worker)
    worker.send("{this is not json")
    ev = worker.next_event(10)
    assert (ev.type, ev.kind, ev.final) == ("error", "protocol", True)
    assert "malformed JSON" in ev.message

    worker.send('{"type": "teleport", "id": "t1"}')
    ev = worker.next_event(10)
    assert (ev.type, ev.kind, ev.id) == ("error", "protocol", "t1")

    worker.send('{"type": "generate", "id": "g0", "prompt": "x", "speculative": {"mode": "mtp", "n_max": 99}}')
    ev = worker.next_event(10)
    assert (ev.type, ev.kind, ev.id) == ("error", "protocol", "g0") and "n_max" in ev.message

    events = worker.call(P.LoadRequest(id="missing", options=P.LoadOptions(path="/nonexistent/model.gguf")))
    assert events[-1].type == "error" and events[-1].kind == "model_file"
    assert "not found" in events[-1].message

    # The previously loaded model is still there and still answers.
    events = worker.call(P.GenerateRequestMsg(id="after", prompt=PROMPT, max_tokens=4))
    assert events[-1].finish_reason == "length"


def test_generate_without_a_model_is_a_typed_error(worker: WorkerClient):
    events = worker.call(P.GenerateRequestMsg(id="g", prompt="x", max_tokens=2))
    assert [e.type for e in events] == ["error", "done"]
    assert events[0].kind == "no_model" and events[-1].finish_reason == "error"


def test_a_file_that_is_not_gguf_never_reaches_llama_cpp(worker: WorkerClient, tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip file, not a model" * 4)
    events = worker.call(P.LoadRequest(id="bogus", options=P.LoadOptions(path=str(bogus))))
    assert events[-1].kind == "model_file" and "not a GGUF file" in events[-1].message
    assert worker.proc.poll() is None


def test_truncated_gguf_is_refused_before_loading(worker: WorkerClient, default_model, tmp_path):
    cut = tmp_path / "cut.gguf"
    with default_model.open("rb") as src:
        cut.write_bytes(src.read(50 * 2**20))
    events = worker.call(P.LoadRequest(id="cut", options=P.LoadOptions(path=str(cut))))
    assert events[-1].kind == "model_file" and "truncated" in events[-1].message


def test_native_stdout_noise_cannot_corrupt_the_protocol(worker: WorkerClient):
    # Loading logs a lot from llama.cpp; every line we read must still be JSON.
    load_default(worker)
    worker.call(P.UnloadRequest(id="u"))
    load_default(worker)


def test_killed_worker_is_reported_as_dead(worker: WorkerClient):
    load_default(worker)
    worker.send(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=400))
    worker.next_event(60)
    os.kill(worker.proc.pid, signal.SIGKILL)
    with pytest.raises(WorkerDied, match="SIGKILL"):
        for _ in range(1000):
            worker.next_event(30)


def test_a_mismatched_sidecar_is_refused_and_the_loaded_model_stays(worker: WorkerClient):
    from tests.engine.conftest import synth

    model = synth("glm4moe")
    load_default(worker)
    events = worker.call(P.LoadRequest(id="bad", options=P.LoadOptions(path=str(model.path("trunk")),
                                                                       sidecar=str(model.path("sidecar-other-vocab")))))
    assert events[-1].kind == "sidecar_mismatch" and "vocabulary of 640" in events[-1].message
    events = worker.call(P.GenerateRequestMsg(id="still", prompt=PROMPT, max_tokens=4))
    assert events[-1].finish_reason == "length"  # the default model is still loaded
