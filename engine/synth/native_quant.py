"""K-quant synthetic models, quantized by llama.cpp's own quantizer.

``gguf.quants`` (numpy) has no K-quant quantizer, and users run K-quants
(Q4_K_M above all), whose dequantizing kernels weigh a verify batch
differently from Q4_0's. So the writer writes the f16 file and
``llama_model_quantize`` turns it into Q4_K_M, exactly as ``llama-quantize``
would: its per-tensor choices (Q6_K for ``output`` and some ``attn_v`` /
``ffn_down``, fallbacks for rows that do not split into 256-blocks, norms
and routers untouched) are the ones users' files have. llama.cpp loads the
MTP blocks (``load_mtp``) and quantizes ``blk.<n>.nextn.*`` like any other
block's tensors.

The quantizer runs in a child process (``python -m engine.synth.native_quant
IN OUT TYPE``): llama.cpp aborts the whole process on what it cannot handle,
and that must reach the caller as an exception with llama.cpp's own message.
The child writes beside the final file and the caller renames, so a killed
run leaves no half-written model under the final name.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

from engine.runtime import native

# weight type of a synthetic size -> llama_ftype constant name in llama_cpp
FTYPES = {
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
}
QUANTIZE_TIMEOUT_S = 600  # the bench size takes tens of seconds on two cores


class NativeQuantError(RuntimeError):
    """llama.cpp's quantizer failed; the message holds its exit status and last log lines."""


def quantize(src: Path, dst: Path, dtype: str) -> None:
    """Quantize the GGUF ``src`` (f16/f32) to ``dst`` as ``dtype`` (a key of FTYPES), in a child process.

    ``dst`` appears only when the quantizer succeeded (written as ``<dst>.partial``, then renamed).
    """
    if dtype not in FTYPES:
        raise ValueError(f"unknown native quantization {dtype!r}; expected one of {sorted(FTYPES)}")
    partial = dst.with_name(dst.name + ".partial")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GGML_NO_BACKTRACE"] = "1"  # an abort's message, not a debugger's stack dump
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "engine.synth.native_quant", str(src), str(partial), dtype],
            capture_output=True, text=True, timeout=QUANTIZE_TIMEOUT_S, env=env, cwd=root,
        )
        if proc.returncode != 0 or not partial.exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            telling = [line for line in lines if re.search(r"GGML_ASSERT|error|failed|what\(\)", line, re.I)]
            tail = "\n".join((telling or lines)[-6:])
            raise NativeQuantError(
                f"llama.cpp could not quantize {src.name} to {dtype} (exit {proc.returncode}):\n{tail}\n"
                f"(the whole log: python -m engine.synth.native_quant IN OUT {dtype})")
        os.replace(partial, dst)
    except subprocess.TimeoutExpired as exc:
        raise NativeQuantError(f"llama.cpp's quantizer took over {QUANTIZE_TIMEOUT_S} s on {src.name}") from exc
    finally:
        partial.unlink(missing_ok=True)


# -- the child ---------------------------------------------------------------
def _quantize_here(src: str, dst: str, dtype: str) -> None:
    llama = native.llama()
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, FTYPES[dtype])
    params.nthread = min(2, os.cpu_count() or 1)  # the test and bench machines share two cores
    status = llama.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if status != 0:
        reason = native.recent_log(4, contains="quantiz")
        raise NativeQuantError("; ".join(reason) or f"llama_model_quantize returned {status}")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m engine.synth.native_quant IN OUT TYPE", file=sys.stderr)
        return 2
    src, dst, dtype = argv
    try:
        _quantize_here(src, dst, dtype)
    except (NativeQuantError, KeyError, AttributeError) as exc:  # unknown type, or no such ftype in this engine
        print(f"quantize failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
