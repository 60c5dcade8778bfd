"""The OpenAI-compatible local server: one more client of the worker process,
serving ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
``/health`` and ``/metrics`` over HTTP on loopback (``docs/server.md``).

Never imports llama_cpp or Qt: the engine stays in its worker process, and the
app's panel gives the server its own engine link (``app/server_panel.py``).
"""
