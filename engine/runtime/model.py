"""A loaded llama.cpp model and its vocabulary, owning the native handle."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.gguf.facts import windowed
from engine.runtime import native


class Model:
    """A ``llama_model*`` with its vocabulary.

    Call :meth:`close` (or use it as a context manager) to free it; contexts
    made from it must be closed first.
    """

    def __init__(self, path: str | Path, *, n_gpu_layers: int = 0, load_mtp: bool = False,
                 devices: Any = None, tensor_split: list[float] | None = None, main_device: int | None = None) -> None:
        """``devices``: a NULL-terminated device array (``engine/runtime/rpc.py``) to use
        instead of llama.cpp's default choice; ``tensor_split``: each device's share of the
        layers; ``main_device``: put the whole model on that one device (split mode none)."""
        lib = native.llama()
        self._lib = lib
        self.path = Path(path)
        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.load_mtp = load_mtp
        self._native_args: tuple[Any, ...] = ()  # kept alive for as long as the model
        if devices is not None:
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
            self._native_args += (devices,)
        if tensor_split:
            split = (ctypes.c_float * max(int(lib.llama_max_devices()), len(tensor_split)))(*tensor_split)
            params.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
            self._native_args += (split,)
        if main_device is not None:
            params.split_mode = lib.LLAMA_SPLIT_MODE_NONE
            params.main_gpu = main_device
        handle = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            detail = "; ".join(native.recent_log(3)) or "no message from llama.cpp"
            raise ModelLoadError(f"llama.cpp could not load {self.path.name}: {detail}")
        self.handle = handle
        self.load_mtp = load_mtp
        self.vocab = lib.llama_model_get_vocab(handle)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(lib.llama_model_n_embd(handle))
        self.n_embd_out = int(lib.llama_model_n_embd_out(handle))
        self.n_layer = int(lib.llama_model_n_layer(handle))
        self.n_layer_nextn = int(lib.llama_model_n_layer_nextn(handle))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(handle))
        # sliding-window attention's window (0: none)
        self.n_swa = windowed(int(lib.llama_model_n_swa(handle)), self.meta("general.architecture"), self.n_layer)
        self.is_hybrid = bool(lib.llama_model_is_hybrid(handle))
        self.is_recurrent = bool(lib.llama_model_is_recurrent(handle))
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self.vocab))
        self._piece_buf = ctypes.create_string_buffer(256)

    # -- metadata ---------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = self._lib.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._lib.llama_model_desc(self.handle, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def facts(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "description": self.description(),
            "architecture": self.meta("general.architecture") or "",
            "n_params": int(self._lib.llama_model_n_params(self.handle)),
            "size_bytes": int(self._lib.llama_model_size(self.handle)),
            "n_vocab": self.n_vocab,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_layer_nextn": self.n_layer_nextn,
            "n_ctx_train": self.n_ctx_train,
            "hybrid": self.is_hybrid,
        }

    # -- vocabulary -------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        arr = (ctypes.c_int32 * n_max)()
        n = self._lib.llama_tokenize(self.vocab, data, len(data), arr, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            arr = (ctypes.c_int32 * n_max)()
            n = self._lib.llama_tokenize(self.vocab, data, len(data), arr, n_max, add_special, parse_special)
        return list(arr[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character)."""
        buf = self._piece_buf
        n = self._lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> str:
        raw = self._lib.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    @property
    def bos(self) -> int:
        return int(self._lib.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(self._lib.llama_vocab_eos(self.vocab))

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "handle", None):
            self._lib.llama_model_free(self.handle)
            self.handle = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
