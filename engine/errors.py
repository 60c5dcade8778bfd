"""The engine's error hierarchy. Every error carries a stable ``kind`` that
travels over the worker protocol, and a message a user can act on."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""

    kind = "engine"


class ModelFileError(EngineError, OSError):
    """A model file is missing, unreadable, or not a GGUF we can use."""

    kind = "model_file"


class ModelLoadError(EngineError):
    """llama.cpp refused to load a file that passed our metadata checks."""

    kind = "model_load"


class NoModelLoaded(EngineError):
    kind = "no_model"


class ContextError(EngineError):
    """Creating a context or decoding a batch failed."""

    kind = "context"


class SidecarMismatch(EngineError):
    """An MTP sidecar does not fit the target (stated with both values)."""

    kind = "sidecar_mismatch"


class SpeculativeUnavailable(EngineError):
    """MTP was requested but this model cannot do it; the reason says why."""

    kind = "speculative_unavailable"


class TemplateError(EngineError):
    """The model's chat template failed to render."""

    kind = "template"


class ProtocolError(EngineError):
    """A request or event that does not follow the worker protocol."""

    kind = "protocol"


class RpcError(EngineError):
    """A remote (ggml RPC) server is malformed, unreachable, busy, or went away mid-reply."""

    kind = "rpc"


class GrammarError(EngineError):
    """A grammar or JSON schema the engine cannot use (the request's fault)."""

    kind = "grammar"


class ProjectorError(EngineError):
    """A vision projector (``mmproj``) that does not load, or does not fit the loaded model."""

    kind = "projector"


class ImageError(EngineError):
    """An image the engine cannot take: not decodable, or sent to a model without a projector."""

    kind = "image"
