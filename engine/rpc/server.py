"""Finding and starting ggml's RPC server (``ggml-rpc-server``) on a machine that lends its devices.

The binary must speak the RPC protocol of the engine's own ggml, so it is
built from the same sdist and patches by ``packaging/build_reference_driver.py``
and cached beside the engine wheel. ``bootstrap.sh --test`` records its path
in the virtual environment; elsewhere it is built on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine.errors import RpcError

ENV_BINARY = "MTP_STUDIO_RPC_SERVER"  # a ggml-rpc-server to use instead of the cached one
RECORD_NAME = "mtp-studio-reference-driver.json"  # packaging/build_reference_driver.py writes it
ENGINE_RECORD_NAME = "mtp-studio-engine.json"
PACKAGING = Path(__file__).resolve().parents[2] / "packaging"

WARNING = (
    "WARNING: ggml RPC has no authentication and no encryption. Anyone who can reach this port can run "
    "computations on this machine's devices, read what is sent and fill its memory. Serve only on a trusted "
    "LAN or through an SSH tunnel (docs/multi-machine.md)."
)


def recorded_binary() -> Path | None:
    """The server ``bootstrap.sh --test`` recorded for this environment's engine, if any."""
    record = Path(sys.prefix) / RECORD_NAME
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    path = data.get("rpc_server")
    return Path(path) if path else None


def find_binary() -> Path:
    """``$MTP_STUDIO_RPC_SERVER``, else the recorded one, else the cached one (built now,
    printing the compiler's progress, when it is missing).

    Raises:
        RpcError: none found and it cannot be built here.
    """
    env = os.environ.get(ENV_BINARY)
    if env:
        if not Path(env).is_file():
            raise RpcError(f"${ENV_BINARY} names {env}, which does not exist")
        return Path(env)
    recorded = recorded_binary()
    if recorded is not None and recorded.is_file():
        return recorded
    script = PACKAGING / "build_reference_driver.py"
    if not script.exists():
        raise RpcError("ggml-rpc-server is not built and packaging/ is not next to the engine; "
                       f"set ${ENV_BINARY} to a ggml-rpc-server built from llama-cpp-python 0.3.36")
    print("rpc-server: looking for ggml-rpc-server (the first time it is built from the engine's source: "
          "several minutes)", file=sys.stderr, flush=True)
    # the build's log is echoed as it comes (the progress); the script's last stdout line is the binary's path
    proc = subprocess.Popen([sys.executable, str(script), "--print", "rpc-server"], stdout=subprocess.PIPE,
                            text=True, errors="replace")
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        last = line.strip() or last
    if proc.wait() != 0 or not last or not Path(last).is_file():
        raise RpcError("building ggml-rpc-server failed; see the log above")
    return Path(last)


def command(binary: Path, *, host: str, port: int, devices: str | None = None, threads: int | None = None,
            cache: bool = False) -> list[str]:
    cmd = [str(binary), "--host", host, "--port", str(port)]
    if devices:
        cmd += ["--device", devices]
    if threads:
        cmd += ["--threads", str(threads)]
    if cache:
        cmd.append("--cache")
    return cmd


def environment(cache_dir: str | None) -> dict[str, str]:
    """The server's cache (``--cache``) lives under ``$LLAMA_CACHE``/rpc."""
    env = dict(os.environ)
    if cache_dir:
        env["LLAMA_CACHE"] = str(Path(cache_dir).expanduser())
    return env
