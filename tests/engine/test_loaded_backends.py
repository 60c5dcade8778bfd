"""Which backends ggml registered, as the Hardware page shows them (engine/runtime/native.py)."""

from __future__ import annotations

import sys

from engine.hardware.probe import probe


def test_the_probe_reports_the_loaded_cpu_backend_and_its_library():
    report = probe()
    loaded = report.engine.get("loaded_backends")
    assert loaded, report.notes
    cpu = [b for b in loaded if b["name"] == "CPU"]
    assert len(cpu) == 1
    if sys.platform.startswith("linux"):  # read from the probe child's memory map
        assert cpu[0]["library"].startswith("libggml-cpu")
        assert "sapphirerapids" not in cpu[0]["library"]
    # how the backends load, from the build record: the developer engine links them in (an installer's: "dynamic")
    assert report.engine.get("backend_loading") == "linked in"
