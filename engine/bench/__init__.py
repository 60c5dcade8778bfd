"""Benchmarks: plain vs MTP, ours vs llama.cpp's driver (see docs/benchmarks.md)."""
