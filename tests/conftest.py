"""Shared test set-up: isolated data/config folders, the real default model,
the real worker process, and synthetic MTP models generated on demand.

Synthetic models live in the user cache (keyed by generator version and
spec), so a second run reuses them; everything a test writes goes to a
temporary folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# The GPU tier (tests/gpu) runs on the Vulkan engine in its own environment,
# through scripts/gpu_tier.sh, which sets MTP_STUDIO_GPU_TIER=1; the default
# run on the CPU engine does not collect it (tests/gpu/conftest.py).
collect_ignore = [] if os.environ.get("MTP_STUDIO_GPU_TIER") == "1" else ["gpu"]
# No desktop keyring in tests: the real backends may wait on D-Bus.
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")


@pytest.fixture(scope="session", autouse=True)
def isolated_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = tmp_path_factory.mktemp("mtp-studio")
    saved = {k: os.environ.get(k) for k in ("MTP_STUDIO_DATA_DIR", "MTP_STUDIO_CONFIG_DIR")}
    os.environ["MTP_STUDIO_DATA_DIR"] = str(base / "data")
    os.environ["MTP_STUDIO_CONFIG_DIR"] = str(base / "config")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def default_model(isolated_dirs: None) -> Path:
    from engine.default_model import default_model_path

    return default_model_path()


@pytest.fixture()
def worker(isolated_dirs: None) -> Iterator[object]:
    from engine.worker.client import WorkerClient

    client = WorkerClient(stderr=sys.stderr if os.environ.get("MTP_TEST_VERBOSE") else None)
    yield client
    client.close()
