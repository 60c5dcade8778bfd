"""The benchmarks' HTTP clients run in a child process, as real clients do: their parsing never
competes with the server for the benchmark's interpreter lock. The child reads one JSON command
per line and answers one JSON line each (its module's ``_client_main``)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


class JsonChild:
    """``python -m module`` as a child, asked one JSON command at a time."""

    def __init__(self, module: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send ``command``; its answer.

        Raises:
            RuntimeError: the child ended before it answered.
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark's client process ended")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
