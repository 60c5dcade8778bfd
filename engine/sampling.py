"""Sampling settings: the one type the protocol, the generator and the
sampler chain pass, checked when made so a bad value never reaches llama.cpp.

No llama.cpp here: the protocol module (which the app imports) checks a
request's values with this type, and the worker builds the native chain from
it (``engine.runtime.sampler``).

Names and meanings follow llama.cpp's server API and ``common_params_sampling``
(``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``,
``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``, ``seed``),
because users bring their values from there.

The penalties' history: as ``llama-cli`` and ``llama-server`` do (they pass
every prompt token through ``common_sampler_accept`` before the first
sample), the last ``repeat_last_n`` tokens of *prompt and reply together*
are penalised. A reply therefore does not simply repeat the end of its
prompt, and the first reply token is already penalised like the hundredth.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace

RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a fresh seed per generation
MAX_SEED = 0xFFFFFFFF
WHOLE_CONTEXT = -1  # repeat_last_n -1: the whole context, as in llama.cpp


def _number(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}, not {value!r}")


def _integer(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, not {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next token is chosen. ``temperature <= 0`` is greedy
    (argmax after the penalties); the defaults are plain greedy decoding, with
    every penalty off, which the exactness tests and benchmarks rely on.

    Attributes:
        temperature: 0 greedy; higher is more random (0..5).
        top_k: keep the k most likely tokens (0: all).
        top_p: keep the most likely tokens whose probabilities add up to p (1: all).
        min_p: drop tokens less likely than min_p × the top token's probability (0: none).
        repeat_penalty: divide the logit of a token seen in the history (1: off).
        repeat_last_n: how many recent tokens (prompt and reply) the penalties
            look at; 0 turns them off, -1 is the whole context.
        presence_penalty: subtract this from a seen token's logit once (0: off).
        frequency_penalty: subtract this × the times it was seen (0: off).
        seed: the random generator's seed; ``RANDOM_SEED`` picks a new one each time.

    Raises:
        ValueError: a value out of range (the protocol turns it into a
            ``protocol`` error naming the field).
    """

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = RANDOM_SEED
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        _number("temperature", self.temperature, 0.0, 5.0)
        _integer("top_k", self.top_k, 0, 1 << 24)
        _number("top_p", self.top_p, 0.0, 1.0)
        _number("min_p", self.min_p, 0.0, 1.0)
        _integer("seed", self.seed, 0, MAX_SEED)
        _number("repeat_penalty", self.repeat_penalty, 0.01, 10.0)
        _integer("repeat_last_n", self.repeat_last_n, WHOLE_CONTEXT, 1 << 24)
        _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalised(self) -> bool:
        """Does any penalty change a logit? (Then the chain keeps a history.)"""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)

    def history_length(self, n_ctx: int) -> int:
        """Tokens the penalties remember in a context of ``n_ctx`` tokens (0 when they are off)."""
        if not self.penalised:
            return 0
        return n_ctx if self.repeat_last_n == WHOLE_CONTEXT else self.repeat_last_n


GREEDY = SamplingParams()  # the defaults: plain greedy decoding, every penalty off

# Presets the app offers (its labels and tooltips live in app/reply_fields.py).
# Each keeps a light repetition penalty over the last 256 tokens: without one,
# small models (the built-in Gemma 3 270M among them) repeat a paragraph word
# for word until the token limit, greedy or not; over llama.cpp's default 64
# tokens, a repeated block of five list items (~70 tokens) still slips through.
# Measured on the built-in model, "What are three uses of copper?", 300 tokens,
# seeds 1-6, most repeats of any 12-token run: window 64 → [2, 2, 1, 3, 2, 1];
# 256 → [1, 3, 1, 1, 1, 1]; 256 with presence penalty 0.3 → all 1.
_WINDOW = 256
PRECISE = SamplingParams(temperature=0.0, repeat_penalty=1.1, repeat_last_n=_WINDOW)  # greedy: the same reply
BALANCED = SamplingParams(temperature=0.6, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                          repeat_last_n=_WINDOW, presence_penalty=0.3)
CREATIVE = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.05, repeat_penalty=1.1,
                          repeat_last_n=_WINDOW, presence_penalty=0.3)
PRESETS = {"precise": PRECISE, "balanced": BALANCED, "creative": CREATIVE}
DEFAULT_PRESET = "balanced"


GREEDY_KEY = "greedy"
CUSTOM_PREFIX = "custom-"


def sampling_key(params: SamplingParams) -> str:
    """What autotune profiles are keyed by: ``greedy`` (plain greedy decoding),
    a :data:`PRESETS` name, or ``custom-<hash of the values>``. The seed is not
    part of it: two seeds of one preset accept drafts alike; nor, when greedy,
    the truncations (top-k, top-p, min-p keep the argmax)."""
    unseeded = replace(params, seed=RANDOM_SEED)
    if unseeded.greedy:
        unseeded = replace(unseeded, temperature=0.0, top_k=GREEDY.top_k, top_p=GREEDY.top_p, min_p=GREEDY.min_p)
    for name, preset in ((GREEDY_KEY, GREEDY), *PRESETS.items()):
        if unseeded == replace(preset, seed=RANDOM_SEED):
            return name
    values = json.dumps(asdict(unseeded), sort_keys=True)
    return CUSTOM_PREFIX + hashlib.sha256(values.encode()).hexdigest()[:8]


def sampling_label(key: str) -> str:
    """A key of :func:`sampling_key` in words: ``greedy``, ``balanced``, or ``custom`` for the rest."""
    return "custom" if key.startswith(CUSTOM_PREFIX) else key
