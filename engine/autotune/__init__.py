"""Autotune: measure speculative settings on this machine and model, pick the
fastest that beats no speculation beyond the noise, remember it."""
