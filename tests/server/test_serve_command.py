"""``mtp-studio serve`` as a user runs it: a child process, a real port, Ctrl+C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import httpx

KEY = "test-key-from-the-environment"


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "engine", "serve", "--threads", "1", *args],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def served_address(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The address a started ``serve`` prints (``http://127.0.0.1:PORT/v1``), and what it printed up to it."""
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("serving "):
            break
    found = re.search(r"serving (http://127\.0\.0\.1:\d+/v1)", "".join(lines))
    assert found, "".join(lines)
    return found.group(1), "".join(lines)


def test_serve_answers_on_the_printed_address_and_stops_on_ctrl_c(model_path):
    proc = serve("--model", model_path, "--port", "0", "--speculative", "mtp", "--alias", "tiny",
                 env={"MTP_STUDIO_API_KEY": KEY})
    try:
        address, printed = served_address(proc)
        assert "speculation by default: mtp n_max=3" in printed and "API key required" in printed
        # no --parallel: 4 at once, as llama-server's default, since 4 sequences of this model fit here
        assert re.search(r"^4 requests at once \(4 sequences of 4096 tokens need ~[\d.]+ [MG]iB", printed, re.M)
        assert KEY not in printed
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello world the"}], "max_tokens": 6}
        url = f"{address}/chat/completions"
        assert httpx.post(url, json=body, timeout=60).status_code == 401
        reply = httpx.post(url, json=body, timeout=60, headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 6
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_serve_refuses_another_address_without_a_key():
    proc = serve("--host", "0.0.0.0", env={"MTP_STUDIO_API_KEY": ""})  # and no keyring in tests
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "set an API key" in err


def test_a_taken_port_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = serve("--port", str(taken.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "cannot listen" in err and "--port" in err


def test_requests_default_to_the_models_autotune_profile(model_path, link, monkeypatch, tmp_path):
    from engine.autotune.profiles import ProfileStore, new_profile
    from engine.hardware.probe import probe
    from engine.speculative.settings import mtp

    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path))  # this profile must not reach other tests
    ProfileStore().save(new_profile(probe().fingerprint(), model_path, link.hello.engine.key, mtp(2), 1.4,
                                    "measured in a test"))
    proc = serve("--model", model_path, "--port", "0")  # --speculative auto, the default
    try:
        assert proc.stderr is not None
        lines = [next(proc.stderr) for _ in range(4)]
        assert "autotune profile: mtp n_max=2 (measured in a test; measured alone, used with up to 4 at once)" \
            in lines[1], lines
        url = re.search(r"(http://\S+/v1)", lines[3]).group(1)  # type: ignore[union-attr]
        reply = httpx.post(f"{url}/completions", timeout=60,
                           json={"model": "combined", "prompt": "hello world the", "max_tokens": 8, "temperature": 0})
        assert reply.json()["speculative"]["n_max"] == 2 and reply.json()["timings"]["draft_n"] > 0
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_serve_takes_the_profiles_draft_vocabulary_unless_told(link, monkeypatch, tmp_path):
    """A profile's draft vocabulary is a load setting, so ``serve`` reads the profile before the model loads
    and a line names the cut the worker loaded; ``--draft-vocab 0`` overrides it (the whole vocabulary). On a
    real vocabulary: a cut is at least 1,024 ids."""
    from engine.autotune.profiles import ProfileStore, new_profile
    from engine.hardware.probe import probe
    from engine.speculative.settings import mtp
    from engine.synth.spec import HeadMap, SynthSpec
    from engine.synth.writer import SynthModel

    model = str(SynthModel(SynthSpec(arch="glm4moe", size="tiny-152k", weights="mixed",
                                     heads=(HeadMap("hidden", 0.7, 0),))).path("combined"))
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path))  # this profile must not reach other tests
    ProfileStore().save(new_profile(probe().fingerprint(), model, link.hello.engine.key, mtp(2), 1.3,
                                    "measured in a test", draft_vocab=4096))
    for extra, cut in (((), "the MTP head drafts among the first 4,096 of 151,936 tokens (autotune profile;"),
                       (("--draft-vocab", "0"), None), (("--draft-vocab", "2048"),
                        "the MTP head drafts among the first 2,048 of 151,936 tokens (--draft-vocab;")):
        proc = serve("--model", model, "--port", "0", "--parallel", "1", *extra)
        try:
            assert proc.stderr is not None
            lines = []
            for line in proc.stderr:
                lines.append(line)
                if line.startswith(("serving ", "error")):
                    break
            assert "autotune profile: mtp n_max=2 (measured in a test" in lines[1], lines
            assert (lines[2].startswith(cut) if cut else "drafts among" not in "".join(lines)), (extra, lines)
            url = re.search(r"(http://\S+/v1)", lines[-1]).group(1)  # type: ignore[union-attr]
            reply = httpx.post(f"{url}/completions", timeout=60,
                               json={"model": "combined", "prompt": "hello world the", "max_tokens": 8,
                                     "temperature": 0})
            assert reply.json()["speculative"]["n_max"] == 2, reply.json()
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0


def test_a_client_going_back_to_a_conversation_gets_it_from_host_memory_unless_cache_ram_is_0(model_path):
    """One sequence; a conversation, another that cuts it, then the first continued: with the default
    ``--cache-ram`` the way back reads only its new tokens (``timings.cache_n``), with ``--cache-ram 0`` all
    of them; the replies are the same (engine/generation/state_cache.py)."""
    first = " ".join(["the river model light and the mill by the water"] * 9)
    replies = {}
    for cache in ("2048", "0"):
        proc = serve("--model", model_path, "--port", "0", "--parallel", "1", "--speculative", "off",
                     "--cache-ram", cache)
        try:
            url = f"{served_address(proc)[0]}/completions"

            def complete(prompt: str, url: str = url) -> dict:
                body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
                reply = httpx.post(url, json=body, timeout=60)
                assert reply.status_code == 200, reply.text
                return reply.json()

            a = complete(first)
            complete(" far away from here a town stood on the hill above the sea")
            back = complete(first + a["choices"][0]["text"] + " and then")
            replies[cache] = [a["choices"][0]["text"], back["choices"][0]["text"]]
            if cache == "0":
                assert back["timings"]["cache_n"] < 8  # only what the other prompt began with
            else:
                assert back["timings"]["cache_n"] >= a["usage"]["prompt_tokens"] - 1 >= 64
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
    assert replies["2048"] == replies["0"]
    bad = serve("--model", model_path, "--port", "0", "--cache-ram", "-5")
    _, err = bad.communicate(timeout=60)
    assert bad.returncode != 0 and "--cache-ram" in err
