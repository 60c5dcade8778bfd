"""The worker started the way the packaged app starts it: its own executable with ``-m engine.worker``.

Here the "executable" is this interpreter running app.main with ``sys.frozen``
set, which is exactly the dispatch the frozen launcher runs (engine/frozen.py);
the frozen build itself is covered by packaging/smoke_frozen.py.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from engine.worker import client as worker_client
from engine.worker import protocol as P

FROZEN_LAUNCHER = "import sys; sys.frozen = True; from app.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture()
def frozen_worker(isolated_dirs, monkeypatch):
    monkeypatch.setattr(worker_client, "worker_command",
                        lambda: [sys.executable, "-c", FROZEN_LAUNCHER, "-m", "engine.worker"])
    worker = worker_client.WorkerClient()
    yield worker
    worker.close()


def test_the_frozen_style_worker_shakes_hands_streams_and_dies_like_the_source_one(frozen_worker):
    assert frozen_worker.hello.protocol == P.PROTOCOL_VERSION
    assert frozen_worker.hello.engine.llama_cpp_python == "0.3.36"
    events = frozen_worker.call(P.LoadRequest(id=frozen_worker.new_id(), options=P.LoadOptions(n_ctx=256, n_threads=1)))
    assert isinstance(events[-1], P.LoadedEvent) and events[-1].model.is_default_model
    events = frozen_worker.call(P.GenerateRequestMsg(id="g", prompt="The capital of France is", max_tokens=6))
    assert [e.type for e in events].count("token") >= 2 and events[-1].type == "done"
    os.kill(frozen_worker.proc.pid, signal.SIGKILL)
    with pytest.raises(worker_client.WorkerDied):
        frozen_worker.call(P.GenerateRequestMsg(id="h", prompt="again", max_tokens=4), timeout=30)
