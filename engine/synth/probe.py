"""Ask llama.cpp which tensors an architecture loads, instead of hand-writing them.

``llama_model_init_from_user(metadata, set_tensor_data, ...)`` builds a model
from GGUF metadata alone. With no file behind it, the loader creates every
tensor the architecture asks for (required ones, optional ones whose
dimensions are valid, and the MTP blocks when ``load_mtp`` is set) and calls
``set_tensor_data`` once per tensor. Recording name, type and shape there
gives the tensor list of a file this very engine loads.

The probe runs in a child process (``python -m engine.synth.probe``): llama.cpp
aborts the whole process on metadata it cannot build (``GGML_ASSERT``), and
that must reach the caller as an exception carrying llama.cpp's own message.
Results are cached as JSON under ``<cache>/synth/probe/``, keyed by the
metadata file's bytes and the engine build, since a rebuilt engine may ask
for other tensors.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import paths
from engine.runtime import native
from engine.synth.kv import add_arch_keys, add_vocabulary
from engine.synth.tokenizer import Vocabulary

GGML_TYPES = {0: "f32", 1: "f16"}  # the only types the loader creates without a file
PROBE_TIMEOUT_S = 120


class ProbeError(RuntimeError):
    """llama.cpp could not build the architecture from the given metadata."""


@dataclass(frozen=True)
class ProbedTensor:
    name: str
    ggml_type: int  # ggml_type: 0 = F32, 1 = F16
    ne: tuple[int, ...]  # ggml order, 4 entries

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: ``ne`` reversed, trailing 1s of ``ne`` dropped (at least one dim)."""
        ne = list(self.ne)
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        return tuple(reversed(ne))


@dataclass(frozen=True)
class ProbeResult:
    tensors: tuple[ProbedTensor, ...]
    n_layer: int
    n_layer_nextn: int
    n_embd_out: int

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


def probe_dir() -> Path:
    path = paths.cache_dir() / "synth" / "probe"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_metadata_gguf(path: Path, arch: str, keys: dict[str, Any], vocab: Vocabulary) -> None:
    """A GGUF with keys and tokenizer but no tensors: the probe's input."""
    import gguf

    writer = gguf.GGUFWriter(path, arch)
    add_arch_keys(writer, arch, keys)
    add_vocabulary(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def probe(arch: str, keys: dict[str, Any], vocab: Vocabulary) -> ProbeResult:
    """The tensors llama.cpp creates for ``arch`` with ``keys`` (cached per engine build).

    Raises:
        ProbeError: llama.cpp refused or aborted; the message holds its last log lines.
    """
    with tempfile.TemporaryDirectory(dir=probe_dir()) as tmp:
        meta = Path(tmp) / "metadata.gguf"
        write_metadata_gguf(meta, arch, keys, vocab)
        blob = meta.read_bytes() + json.dumps(native.build_info(), sort_keys=True).encode()
        cached = probe_dir() / f"{arch}-{hashlib.sha256(blob).hexdigest()[:16]}.json"
        if not cached.exists():
            out = Path(tmp) / "probe.json"
            _run_child(arch, meta, out)
            os.replace(out, cached)
    data = json.loads(cached.read_text())
    return ProbeResult(
        tensors=tuple(ProbedTensor(t["name"], t["type"], tuple(t["ne"])) for t in data["tensors"]),
        n_layer=data["n_layer"], n_layer_nextn=data["n_layer_nextn"], n_embd_out=data["n_embd_out"],
    )


def _run_child(arch: str, meta: Path, out: Path) -> None:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GGML_NO_BACKTRACE"] = "1"  # an abort's message, not a debugger's stack dump
    proc = subprocess.run(
        [sys.executable, "-m", "engine.synth.probe", str(meta), str(out)],
        capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, cwd=root,
    )
    if proc.returncode != 0 or not out.exists():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        telling = [line for line in lines if re.search(r"GGML_ASSERT|error|failed|what\(\)", line)]
        tail = "\n".join((telling or lines)[-6:])
        raise ProbeError(f"llama.cpp cannot build {arch} from this metadata (exit {proc.returncode}):\n{tail}")


# -- the child ---------------------------------------------------------------
class _GGUFInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def _ggml_base(llama: Any) -> ctypes.CDLL:
    """libggml-base from the engine's own library folder (gguf_* and ggml_get_name live there)."""
    lib_dir = Path(llama.__file__).resolve().parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            break
    else:
        raise ProbeError(f"libggml-base not found in {lib_dir}")
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GGUFInitParams]
    lib.gguf_free.restype = None
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    return lib


def _probe_here(meta: str) -> dict[str, Any]:
    """Build the model from metadata in this process; record every tensor the loader creates."""
    llama = native.llama()
    base = _ggml_base(llama)
    ctx = base.gguf_init_from_file(meta.encode(), _GGUFInitParams(True, None))
    if not ctx:
        raise ProbeError(f"gguf_init_from_file failed on {meta}")
    seen: dict[str, dict[str, Any]] = {}

    def record(tensor: int, _user: Any) -> None:
        # struct ggml_tensor: int32 type at offset 0, buffer pointer at 8, int64 ne[4] at 16
        name = base.ggml_get_name(tensor).decode()
        ggml_type = ctypes.c_int32.from_address(tensor).value
        ne = list((ctypes.c_int64 * 4).from_address(tensor + 16))
        seen.setdefault(name, {"name": name, "type": ggml_type, "ne": ne})

    callback = llama.llama_model_set_tensor_data_t(record)
    params = llama.llama_model_default_params()
    params.n_gpu_layers = 0
    params.load_mtp = True
    model = llama.llama_model_init_from_user(ctx, callback, None, params)
    try:
        if not model:
            reason = native.recent_log(2, contains="error")
            raise ProbeError("; ".join(reason) or "llama_model_init_from_user returned NULL")
        unknown = sorted(t["name"] for t in seen.values() if t["type"] not in GGML_TYPES)
        if unknown:
            raise ProbeError(f"tensors of a type the writer cannot produce: {unknown[:5]}")
        return {
            "tensors": list(seen.values()),
            "n_layer": int(llama.llama_model_n_layer(model)),
            "n_layer_nextn": int(llama.llama_model_n_layer_nextn(model)),
            "n_embd_out": int(llama.llama_model_n_embd_out(model)),
        }
    finally:
        if model:
            llama.llama_model_free(model)
        base.gguf_free(ctx)


def main(argv: list[str]) -> int:
    meta, out = argv
    try:
        result = _probe_here(meta)
    except ProbeError as exc:
        print(f"probe failed: {exc}", file=sys.stderr)
        return 1
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
