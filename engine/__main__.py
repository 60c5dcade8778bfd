"""``python -m engine <command>``: the headless CLI (the same as ``mtp-studio <command>``)."""

import sys

from engine.cli import main

sys.exit(main())
