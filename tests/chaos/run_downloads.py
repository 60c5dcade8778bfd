"""Chaos category ``downloads``: `mtp-studio models download` killed at random byte offsets and resumed
(the loopback hub of tests/fake_hub.py), two downloads of one file at once, and hostile servers
(tests/chaos/hostile_hub.py). Every file that ends under its final name must have the right sha256."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.chaos import common as C
from tests.chaos import hostile_hub as H

TIMEOUT = 60.0
TOKEN = "hf_chaosSECRETtoken0123456789"


def download_cmd(repo: str, name: str, dest: Path) -> list[str]:
    return [*C.CLI, "models", "download", repo, name, "--dest", str(dest)]


def check_dest(dest: Path, name: str, expected: str, res: C.Result | None, label: str) -> list[tuple[str, str]]:
    """Corrupt: a file under its final name with the wrong sha256; success claimed without the file."""
    out: list[tuple[str, str]] = []
    final = dest / Path(name).name
    for path in dest.iterdir() if dest.exists() else []:
        if path.is_file() and path.name == final.name:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != expected:
                out.append((C.CORRUPT, f"{label}: {path.name} is complete with {path.stat().st_size} bytes "
                                       f"and the wrong sha256 ({digest[:12]}…)"))
    if res is not None and res.rc == 0 and not final.exists():
        out.append((C.OTHER, f"{label}: exit 0 but no {final.name}"))
    return out


def run(ctx: Any) -> None:
    kill_and_resume(ctx)
    concurrent(ctx)
    hostile(ctx)


def env_for(url: str, token: str | None = None) -> dict[str, str]:
    env = {"HF_ENDPOINT": url, "HF_HUB_ETAG_TIMEOUT": "10", "HF_HUB_DOWNLOAD_TIMEOUT": "10"}
    if token:
        env["HF_TOKEN"] = token
    return env


def kill_and_resume(ctx: Any) -> None:
    from tests.fake_hub import FakeHub

    row = "downloads: killed at random offsets, resumed"
    n = 2 if ctx.quick else 12
    size = 12_000_000 if ctx.quick else 20_000_000
    src = ctx.tmp / "hub" / "big.gguf"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(random.Random(f"{ctx.seed}:blob").randbytes(size))
    expected = hashlib.sha256(src.read_bytes()).hexdigest()
    with FakeHub({"chaos/big": {"big.gguf": src}}) as hub:
        for i in range(n):
            case = f"downloads-kill-{i:02d}"
            if not ctx.wanted(case):
                continue
            rng = ctx.rng("dl-kill", i)
            dest = ctx.tmp / case
            kills = rng.choice([1, 1, 2, 3])
            outcomes: list[tuple[str, str]] = []
            done_at = []
            for _ in range(kills):
                at = rng.randrange(1, size)
                sig = rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGINT])
                hub.slow_chunk_s = 0.004
                proc = subprocess.Popen(download_cmd("chaos/big", "big.gguf", dest), env={
                    **os.environ, **env_for(hub.url)}, cwd=C.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True, preexec_fn=lambda: C.limit_memory(C.CLI_MEMORY))
                partial = dest / "big.gguf.partial"
                end = time.monotonic() + TIMEOUT
                while proc.poll() is None and time.monotonic() < end:
                    if partial.exists() and partial.stat().st_size >= at:
                        break
                    time.sleep(0.003)
                have = partial.stat().st_size if partial.exists() else 0
                proc.send_signal(sig)
                try:
                    out, err = proc.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    C.kill_group(proc)
                    out, err = proc.communicate()
                    outcomes.append((C.HANG, f"{case}: the download ignored {sig.name} for 20 s"))
                text = err.decode("utf-8", "replace")
                if C.has_traceback(text):
                    outcomes.append((C.TRACEBACK, f"{case}: after {sig.name} at {have} bytes: {C.last_line(text)}"))
                done_at.append(f"{sig.name}@{have}")
                outcomes += check_dest(dest, "big.gguf", expected, None, f"{case} after {sig.name} at {have}")
            hub.slow_chunk_s = 0.0
            label = f"{case}: killed {', '.join(done_at)} of {size}, then resumed"
            res = C.run(download_cmd("chaos/big", "big.gguf", dest), TIMEOUT, env=env_for(hub.url))
            outcome = C.classify_cli(res, "resume")
            outcomes.append((outcome[0], f"{label}: {outcome[1]}"))
            if res.rc == 0 and not (dest / "big.gguf").exists():
                outcomes.append((C.OTHER, f"{label}: exit 0 without the file"))
            elif res.rc != 0 and outcome[0] == C.CLEAN:
                outcomes.append((C.OTHER, f"{label}: the resume failed: {outcome[1]}"))
            outcomes += check_dest(dest, "big.gguf", expected, res, label)
            ctx.tally.record(row, case, outcomes)
            print(f"  {label}: {[o for o, _ in outcomes]}", file=sys.stderr, flush=True)
            shutil.rmtree(dest, ignore_errors=True)


def concurrent(ctx: Any) -> None:
    """Two downloads of one file at once (the issue's item 1), with and without a partial file."""
    from tests.fake_hub import FakeHub

    row = "downloads: two at once"
    src = ctx.tmp / "hub" / "big.gguf"
    data = src.read_bytes() if src.exists() else random.Random(f"{ctx.seed}:blob").randbytes(12_000_000)
    if not src.exists():
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    with FakeHub({"chaos/big": {"big.gguf": src}}) as hub:
        hub.slow_chunk_s = 0.002
        for i in range(1 if ctx.quick else 5):
            case = f"downloads-twice-{i:02d}"
            if not ctx.wanted(case):
                continue
            rng = ctx.rng("dl-twice", i)
            dest = ctx.tmp / case
            dest.mkdir(parents=True)
            have = rng.choice([0, 6_000_000, rng.randrange(1, len(data))])
            if have:
                (dest / "big.gguf.partial").write_bytes(data[:have])
            gap = rng.choice([0.0, 0.05, 0.2, 0.5])
            label = f"{case}: two downloads {gap * 1000:.0f} ms apart, {have} bytes already there"
            procs = []
            for _ in range(2):
                procs.append(subprocess.Popen(download_cmd("chaos/big", "big.gguf", dest), env={
                    **os.environ, **env_for(hub.url)}, cwd=C.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True, preexec_fn=lambda: C.limit_memory(C.CLI_MEMORY)))
                time.sleep(gap)
            outcomes: list[tuple[str, str]] = []
            results = []
            for k, proc in enumerate(procs):
                try:
                    out, err = proc.communicate(timeout=TIMEOUT)
                    res = C.Result(proc.returncode, out.decode(), err.decode("utf-8", "replace"), False, 0)
                except subprocess.TimeoutExpired:
                    C.kill_group(proc)
                    out, err = proc.communicate()
                    res = C.Result(proc.returncode, out.decode(), err.decode("utf-8", "replace"), True, TIMEOUT)
                results.append(res)
                o = C.classify_cli(res, f"download {k + 1}")
                outcomes.append((o[0], f"{label}: {o[1]}"))
                outcomes += check_dest(dest, "big.gguf", expected, res, f"{label} (download {k + 1})")
            if not any(r.rc == 0 for r in results):
                res = C.run(download_cmd("chaos/big", "big.gguf", dest), TIMEOUT, env=env_for(hub.url))
                if res.rc != 0:
                    outcomes.append((C.OTHER, f"{label}: neither finished, and a third run failed: "
                                              f"{C.last_line(res.err)}"))
                outcomes += check_dest(dest, "big.gguf", expected, res, f"{label} (third run)")
            ctx.tally.record(row, case, outcomes)
            print(f"  {label}: {[o for o, _ in outcomes]}", file=sys.stderr, flush=True)
            shutil.rmtree(dest, ignore_errors=True)


HOSTILE = [
    # (mode, ETag kind, fraction of the file already in the .partial); see hostile_hub for the modes
    ("206-from-zero", "sha256", 0.3), ("206-from-zero", "git", 0.3), ("206-from-zero-lying", "sha256", 0.3),
    ("206-from-zero-short", "git", 0.3), ("206-from-zero-short", "sha256", 0.6),
    ("206-from-zero-short-lying", "sha256", 0.3),
    ("range-elsewhere", "sha256", 0.4), ("range-elsewhere", "git", 0.4), ("range-missing", "git", 0.5),
    ("range-wrong-total", "git", 0.5), ("range-garbage", "git", 0.5), ("ignore-range", "git", 0.5),
    ("truncated", "sha256", 0.0), ("truncated", "git", 0.2), ("stall", "git", 0.0), ("stall-headers", "sha256", 0.0),
    ("slow", "git", 0.0), ("redirect-cdn", "sha256", 0.0), ("redirect-cdn", "git", 0.25),
    ("redirect-loop", "sha256", 0.0), ("error-500", "sha256", 0.0), ("long-body", "git", 0.0),
    ("size-lie", "git", 0.0), ("wrong-sha256", "sha256", 0.0), ("garbage-length", "git", 0.0),
    ("missing-file", "sha256", 0.0), ("path-traversal", "sha256", 0.0), ("normal", "git", 0.0),
]


def hostile(ctx: Any) -> None:
    row = "downloads: hostile servers"
    plans = HOSTILE[::3] if ctx.quick else HOSTILE
    for i, (mode, etag, frac) in enumerate(HOSTILE):
        case = f"downloads-hostile-{i:02d}"
        if (mode, etag, frac) not in plans or not ctx.wanted(case):
            continue
        rng = ctx.rng("dl-hostile", i)
        data = rng.randbytes(2_000_000 + rng.randrange(100_000))
        name = "model-Q4_K_M.gguf"
        f = H.HostileFile(data, mode=mode, etag=etag)
        if mode == "truncated":
            f.cut_at = rng.randrange(1, len(data) // 2)
        if mode == "slow":
            f.slow_s = 0.01
        if mode == "size-lie":
            f.size_lie = rng.choice([-1000, 1000])
        token = TOKEN if mode == "redirect-cdn" else None
        hub = H.hub_for({name: f}, token=token)
        expected = f.sha256()
        dest = ctx.tmp / case
        dest.mkdir(parents=True)
        have = int(len(data) * frac)
        if have:
            (dest / f"{name}.partial").write_bytes(data[:have])
        label = f"{case}: {mode} ({etag} ETag, {have} bytes already there)"
        outcomes: list[tuple[str, str]] = []
        try:
            if mode == "wrong-sha256":  # the hub announces the sha256 of other bytes
                f.announce = hashlib.sha256(data[:-1] + bytes([data[-1] ^ 1])).hexdigest()
                expected = f.announce
            target = {"missing-file": "nothere.gguf", "path-traversal": "../../escape.gguf"}.get(mode, name)
            if mode in ("stall", "stall-headers"):
                proc = subprocess.Popen(download_cmd(H.REPO, target, dest), env={**os.environ, **env_for(hub.url)},
                                        cwd=C.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
                time.sleep(3.0)
                proc.send_signal(signal.SIGINT)  # the user gives up: Ctrl-C must end it cleanly
                try:
                    out, err = proc.communicate(timeout=15)
                    res = C.Result(proc.returncode, out.decode(), err.decode("utf-8", "replace"), False, 3)
                except subprocess.TimeoutExpired:
                    C.kill_group(proc)
                    out, err = proc.communicate()
                    res = C.Result(proc.returncode, out.decode(), err.decode("utf-8", "replace"), True, 18)
                o = C.classify_cli(res, "Ctrl-C on a stalled server")
                outcomes.append((o[0], f"{label}: {o[1]}"))
                outcomes += check_dest(dest, name, expected, res, label)
                f.mode = "normal"  # the server recovers: the resume must finish
            res = C.run(download_cmd(H.REPO, target, dest), TIMEOUT, env=env_for(hub.url, token))
            o = C.classify_cli(res, mode)
            outcomes.append((o[0], f"{label}: {o[1]}"))
            outcomes += check_dest(dest, name, expected, res, label)
            if mode == "path-traversal" and (ctx.tmp / "escape.gguf").exists():
                outcomes.append((C.OTHER, f"{label}: a file was written outside the models folder"))
            if mode == "redirect-cdn":
                leaked = [a for a in hub.cdn_auth if a and TOKEN in a]
                if leaked:
                    outcomes.append((C.OTHER, f"{label}: the hub token was sent to the CDN host "
                                              f"({len(leaked)} of {len(hub.cdn_auth)} requests)"))
                if not hub.cdn_auth:
                    outcomes.append((C.OTHER, f"{label}: the CDN was never asked"))
            if mode in ("truncated", "slow", "normal", "ignore-range") and res.rc != 0:
                # the next run against a well-behaved server must finish the file
                f.mode = "normal"
                res2 = C.run(download_cmd(H.REPO, target, dest), TIMEOUT, env=env_for(hub.url, token))
                o = C.classify_cli(res2, "resume")
                if res2.rc != 0:
                    outcomes.append((C.OTHER, f"{label}: the resume failed: {o[1]}"))
                outcomes += check_dest(dest, name, expected, res2, f"{label} (resume)")
        finally:
            hub.close()
        ctx.tally.record(row, case, outcomes)
        print(f"  {label}: {[(o, d[-90:]) for o, d in outcomes]}", file=sys.stderr, flush=True)
        shutil.rmtree(dest, ignore_errors=True)
