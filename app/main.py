"""The ``mtp-studio`` command: the desktop app without arguments, the
headless engine CLI with a command. Qt is imported only for the GUI."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from engine import frozen

    if frozen.is_frozen():  # the packaged app is also its own worker and tools (engine/frozen.py)
        code = frozen.run_interpreter_args(args)
        if code is not None:
            return code
    if args[:1] == ["--version"]:
        from engine.build_record import version_text

        print(version_text())
        return 0
    if args[:1] == ["--smoke-test"]:  # the packaged app's self-check (app/smoke.py, packaging/smoke_frozen.py)
        from app.application import run

        return run([], smoke=True)
    if args and args[0] not in ("--gui",):
        from engine.cli import main as cli_main

        return cli_main(args)
    from app.platform_check import missing_library

    missing = missing_library()
    if missing:  # Qt would abort with a generic "reinstall" message
        print(missing, file=sys.stderr)
        return 1
    from app.application import run

    return run(args[1:] if args else [])


if __name__ == "__main__":
    sys.exit(main())
