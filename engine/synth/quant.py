"""Weight types of synthetic models: f32, f16, Q8_0 / Q4_0, and the K-quants.

Users run quantized files, and a quantized verify batch costs differently
from an f16 one (the dequantizing kernels change the balance between memory
and arithmetic), which is what the adaptive depth policy's cost model and the
benchmark need to see. ``gguf.quants`` quantizes Q8_0 and Q4_0 in numpy;
it has no quantizer for the K-quants (Q4_K raises NotImplementedError in
gguf 0.x), so Q4_K_M, Q5_K_M and Q6_K (``NATIVE_TYPES``) are made by
llama.cpp's own quantizer from the f16 file (``engine/synth/native_quant.py``),
with llama.cpp's per-tensor type choices. ``gguf.quants`` does dequantize
every type those files hold, so oracle maps are recomputed from them too.

A matrix whose rows do not split into whole blocks stays f16, and vectors
stay f32, as llama.cpp's own quantizer leaves them.
"""

from __future__ import annotations

import numpy as np

FLOAT_TYPES = ("f32", "f16")
QUANT_TYPES = ("q8_0", "q4_0")
NATIVE_TYPES = ("q4_k_m", "q5_k_m", "q6_k")  # by llama.cpp's quantizer, from the f16 file
WEIGHT_TYPES = FLOAT_TYPES + QUANT_TYPES + NATIVE_TYPES


def written_as(dtype: str) -> str:
    """The type the Python writer writes for a size of weight type ``dtype`` (f16 for native quants)."""
    return "f16" if dtype in NATIVE_TYPES else dtype


def _qtype(dtype: str):  # -> gguf.GGMLQuantizationType
    import gguf

    return {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[dtype]


def quantizable(arr: np.ndarray, dtype: str) -> bool:
    """Will a matrix be stored as ``dtype`` (else f16)? Rows must split into whole blocks."""
    if dtype not in QUANT_TYPES:
        return False
    import gguf

    block, _ = gguf.GGML_QUANT_SIZES[_qtype(dtype)]
    return arr.ndim > 1 and arr.shape[-1] % block == 0


def encode(arr: np.ndarray, dtype: str) -> tuple[np.ndarray, object | None]:
    """A matrix as the writer stores it: (data, raw gguf type or None for a numpy float array)."""
    if dtype == "f32":
        return arr.astype(np.float32), None
    if quantizable(arr, dtype):
        from gguf import quants

        return quants.quantize(arr.astype(np.float32), _qtype(dtype)), _qtype(dtype)
    return arr.astype(np.float16), None


def stored(arr: np.ndarray, dtype: str) -> np.ndarray:
    """What the file really holds for a matrix, as float32 (oracle maps are recomputed from it).

    Not for NATIVE_TYPES: llama.cpp picks their per-tensor types, so the writer reads them back from the file.
    """
    if dtype in NATIVE_TYPES:
        raise ValueError(f"{dtype} weights are chosen by llama.cpp's quantizer: read them back from the file")
    if quantizable(arr, dtype):
        from gguf import quants

        qtype = _qtype(dtype)
        return quants.dequantize(quants.quantize(arr.astype(np.float32), qtype), qtype).astype(np.float32)
    return encode(arr, dtype)[0].astype(np.float32)
