"""The frozen app's entry point (PyInstaller runs this as the executable's main script).

Everything lives in ``app.main.main``: the window, the CLI, ``--version``,
``--smoke-test``, and -- when frozen -- the interpreter-style ``-m``/``-c``
command lines the app starts its own worker and tools with (engine/frozen.py).
"""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
