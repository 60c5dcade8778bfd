"""Synthetic GGUF models of the real MTP architectures, for tests and benchmarks.

``SynthModel(SynthSpec(...)).path(layout)`` generates (once, cached by the
spec's key) and returns a file; ``simulate`` predicts oracle acceptance.
Four architectures have hand-written tensor lists (``archs``); the others'
come from llama.cpp's own loader (``derived``, ``probe``).
"""

from engine.synth.oracle import OracleMaps, simulate
from engine.synth.spec import HeadMap, SynthSpec
from engine.synth.writer import LAYOUTS, SynthModel

__all__ = ["LAYOUTS", "HeadMap", "OracleMaps", "SynthModel", "SynthSpec", "simulate"]
