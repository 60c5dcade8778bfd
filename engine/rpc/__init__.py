"""Splitting a model across machines with ggml's RPC backend.

Pure Python here (endpoint parsing, a socket probe of a server's devices,
where llama.cpp puts each layer, running the server binary); the native side
(adding servers to ggml, passing their devices to a model) lives in
``engine/runtime/rpc.py``, the only place that touches llama_cpp.
"""

from engine.rpc.endpoints import DEFAULT_PORT, Endpoint, parse_endpoints

__all__ = ["DEFAULT_PORT", "Endpoint", "parse_endpoints"]
