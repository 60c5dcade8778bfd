"""The real worker process under hostile input: templates that never finish,
protocol lines that are not what they claim, and load/generate requests with
values llama.cpp would crash on. Every case must end with a clear error (or
event), leave the worker serving, and never hang."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from engine.worker import protocol as P
from engine.worker.client import WorkerClient
from tests import gguf_mutate as G
from tests.engine.conftest import synth

PROMPT = "The capital of France is"
# A template that renders for ever: 10^15 iterations and no output.
FOREVER = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}" \
          "{% endfor %}{% endfor %}{% endfor %}"


def load(worker: WorkerClient, path: str | None = None, **options: object) -> P.Event:
    settings = {"n_ctx": 512, **options}
    return worker.call(P.LoadRequest(id=worker.new_id(), options=P.LoadOptions(path=path, **settings)), timeout=60)[-1]


def with_template(template: str, tmp_path: Path) -> str:
    """A small synthetic model whose header carries ``template`` as its chat template."""
    source = synth("glm4moe").path("combined")
    gguf = G.parse(source).with_kv("tokenizer.chat_template", G.value(G.STRING, template))
    return str(gguf.write(tmp_path / "templated.gguf"))


def with_nextn(n: int, tmp_path: Path) -> str:
    source = synth("glm4moe").path("combined")
    gguf = G.parse(source).with_kv("glm4moe.nextn_predict_layers", G.value(G.UINT32, n))
    return str(gguf.write(tmp_path / "nextn.gguf"))


def still_generates(worker: WorkerClient) -> None:
    events = worker.call(P.GenerateRequestMsg(id=worker.new_id(), prompt=PROMPT, max_tokens=2), timeout=30)
    assert events[-1].type == "done" and events[-1].finish_reason == "length", events


def chat(worker: WorkerClient, rid: str) -> None:
    worker.send(P.GenerateRequestMsg(id=rid, messages=[{"role": "user", "content": "hi"}], max_tokens=4))


# -- templates (issue 17, item 4) ----------------------------------------------
def test_a_template_that_never_finishes_is_stopped_by_the_time_limit(worker: WorkerClient, tmp_path):
    assert load(worker, with_template(FOREVER, tmp_path)).type == "loaded"
    t0 = time.monotonic()
    chat(worker, "g")
    events = list(worker.events_until_done("g", timeout=9))
    assert time.monotonic() - t0 < 9
    errors = [e for e in events if e.type == "error"]
    assert errors and errors[0].kind == "template" and "time limit" in errors[0].message, events
    assert events[-1].finish_reason == "error"
    still_generates(worker)


def test_cancel_reaches_a_template_that_is_still_rendering(worker: WorkerClient, tmp_path):
    assert load(worker, with_template(FOREVER, tmp_path)).type == "loaded"
    chat(worker, "g")
    time.sleep(0.5)
    t0 = time.monotonic()
    worker.send(P.CancelRequest(id="c", target="g"))
    events = list(worker.events_until_done("g", timeout=9))
    assert events[-1].finish_reason == "cancelled", events
    assert time.monotonic() - t0 < 1.5


def test_stdin_closing_ends_a_busy_worker(worker: WorkerClient, tmp_path):
    assert load(worker, with_template(FOREVER, tmp_path)).type == "loaded"
    chat(worker, "g")
    time.sleep(0.3)
    worker.proc.stdin.close()  # the app is gone
    assert worker.proc.wait(timeout=8) == 0


def test_stdin_closing_ends_a_worker_mid_reply(worker: WorkerClient):
    assert load(worker).type == "loaded"
    worker.send(P.GenerateRequestMsg(id="long", prompt=PROMPT, max_tokens=100000))
    while worker.next_event(30).type != "token":
        pass
    worker.proc.stdin.close()
    assert worker.proc.wait(timeout=8) == 0


# -- the protocol reader (item 8, and invalid input from item 10) -------------
def test_deeply_nested_json_is_a_protocol_error_and_the_reader_survives(worker: WorkerClient):
    worker.send("[" * 200_000 + "]" * 200_000)
    ev = worker.next_event(9)
    assert (ev.type, ev.kind, ev.final) == ("error", "protocol", True) and "nested" in ev.message
    worker.send('{"type": "load", "id": "deep", "n_ctx": ' + "[" * 100_000 + "]" * 100_000 + "}")
    ev = worker.next_event(9)
    assert (ev.type, ev.kind) == ("error", "protocol")
    assert load(worker).type == "loaded"  # still reading, still serving
    worker.proc.stdin.close()
    assert worker.proc.wait(timeout=8) == 0


def test_invalid_utf8_and_lone_surrogates_are_protocol_errors(worker: WorkerClient):
    assert load(worker).type == "loaded"
    worker.proc.stdin.buffer.write(b'{"type": "generate", "id": "u8", "prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8
    worker.proc.stdin.flush()
    ev = worker.next_event(9)
    assert (ev.type, ev.kind) == ("error", "protocol") and "UTF-8" in ev.message, ev
    # a lone surrogate cannot be encoded by the client; send it as a JSON escape
    worker.send('{"type": "generate", "id": "sur", "prompt": "a\\ud800b", "max_tokens": 2}')
    events = list(worker.events_until_done("sur", timeout=9))
    assert events[0].type == "error" and events[0].kind == "protocol" and "surrogate" in events[0].message, events
    still_generates(worker)


# -- load and generate values (item 10) ----------------------------------------
@pytest.mark.parametrize("options, fragment", [
    ({"n_threads": 100000}, "n_threads"),
    ({"n_threads": 0}, "n_threads"),
    ({"n_ctx": -1}, "n_ctx"),
    ({"n_ctx": 2**31}, "n_ctx"),
])
def test_bad_load_values_are_refused_and_the_loaded_model_stays(worker: WorkerClient, options, fragment):
    assert load(worker).type == "loaded"
    ev = load(worker, **options)
    assert ev.type == "error" and ev.final and fragment in ev.message, ev
    assert "malformed" not in ev.message
    still_generates(worker)


def test_more_mtp_layers_than_blocks_is_refused_from_the_header(worker: WorkerClient, tmp_path):
    assert load(worker).type == "loaded"
    ev = load(worker, with_nextn(9, tmp_path))
    assert ev.type == "error" and ev.kind == "model_file" and "nextn_predict_layers" in ev.message, ev
    assert worker.proc.poll() is None
    still_generates(worker)


def test_cancel_ends_with_its_own_final_event(worker: WorkerClient):
    events = worker.call(P.CancelRequest(id="c-idle"), timeout=9)
    assert events[-1].type == "ack" and events[-1].target is None
    assert load(worker).type == "loaded"
    worker.send(P.GenerateRequestMsg(id="long", prompt=PROMPT, max_tokens=400))
    while worker.next_event(30).type != "token":
        pass
    worker.send(P.GenerateRequestMsg(id="queued", prompt=PROMPT, max_tokens=400))
    acked = worker.call(P.CancelRequest(id="c-queued", target="queued"), timeout=9)
    assert acked[-1].type == "ack" and acked[-1].target == "queued"  # waiting, not yet running
    acked = worker.call(P.CancelRequest(id="c-busy", target="long"), timeout=9)
    assert acked[-1].type == "ack" and acked[-1].target == "long"
    assert list(worker.events_until_done("long", timeout=9))[-1].finish_reason == "cancelled"
    queued = list(worker.events_until_done("queued", timeout=9))
    assert [e.type for e in queued] == ["stats", "done"] and queued[-1].finish_reason == "cancelled", queued


def test_max_tokens_zero_emits_no_token(worker: WorkerClient):
    assert load(worker).type == "loaded"
    events = worker.call(P.GenerateRequestMsg(id="z", prompt=PROMPT, max_tokens=0), timeout=9)
    assert not [e for e in events if e.type == "token"], events
    assert events[-1].finish_reason == "length" and events[-1].n_tokens == 0
    events = worker.call(P.GenerateRequestMsg(id="neg", prompt=PROMPT, max_tokens=-1), timeout=9)
    assert events[0].kind == "protocol" and "max_tokens" in events[0].message, events


def test_a_prompt_far_longer_than_the_context_is_refused_at_once(worker: WorkerClient):
    assert load(worker).type == "loaded"
    t0 = time.monotonic()
    events = worker.call(P.GenerateRequestMsg(id="huge", prompt="word " * 6_000_000, max_tokens=2), timeout=9)
    assert time.monotonic() - t0 < 5
    assert events[0].kind == "context" and "characters" in events[0].message, events
    events = worker.call(P.GenerateRequestMsg(id="huge-chat", max_tokens=2,
                                              messages=[{"role": "user", "content": "word " * 6_000_000}]),
                         timeout=9)
    assert events[0].kind == "context" and "characters" in events[0].message, events
    still_generates(worker)


def test_mutation_helper_sets_the_value_it_is_asked_to(tmp_path):
    gguf = G.parse(Path(with_nextn(9, tmp_path)))
    assert struct.unpack("<I", gguf.kv["glm4moe.nextn_predict_layers"][4:8]) == (9,)


def test_a_file_llama_cpp_refuses_late_leaves_the_previous_model_loaded(worker: WorkerClient, tmp_path):
    # The header reads well, but llama.cpp knows no such architecture: it fails after the unload.
    gguf = G.parse(synth("glm4moe").path("combined"))
    renamed = {key.replace("glm4moe.", "glm4zz."): value for key, value in gguf.kv.items()}
    renamed["general.architecture"] = G.value(G.STRING, "glm4zz")
    path = str(G.Gguf(gguf.version, renamed, gguf.tensor_infos, gguf.data, gguf.alignment).write(tmp_path / "x.gguf"))
    assert load(worker).type == "loaded"
    ev = load(worker, path)
    assert ev.type == "error" and ev.final, ev
    assert "previous model" in ev.message, ev
    still_generates(worker)


def test_shutdown_cancels_the_reply_in_progress(worker: WorkerClient):
    assert load(worker).type == "loaded"
    worker.send(P.GenerateRequestMsg(id="long", prompt=PROMPT, max_tokens=100000))
    while worker.next_event(30).type != "token":
        pass
    t0 = time.monotonic()
    events = worker.call(P.ShutdownRequest(id="bye"), timeout=9)
    assert events[-1].type == "bye" and time.monotonic() - t0 < 3
    assert worker.proc.wait(timeout=5) == 0


def test_the_client_refuses_text_that_is_not_unicode_without_sending_it(worker: WorkerClient):
    from engine.errors import ProtocolError

    with pytest.raises(ProtocolError, match="not valid Unicode"):
        worker.send(P.GenerateRequestMsg(id="s", prompt="a\udcffb"))
    assert worker.call(P.UnloadRequest(id="u"), timeout=9)[-1].type == "unloaded"


def test_a_path_the_system_refuses_is_a_model_file_error(worker: WorkerClient, tmp_path):
    for path in ("a" * 100_000, str(tmp_path)):  # too long for the system; a folder
        ev = load(worker, path)
        assert ev.type == "error" and ev.kind == "model_file", ev
        assert len(ev.message) < 1000


def test_a_worker_whose_parent_died_exits_although_its_stdin_stays_open(tmp_path):
    # The worker's parent (a shell) exits; its stdin is a pipe another process keeps open, so no EOF comes.
    import os
    import subprocess
    import sys

    script = f"sleep 12 2>/dev/null | {sys.executable} -m engine.worker >/dev/null 2>&1 & echo $!; sleep 1"
    shell = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(shell.stdout.readline())
    shell.stdout.close()
    shell.wait(timeout=10)

    def alive() -> bool:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        return "\nState:\tZ" not in state

    deadline = time.monotonic() + 9
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    still = alive()
    if still:
        os.kill(pid, 9)
    assert not still, "the orphaned worker kept running"


# -- text and ids the worker cannot write back (issue 31) ------------------------
def test_a_request_whose_id_or_path_is_not_unicode_is_refused_and_the_worker_serves_on(worker: WorkerClient):
    """An answer echoes the id; one that is not Unicode cannot be written, and the worker used to take
    that for a broken pipe and end. It is refused, without the id, before anything runs."""
    assert load(worker).type == "loaded"
    worker.send('{"type": "generate", "id": "\\ud800", "prompt": "a", "max_tokens": 2}')
    ev = worker.next_event(9)
    assert (ev.type, ev.kind, ev.id) == ("error", "protocol", None) and "surrogate" in ev.message, ev
    worker.send('{"type": "load", "id": "p", "path": "/tmp/\\udc80.gguf"}')
    ev = worker.next_event(9)
    assert (ev.type, ev.kind, ev.id) == ("error", "protocol", "p") and "'path' holds a lone surrogate" in ev.message, ev
    still_generates(worker)


def test_a_second_generate_with_the_id_of_one_in_hand_is_refused_and_the_first_runs_alone(worker: WorkerClient):
    assert load(worker).type == "loaded"
    worker.send(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=400))
    worker.send(P.GenerateRequestMsg(id="g", prompt=PROMPT, max_tokens=2))
    worker.send(P.CancelRequest(id="c", target="g"))
    worker.send(P.GenerateRequestMsg(id="h", prompt=PROMPT, max_tokens=2))
    seen: list[P.Event] = []
    while not (seen and seen[-1].type == "done" and seen[-1].id == "h"):  # requests run in order: g, then h
        seen.append(worker.next_event(60))
    assert len([e for e in seen if e.type == "done" and e.id == "g"]) == 1, seen  # one "g" ran, one ended
    refusals = [e for e in seen if e.type == "error" and e.id is None]
    assert refusals and "'g' is still waiting or running" in refusals[0].message, seen
    assert seen[-1].finish_reason == "length"
