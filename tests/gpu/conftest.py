"""The GPU tier: the engine's device code paths on a real device.

Run by ``scripts/gpu_tier.sh`` (never by the default ``pytest``: it needs a
GPU engine, which the tier installs in ``.venv-vulkan``) and by
``scripts/device_check.sh`` on a lent GPU (CUDA or Vulkan). On a machine
without a GPU the device is Mesa's lavapipe, a software Vulkan driver that
ggml lists only when ``MTP_STUDIO_SOFTWARE_GPU=1`` asks for it. Every model
here has every layer on the device (``n_gpu_layers`` above the layer count).

A tier run without a device is a failure that says what to do, never a skip:
a tier that skips has not run.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

ALL_LAYERS = 999  # more than any test model has: every layer, and the output layer, on the device


GPU_BACKENDS = ("vulkan", "cuda", "metal", "rocm")


def is_software(device: dict) -> bool:
    """Mesa's lavapipe and its kin: a Vulkan device that runs on the CPU."""
    from engine.hardware.parsers import SOFTWARE_RENDERERS

    return any(s in device.get("description", "").lower() for s in SOFTWARE_RENDERERS)


def gpu_devices() -> list[dict]:
    """The engine's devices that are not the CPU (ggml's backend registry)."""
    from engine.hardware.probe import engine_devices

    devices, _offload = engine_devices()
    return [asdict(d) for d in devices if d.is_gpu]


@pytest.fixture(scope="session", autouse=True)
def gpu_device() -> dict:
    from engine.runtime import native

    info = native.build_info()
    if info.get("backend") not in GPU_BACKENDS:
        pytest.fail(f"the GPU tier needs a GPU engine, this one is {info.get('backend')!r}: run "
                    f"scripts/gpu_tier.sh (it builds the Vulkan engine in .venv-vulkan), or "
                    f"MTP_STUDIO_VENV=.venv-vulkan MTP_STUDIO_BACKEND=vulkan packaging/bootstrap.sh")
    found = gpu_devices()
    if not found:
        pytest.fail(f"the {info.get('backend')} engine lists no device. Without a GPU, install Mesa's lavapipe "
                    "(apt-get install mesa-vulkan-drivers) and set MTP_STUDIO_SOFTWARE_GPU=1")
    return found[0]
