"""``python -m engine.worker``: start a worker process on stdin/stdout."""

import sys

from engine.worker.server import main

sys.exit(main())
