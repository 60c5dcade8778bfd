"""The ``mtp-studio`` command: the desktop app without arguments, the
headless engine CLI with a command. Qt is imported only for the GUI."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] not in ("--gui",):
        from engine.cli import main as cli_main

        return cli_main(args)
    from app.application import run

    return run(args[1:] if args else [])


if __name__ == "__main__":
    sys.exit(main())
