"""The decode loop: prefill, draft, verify, accept, sample, stop conditions,
chat templates, cancellation and streaming events."""
