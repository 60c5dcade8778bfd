"""Prompts with images, decoded plainly: a projector for the loaded model, image parts of chat
messages turned into the projector's markers, the prompt's chunks decoded into the target
(text rows by the engine's own batch, image rows by mtmd), and plain decoding after them.

Positions are not token counts here. An image takes one KV cell per
embedding row but, on an M-RoPE target (Qwen3.5 / 3.6), advances the position
by only max(rows, columns) of its grid, so the first generated token sits at
``ImagePrefill.n_pos`` while the context holds ``n_cells`` rows; room left in
the context is counted in cells. Every text token is still one cell and one
position.

MTP after an image: the MTP context catches up on every piece the target
decodes, image rows included, at the target's own positions
(engine/speculative/mtp_images.py says how, and what llama.cpp does instead).
Only MTP drafts after an image; other speculative modes decode plainly and
say so (``MTP_OFF_WITH_IMAGES``).

The prefix cache does not describe image rows: a prompt with images starts
from an empty context and leaves it marked unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ContextError, ImageError
from engine.generation import chat_template
from engine.generation.detokenizer import Detokenizer
from engine.generation.image_sources import IMAGE_PART_TYPES, MAX_IMAGE_BYTES, image_source, read_image  # noqa: F401
from engine.generation.session import Session
from engine.generation.stops import StopMatcher
from engine.runtime import Batch, Context, Sampler, SamplingParams
from engine.runtime.mtmd import IMAGE, Projector, PromptChunks
from engine.speculative.mtp_images import ImageCatchUp

MTP_OFF_WITH_IMAGES = ("Only the MTP head drafts after an image for now: this reply to images is decoded "
                       "plainly (n-gram drafting does not yet count an image's positions; issue 28).")
def load_projector(session: Session, path: str | Path) -> Projector:
    """The projector at ``path``, loaded against the session's model (its threads; on the GPU when the
    model's layers are there).

    Raises:
        ProjectorError: the file does not load, or does not fit the model (llama.cpp's words).
    """
    return Projector(path, session.model, n_threads=session.options.n_threads,
                     use_gpu=session.options.n_gpu_layers != 0)


def split_image_parts(messages: Sequence[dict[str, Any]], marker: str,
                      image_bytes: Callable[[dict[str, Any]], bytes]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Messages whose list contents are flattened to text, each image part replaced by ``marker``
    (where the projector's rows go), and the images in prompt order.

    ``image_bytes`` turns one image part into the encoded file (a data URL decoded, a local file
    read); the caller decides what it accepts. This is llama-server's rendering: the chat
    template sees text with markers, and mtmd wraps each image in the model's own tokens
    (``<|vision_start|>`` … ``<|vision_end|>`` for Qwen).
    """
    out: list[dict[str, Any]] = []
    images: list[bytes] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(dict(message))
            continue
        text: list[str] = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in IMAGE_PART_TYPES:
                images.append(image_bytes(part))
                text.append(marker)
            elif kind in ("text", "input_text", "output_text"):
                text.append(str(part.get("text", "")))
            else:
                raise ImageError(f"a message content part of type {kind!r} is neither text nor an image")
        out.append({**message, "content": "".join(text)})
    return out, images


@dataclass
class ImagePrefill:
    """What decoding a prompt with images left in the target context.

    Attributes:
        n_pos: the position of the first generated token.
        n_cells: KV cells the prompt takes (text tokens plus image rows).
        text_tokens: the prompt's text tokens, in order (a sampler's history of the prompt).
        last_row: the batch row of the prompt's last token (its logits give the first reply token).
        cancelled: ``should_stop`` said so between chunks.
    """

    n_pos: int = 0
    n_cells: int = 0
    text_tokens: list[int] = field(default_factory=list)
    last_row: int = -1
    cancelled: bool = False


def prefill(target: Context, prompt: PromptChunks, batch: Batch,
            on_prefill: Callable[[int, int], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False, mtp: ImageCatchUp | None = None,
            seq: int | None = None) -> ImagePrefill:
    """Decode ``prompt`` into an emptied ``target``: text chunks in pieces of ``n_batch`` at consecutive
    positions, image chunks through the projector at the positions mtmd lays out (every piece of a
    :class:`PromptReader` in one go).

    Raises:
        ContextError: the prompt does not fit the context, or ends with an image (no logits to sample).
        ProjectorError: an image failed to encode or decode.
    """
    reader = PromptReader(target, prompt, batch, on_prefill, should_stop, mtp, seq)
    while not reader.step():
        pass
    return reader.out


class PromptReader:
    """Decodes a prompt with images one piece a :meth:`step`: a text piece of up to ``n_batch`` tokens, an
    image's encode, or its decode. A multi-sequence engine runs the other sequences' steps between the
    pieces, so a prompt with images pauses running replies for one piece at a time, not for the whole prompt
    (engine/generation/parallel.py); alone, :func:`prefill` reads every piece at once.

    ``seq``: the sequence of a multi-sequence context to decode into (only it is emptied; the others'
    cells stay); None: the whole context is emptied and the prompt goes to sequence 0.

    ``mtp``: the MTP context catches up on every piece the target decodes, text rows as in a text
    prefill, image rows as ``mtp.mode`` says (engine/speculative/mtp_images.py).

    The target's logits after the last piece are the first reply token's: sample them before anything
    else decodes.

    Raises:
        ContextError: the prompt does not fit the context, or ends with an image (no logits to sample).
    """

    def __init__(self, target: Context, prompt: PromptChunks, batch: Batch,
                 on_prefill: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] = lambda: False, mtp: ImageCatchUp | None = None,
                 seq: int | None = None) -> None:
        if prompt.n_tokens + 1 >= target.n_ctx:
            raise ContextError(f"The prompt has {prompt.n_tokens} tokens with its images' rows; the context "
                               f"holds {target.n_ctx}. Send fewer or smaller images, or raise the context size.")
        if not prompt.chunks or prompt.chunks[-1].kind == IMAGE:
            raise ContextError("A prompt must end with text after its last image; the reply starts from it.")
        if seq is None:
            target.clear()
            seq = 0
        else:
            target.seq_clear(seq)
        self.target, self.prompt, self.batch, self.mtp, self.seq = target, prompt, batch, mtp, seq
        self.on_prefill, self.should_stop = on_prefill, should_stop
        self.out = ImagePrefill()
        if on_prefill is not None:
            on_prefill(0, prompt.n_tokens)
        self._pieces = self._read()

    def step(self) -> bool:
        """Decode the next piece; whether the prompt is now read (or was cancelled: ``out.cancelled``).

        Raises:
            ProjectorError: an image failed to encode or decode.
        """
        return next(self._pieces, _READ) is _READ

    def _read(self) -> Iterator[None]:
        """The pieces in order; it stops between them (a ``yield``), never after the last."""
        out, target, batch, seq = self.out, self.target, self.batch, self.seq
        last_chunk = len(self.prompt.chunks) - 1
        first = True
        for i, chunk in enumerate(self.prompt.chunks):
            if chunk.kind == IMAGE:
                if not first:
                    yield
                first = False
                rows = self.prompt.encode_image(i)
                yield  # the encode and the decode are about half the image's time each: a step between them
                out.n_pos = self.prompt.decode_image(i, target, out.n_pos,
                                                     self.mtp.rows if self.mtp is not None else None, seq, rows)
            else:
                for start in range(0, len(chunk.tokens), target.n_batch):
                    if not first:
                        yield
                    first = False
                    piece = chunk.tokens[start:start + target.n_batch]
                    batch.clear()
                    for k, tok in enumerate(piece):
                        last = i == last_chunk and start + k == len(chunk.tokens) - 1
                        batch.add(tok, out.n_pos + k, last, seq)
                    target.decode(batch)
                    if self.mtp is not None:
                        self.mtp.drafter.process(piece, out.n_pos)
                    out.n_pos += len(piece)
                out.text_tokens.extend(chunk.tokens)
            out.n_cells += chunk.n_tokens
            if self.on_prefill is not None:
                self.on_prefill(out.n_cells, self.prompt.n_tokens)
            if self.should_stop():
                out.cancelled = True
                return
        out.last_row = batch.n - 1


_READ = object()  # PromptReader.step's sign that no piece is left


@dataclass
class PlainResult:
    text: str
    tokens: list[int]
    finish_reason: str  # stop | length | cancelled
    prompt: ImagePrefill
    seconds: float


def generate_plain(session: Session, projector: Projector, text: str, images: Sequence[bytes], *,
                   max_tokens: int = 64, sampling: SamplingParams | None = None, stop: Sequence[str] = (),
                   add_special: bool = True,
                   on_text: Callable[[str], None] | None = None,
                   should_stop: Callable[[], bool] = lambda: False) -> PlainResult:
    """Decode ``text`` (one projector marker per image) and ``images``, then generate plainly: one token
    per decode at consecutive positions after the prompt's last, with the request's sampler.
    ``add_special``: let the vocabulary add its BOS (False when the text, a rendered template, has it).

    Raises:
        ImageError, ProjectorError, ContextError: see :meth:`Projector.tokenize` and :func:`prefill`.
    """
    t0 = time.perf_counter()
    session.save_conversation()  # kept in host memory: the text conversation is taken up again without prefill
    session.prepare(mtp=False, drafts=False)
    target, model = session.target, session.model
    session.prefix.forget()  # the cache cannot describe image rows
    sampler = Sampler(sampling or SamplingParams(), model.n_vocab, target.n_ctx, vocab=model.vocab)
    batch = Batch(target.n_batch)
    detok, stops = Detokenizer(model.piece), StopMatcher(tuple(stop))
    tokens: list[int] = []
    shown: list[str] = []
    finish: str | None = None

    def show(piece: str) -> None:
        if piece:
            shown.append(piece)
            if on_text is not None:
                on_text(piece)

    try:
        with projector.tokenize(text, images, add_special=add_special) as prompt:
            done = prefill(target, prompt, batch, should_stop=should_stop)
        if done.cancelled:
            finish = "cancelled"
        sampler.accept_prompt(done.text_tokens)
        pos, cells, row = done.n_pos, done.n_cells, done.last_row
        while finish is None:
            if len(tokens) >= max_tokens:
                finish = "length"
                break
            if cells + 1 >= target.n_ctx:
                finish = "length"
                break
            token = sampler.sample(target.handle, row)
            if model.is_eog(token):
                finish = "stop"
                break
            tokens.append(token)
            show(stops.feed(detok.push(token)))
            if stops.matched is not None:
                finish = "stop"
                break
            if should_stop():
                finish = "cancelled"
                break
            batch.clear()
            batch.add(token, pos, True)
            target.decode(batch)
            pos, cells, row = pos + 1, cells + 1, 0
    except BaseException:
        session.prefix.forget()
        raise
    finally:
        sampler.close()
    show(stops.feed(detok.flush()) + stops.flush())
    return PlainResult("".join(shown), tokens, finish or "stop", done, time.perf_counter() - t0)


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt rendered for the projector: text with one marker per image, and the images in order."""

    text: str
    images: tuple[bytes, ...]
    add_special: bool  # the vocabulary may add BOS (the rendered text does not start with it)
    mode: str  # chat_template.TEMPLATE or COMPLETION
    opens_thinking: bool


def render(session: Session, projector: Projector, *, messages: Sequence[dict[str, Any]] | None = None,
           prompt: str | None = None, images: Sequence[bytes] = (), template: str | None = None,
           tools: Sequence[dict[str, Any]] | None = None, template_kwargs: dict[str, Any] | None = None,
           allow_files: bool = False, continue_final_message: bool = False,
           max_chars: int = chat_template.MAX_CHARS,
           should_stop: Callable[[], bool] = lambda: False) -> ImagePrompt:
    """The prompt of a request with images, as the projector tokenizes it.

    Chat messages: image parts become markers (:func:`split_image_parts`, images read by
    :func:`read_image`) and the chat template renders the text around them. A completion prompt
    carries its markers itself, with ``images`` one per marker; ``images`` given with messages come
    after the messages' own.
    """
    model = session.model
    if messages is None:
        return ImagePrompt(prompt or "", tuple(images), True, chat_template.COMPLETION, False)
    flat, found = split_image_parts(messages, projector.marker,
                                    lambda part: read_image(image_source(part), allow_files=allow_files))
    rendered = chat_template.render(
        flat, template or session.facts.chat_template,
        bos_token=model.token_text(model.bos) if model.add_bos else "", eos_token=model.token_text(model.eos),
        tools=list(tools) if tools else None, extra=template_kwargs,
        continue_final_message=continue_final_message, max_chars=max_chars, should_stop=should_stop)
    return ImagePrompt(rendered.text, (*found, *images), not rendered.has_bos, rendered.mode,
                       rendered.opens_thinking)


NO_PROJECTOR = ("This model has no vision projector loaded, so it cannot take images. Load it with its "
                "mmproj-*.gguf (from the model's repository) to send images.")


def render_request(session: Session, request: Any, should_stop: Callable[[], bool] = lambda: False,
                   max_chars: int = chat_template.MAX_CHARS) -> ImagePrompt:
    """A ``GenerateRequest`` with images rendered for the session's projector (the generator's prefill
    tokenizes and decodes it).

    Raises:
        ImageError: no projector is loaded, or an image is refused.
        TemplateError, chat_template.RenderCancelled: as the chat template renders.
    """
    projector = session.projector
    if projector is None:
        raise ImageError(NO_PROJECTOR)
    return render(session, projector, messages=request.messages, prompt=request.prompt,
                  images=getattr(request, "images", ()), template=request.template, tools=request.tools,
                  template_kwargs=request.template_kwargs, continue_final_message=request.continue_final_message,
                  max_chars=max_chars, should_stop=should_stop)


def has_images(request: Any) -> bool:
    """Does a generate request carry images (its ``images``, or image parts in its messages)?"""
    if getattr(request, "images", ()):
        return True
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES
                                                           for p in m["content"])
               for m in (request.messages or ()))
