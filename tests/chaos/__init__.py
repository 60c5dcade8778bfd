"""The chaos run: seeded fault and fuzz campaigns against the CLI, the worker,
the downloader, the protocol and the HTTP server (docs/reliability.md).

Not a pytest suite (it takes minutes and reports a table): run it as a module
from the repository root, ``.venv/bin/python -m tests.chaos [--quick]``.
"""
