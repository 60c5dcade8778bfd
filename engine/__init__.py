"""MTP Studio's headless engine: inference, speculative decoding, the worker
process and its protocol, GGUF inspection. Never imports Qt."""
