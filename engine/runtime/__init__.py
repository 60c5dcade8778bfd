"""The only layer that imports llama_cpp: model, context, batch and sampler
wrappers that own their native handles and free them deterministically."""

from engine.runtime.context import Batch, Context, ContextParams
from engine.runtime.model import Model
from engine.runtime.sampler import Sampler, SamplingParams

__all__ = ["Batch", "Context", "ContextParams", "Model", "Sampler", "SamplingParams"]
