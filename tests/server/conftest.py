"""A real worker with a synthetic MTP model behind the real server on a loopback port.

One engine link (one worker process) for the whole session; each test module
starts the servers it needs on port 0 around it. Requests from the official
``openai`` package, and raw ones from ``httpx``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.server.config import ServerConfig
from engine.server.engine_link import WorkerLink, load_request_for
from engine.server.runner import ServerThread
from engine.speculative.settings import mtp
from tests.engine.conftest import synth

MODEL_ID = "synth-glm4moe"


@pytest.fixture(scope="session")
def model_path(isolated_dirs: None) -> str:
    return str(synth("glm4moe").path("combined"))


@pytest.fixture(scope="session")
def link(model_path: str) -> Iterator[WorkerLink]:
    engine = WorkerLink(load_request_for(model_path, n_ctx=8192, n_threads=1), speculative=mtp(3))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def vision_files(isolated_dirs: None) -> tuple[str, str]:
    """The synthetic qwen35 target of the image tests (combined layout) and its projector."""
    from engine.synth import SynthModel
    from engine.synth.projector import ProjectorSpec, projector_path
    from tests.server.vision_server import SPEC

    return str(SynthModel(SPEC).path("combined")), str(projector_path(ProjectorSpec(target=SPEC)))


@pytest.fixture(scope="module")
def vision_link(vision_files: tuple[str, str]) -> Iterator[WorkerLink]:
    """A real worker with that target and projector loaded, MTP to depth 2."""
    model, mmproj = vision_files
    engine = WorkerLink(load_request_for(model, n_ctx=1024, n_threads=1, mmproj=mmproj), speculative=mtp(2))
    yield engine
    engine.close()


def start_server(link: WorkerLink, **options: object) -> ServerThread:
    config = ServerConfig(port=0, model_id=MODEL_ID, **options)  # type: ignore[arg-type]
    return ServerThread(link, config).start()


@pytest.fixture(scope="module")
def server(link: WorkerLink) -> Iterator[ServerThread]:
    running = start_server(link, max_queue=1)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def openai_client(server: ServerThread) -> object:
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
