"""Images through llama.cpp's ``mtmd``: a vision projector loaded against a model, a prompt
split into text and image chunks, and an image chunk encoded and decoded into a target context.

Why chunks: the projector turns one image into many embedding rows that take
KV cells like tokens but, on M-RoPE targets (Qwen3.5 / 3.6), far fewer
positions (an image of nx x ny merged patches advances the position by
max(nx, ny)). The prompt is therefore a list of text chunks (token ids, decoded
by the caller like any prompt) and image chunks (decoded here), and whoever
decodes them keeps positions apart from cells (``PromptChunks.n_pos`` against
``n_tokens``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ImageError, ProjectorError
from engine.runtime import native
from engine.runtime.context import Context
from engine.runtime.model import Model

TEXT = "text"
IMAGE = "image"
_KINDS = {0: TEXT, 1: IMAGE, 2: "audio"}
_log_callback: Any = None  # kept alive: mtmd holds the pointer
# on_rows(embd, positions): one decoded piece of an image, (n, n_embd) rows at (n_pos, n) positions
RowsCallback = Callable[[np.ndarray, np.ndarray], None]


def _mtmd() -> Any:
    """``llama_cpp.mtmd_cpp``, with mtmd's log routed like llama.cpp's (native.recent_log)."""
    global _log_callback
    lib = native.llama()
    from llama_cpp import mtmd_cpp

    if _log_callback is None:
        _log_callback = lib.llama_log_callback(native._on_native_log)
        mtmd_cpp.mtmd_helper_log_set(_log_callback, ctypes.c_void_p(0))
    return mtmd_cpp


@dataclass(frozen=True)
class Chunk:
    """One piece of a prompt: text tokens, or one image's embedding rows.

    Attributes:
        kind: "text" or "image".
        n_tokens: KV cells it takes (text tokens, or image embedding rows).
        n_pos: positions it advances (equal to n_tokens for text; fewer for an image on M-RoPE).
        tokens: the token ids of a text chunk (empty for an image).
    """

    kind: str
    n_tokens: int
    n_pos: int
    tokens: tuple[int, ...] = ()


class PromptChunks:
    """The chunks ``mtmd_tokenize`` made of one prompt; owns them until :meth:`close`."""

    def __init__(self, projector: Projector, handle: Any) -> None:
        self._mtmd = projector._mtmd
        self._projector = projector
        self.handle = handle
        self.chunks: list[Chunk] = []
        for i in range(self._mtmd.mtmd_input_chunks_size(handle)):
            chunk = self._mtmd.mtmd_input_chunks_get(handle, i)
            kind = _KINDS.get(self._mtmd.mtmd_input_chunk_get_type(chunk), "unknown")
            n_tokens = int(self._mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(self._mtmd.mtmd_input_chunk_get_n_pos(chunk))
            tokens: tuple[int, ...] = ()
            if kind == TEXT:
                n = ctypes.c_size_t(0)
                ptr = self._mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens = tuple(int(ptr[k]) for k in range(n.value))
            self.chunks.append(Chunk(kind, n_tokens, n_pos, tokens))

    @property
    def n_tokens(self) -> int:
        """KV cells the whole prompt takes."""
        return sum(c.n_tokens for c in self.chunks)

    @property
    def n_pos(self) -> int:
        """Positions the whole prompt advances (the first generated token's position)."""
        return sum(c.n_pos for c in self.chunks)

    @property
    def n_images(self) -> int:
        return sum(1 for c in self.chunks if c.kind == IMAGE)

    def text_tokens(self) -> list[int]:
        """Every text token, in order (what a sampler's history holds of this prompt)."""
        return [t for c in self.chunks for t in c.tokens]

    def encode_image(self, index: int) -> np.ndarray:
        """Encode image chunk ``index`` with the projector; its embedding rows, (n_tokens, the model's input
        width), a copy (the projector's own buffer is overwritten by its next encode).

        Apart from :meth:`decode_image` so that a multi-sequence engine can run the other sequences' step
        between an image's encode and its decode: each is about half of the image's time.

        Raises:
            ImageError: the chunk is not an image.
            ProjectorError: encoding failed (llama.cpp's words).
        """
        chunk = self._image_chunk(index)
        m, ctx = self._mtmd, self._projector.handle
        if m.mtmd_encode_chunk(ctx, chunk) != 0:
            raise ProjectorError(f"the projector could not encode the image: {_detail()}")
        width = int(native.llama().llama_model_n_embd_inp(self._projector.model.handle))
        rows = np.ctypeslib.as_array(m.mtmd_get_output_embd(ctx), shape=(self.chunks[index].n_tokens, width))
        return np.array(rows, dtype=np.float32, copy=True)

    def decode_image(self, index: int, target: Context, n_past: int, on_rows: RowsCallback | None = None,
                     seq: int = 0, embd: np.ndarray | None = None) -> int:
        """Decode image chunk ``index``'s rows into ``target``'s sequence ``seq`` from position ``n_past``
        (M-RoPE positions as mtmd lays them out); returns the next position. ``embd``: its rows from
        :meth:`encode_image`; None encodes it here first.

        ``on_rows(embd, positions)``: called after each decoded piece with its embedding rows
        (n, n_embd) and positions (n_pos, n), while the target's outputs still hold that piece
        (the MTP context catches up on image rows there).

        Raises:
            ImageError: the chunk is not an image.
            ProjectorError: encoding or decoding failed (llama.cpp's words).
        """
        if embd is None:
            embd = self.encode_image(index)
        chunk = self._image_chunk(index)
        if embd.shape[0] != self.chunks[index].n_tokens or embd.dtype != np.float32 or not embd.flags.c_contiguous:
            raise ImageError(f"image chunk {index} needs {self.chunks[index].n_tokens} contiguous float32 rows, "
                             f"not {embd.shape} {embd.dtype}")
        m, ctx = self._mtmd, self._projector.handle
        new_n_past = native.llama().llama_pos(0)
        failure: list[BaseException] = []

        def after_piece(view_ptr: Any, _user: Any) -> int:
            try:
                view = view_ptr.contents
                n, width, n_pos = view.n_tokens, view.n_embd, view.n_pos
                assert on_rows is not None
                on_rows(np.ctypeslib.as_array(view.embd, shape=(n, width)),
                        np.ctypeslib.as_array(view.pos, shape=(n_pos, n)))
                return 0
            except BaseException as exc:  # never unwind through C: say it after the helper returns
                failure.append(exc)
                return 1

        callback = m.mtmd_helper_post_decode_callback(after_piece) if on_rows is not None \
            else m.mtmd_helper_post_decode_callback()  # NULL: no callback
        rows = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = m.mtmd_helper_decode_image_chunk(ctx, target.handle, chunk, rows, n_past, seq,
                                              target.n_batch, ctypes.byref(new_n_past), callback, None)
        if failure:
            raise failure[0]
        target.edits += 1
        target.graphs += -(-self.chunks[index].n_tokens // target.n_ubatch)
        if rc != 0:
            raise ProjectorError(f"decoding the image's embeddings failed (code {rc}): {_detail()}")
        native.llama().llama_synchronize(target.handle)
        return int(new_n_past.value)

    def _image_chunk(self, index: int) -> Any:
        if self.chunks[index].kind != IMAGE:
            raise ImageError(f"prompt chunk {index} is {self.chunks[index].kind}, not an image")
        return self._mtmd.mtmd_input_chunks_get(self.handle, index)

    def close(self) -> None:
        if self.handle:
            self._mtmd.mtmd_input_chunks_free(self.handle)
            self.handle = None

    def __enter__(self) -> PromptChunks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Projector:
    """An ``mtmd_context``: a projector (``mmproj-*.gguf``) loaded against one loaded model.

    Close it before the model.
    """

    def __init__(self, path: str | Path, model: Model, *, n_threads: int = 1, use_gpu: bool = False) -> None:
        """Raises:
            ProjectorError: the file does not load, or its output width is not the model's embedding width.
        """
        self._mtmd = _mtmd()
        self.path = Path(path)
        if not self.path.is_file():
            raise ProjectorError(f"The projector {self.path} does not exist.")
        params = self._mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False  # a warm-up image of the projector's largest size costs seconds on a CPU
        handle = self._mtmd.mtmd_init_from_file(str(self.path).encode(), model.handle, params)
        if not handle:
            raise ProjectorError(f"llama.cpp could not load the projector {self.path.name} for "
                                 f"{model.path.name}: {_detail()}")
        self.handle = handle
        self.model = model
        self.marker = (self._mtmd.mtmd_default_marker() or b"<__media__>").decode()
        self.vision = bool(self._mtmd.mtmd_support_vision(handle))
        self.uses_mrope = bool(self._mtmd.mtmd_decode_use_mrope(handle))

    def tokenize(self, text: str, images: Sequence[bytes], *, add_special: bool = True) -> PromptChunks:
        """Split ``text`` at each image marker (:attr:`marker`) into text and image chunks.

        ``images``: encoded image files (PNG, JPEG, BMP, GIF, …), one per marker, in order.

        Raises:
            ImageError: an image does not decode, or markers and images do not pair up.
        """
        m = self._mtmd
        if text.count(self.marker) != len(images):
            raise ImageError(f"the prompt has {text.count(self.marker)} image markers for {len(images)} images; "
                             "each image needs one marker where it goes")
        bitmaps = [self._bitmap(data, i) for i, data in enumerate(images)]
        chunks = m.mtmd_input_chunks_init()
        try:
            raw = text.encode("utf-8")
            inp = m.mtmd_input_text(raw, len(raw), add_special, True)
            arr = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = m.mtmd_tokenize(self.handle, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise ImageError(f"the images could not be prepared for the projector (code {rc}): {_detail()}")
            out = PromptChunks(self, chunks)
            chunks = None
            return out
        finally:
            if chunks is not None:
                m.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                m.mtmd_bitmap_free(b)

    def _bitmap(self, data: bytes, index: int) -> Any:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = self._mtmd.mtmd_helper_bitmap_init_from_buf(self.handle, buf, len(data), False)
        if not bitmap:
            raise ImageError(f"image {index + 1} ({len(data):,} bytes) is not an image llama.cpp can read "
                             "(PNG, JPEG, BMP, GIF, TGA, PSD, HDR or PNM).")
        return bitmap

    def close(self) -> None:
        if getattr(self, "handle", None):
            self._mtmd.mtmd_free(self.handle)
            self.handle = None

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _detail() -> str:
    """llama.cpp's own words for the failure: its last error lines (mtmd logs its reason, then a hint)."""
    errors = native.recent_log(2, contains="error")
    words = [part.strip() for line in errors for part in line.split("error: ", 1)[-1].splitlines()]
    return "; ".join(w for w in words if w) or "no message from llama.cpp"
