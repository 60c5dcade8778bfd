"""Hardware parsers against recorded samples, the recommendation, the fingerprint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.hardware import parsers
from engine.hardware.parsers import GPU
from engine.hardware.probe import EngineDevice, HardwareReport
from engine.hardware.recommend import recommend

DATA = Path(__file__).resolve().parents[1] / "data" / "hardware"


def sample(name: str) -> str:
    return (DATA / name).read_text()


def test_nvidia_smi_csv_gives_each_gpu_with_memory_and_driver():
    gpus = parsers.parse_nvidia_smi_csv(sample("nvidia-smi.csv"))
    assert gpus == [GPU("nvidia", "NVIDIA RTX A6000", 49140, "560.94", "cuda")] * 2


def test_vulkaninfo_summary_skips_software_renderers():
    gpus = parsers.parse_vulkaninfo_summary(sample("vulkaninfo-summary.txt"))
    assert [(g.vendor, g.name) for g in gpus] == [("amd", "AMD Radeon Graphics (RADV GFX1151)")]
    assert gpus[0].driver == "Mesa 24.1.2"


def test_a_software_vulkan_device_is_listed_only_when_asked_for():
    # Captured here: lavapipe is the machine's only Vulkan device, of type CPU.
    assert parsers.parse_vulkaninfo_summary(sample("vulkaninfo-lavapipe.txt")) == []
    gpus = parsers.parse_vulkaninfo_summary(sample("vulkaninfo-lavapipe.txt"), software=True)
    assert [(g.name, g.api, g.software) for g in gpus] == [("llvmpipe (LLVM 15.0.6, 256 bits)", "vulkan", True)]
    mixed = parsers.parse_vulkaninfo_summary(sample("vulkaninfo-summary.txt"), software=True)
    assert [g.software for g in mixed] == [False, True]


def test_kfd_topology_ignores_cpu_nodes():
    nodes = {"0": sample("kfd-node0.properties"), "1": sample("kfd-node1.properties")}
    assert parsers.parse_kfd_topology(nodes) == [GPU("amd", "AMD gfx1151", None, None, "rocm")]


def test_system_profiler_finds_apple_gpu():
    assert parsers.parse_system_profiler_displays(sample("system_profiler-displays.txt")) == [
        GPU("apple", "Apple M4 Max", None, None, "metal")]


def test_cpuinfo_model_and_flags():
    model, flags = parsers.parse_cpuinfo(sample("cpuinfo-x86.txt"))
    assert model == "Intel(R) Xeon(R) Platinum 8480+" and "amx_tile" in flags and "avx2" in flags


def report(**kw) -> HardwareReport:
    base = HardwareReport(os="Linux 6.8", machine="x86_64", cpu_model="Xeon", cpu_flags=["avx2"], cores=16,
                          ram_mib=65536, engine={"llama_cpp_python": "0.3.36", "backend": "cpu", "cache_key": "k1"})
    return replace(base, **kw)


def test_cpu_engine_on_an_nvidia_machine_recommends_the_cuda_build():
    rec = recommend(report(gpus=[GPU("nvidia", "NVIDIA RTX A6000", 49140, "560.94", "cuda")]))
    assert rec.backend == "cuda" and not rec.matches
    assert "NVIDIA GPU found (NVIDIA RTX A6000, 49140 MiB)." in rec.reasons
    assert "The engine is CPU-only; build the CUDA engine." in rec.reasons
    assert rec.command == "mtp-studio engine build --backend cuda"


def _installer_engine(backend: str, loaded: list[tuple[str, str]]) -> dict:
    """An installer's build record (packaging/build_engine_libs.py) and the backends ggml loaded from it."""
    return {"llama_cpp_python": "0.3.36", "backend": backend, "backend_loading": "dynamic", "cache_key": "k1",
            "loaded_backends": [{"name": n, "library": lib} for n, lib in loaded]}


def test_an_installer_engine_says_which_backend_ggml_chose_and_why():
    cpu_only = recommend(report(engine=_installer_engine("cpu", [("RPC", "libggml-rpc.so"),
                                                                  ("CPU", "libggml-cpu-zen4.so")])))
    assert "This engine picks its backend at start: it runs on the CPU (libggml-cpu-zen4.so, the best of its CPU " \
           "variants for this processor)." in cpu_only.reasons and cpu_only.matches
    # the Vulkan installer on a machine without a GPU: covered by its CPU variants, no "build the CPU engine"
    no_gpu = recommend(report(engine=_installer_engine("vulkan", [("Vulkan", "libggml-vulkan.so"),
                                                                   ("CPU", "libggml-cpu-haswell.so")])))
    assert any(r.endswith("libggml-cpu-haswell.so, the best of its CPU variants for this processor); its Vulkan "
                          "backend loaded but found no GPU.") for r in no_gpu.reasons)
    assert "The active engine (Vulkan) matches." in no_gpu.reasons and no_gpu.matches
    assert not any("build the" in r for r in no_gpu.reasons)
    no_loader = recommend(report(engine=_installer_engine("vulkan", [("CPU", "libggml-cpu-haswell.so")])))
    assert any(r.endswith("its Vulkan backend did not load (no Vulkan runtime or driver here).")
               for r in no_loader.reasons)
    with_gpu = recommend(report(
        engine=_installer_engine("vulkan", [("Vulkan", "libggml-vulkan.so"), ("CPU", "libggml-cpu-haswell.so")]),
        gpus=[GPU("amd", "AMD Radeon RX 7900 XTX", None, "Mesa 24", "vulkan")],
        engine_devices=[EngineDevice("Vulkan0", "AMD Radeon RX 7900 XTX (RADV NAVI31)", "gpu", 24000, 24560),
                        EngineDevice("CPU", "Xeon", "cpu", 60000, 65536)]))
    assert with_gpu.matches and "This engine picks its backend at start: GPU layers run on Vulkan0 (AMD Radeon RX " \
        "7900 XTX (RADV NAVI31)) through Vulkan (libggml-vulkan.so), the rest on the CPU (libggml-cpu-haswell.so, " \
        "the best of its CPU variants for this processor)." in with_gpu.reasons
    # a developer build (backends linked in) says nothing about a run-time choice
    assert not any("picks its backend" in r for r in recommend(report()).reasons)


def test_amx_is_explained():
    rec = recommend(report(cpu_flags=["avx2", "amx_tile"]))
    assert rec.matches and any("AMX" in r for r in rec.reasons)


def test_fingerprint_is_stable_and_changes_with_gpu_driver_or_engine():
    a = report(gpus=[GPU("nvidia", "RTX", 24000, "560.94", "cuda")])
    assert a.fingerprint() == report(gpus=[GPU("nvidia", "RTX", 24000, "560.94", "cuda")]).fingerprint()
    assert a.fingerprint() != report(gpus=[GPU("nvidia", "RTX", 24000, "565.10", "cuda")]).fingerprint()
    assert a.fingerprint() != replace(a, engine={**a.engine, "backend": "cuda", "cache_key": "k2"}).fingerprint()
    assert a.fingerprint() != report().fingerprint()


@pytest.mark.parametrize("field", ["notes", "engine_devices"])
def test_fingerprint_ignores_volatile_fields(field):
    a = report()
    value = [EngineDevice("CPU", "Xeon", "cpu", 1, 2)] if field == "engine_devices" else ["x"]
    assert a.fingerprint() == replace(a, **{field: value}).fingerprint()


def test_rocminfo_lists_gpu_agents_only():
    assert parsers.parse_rocminfo(sample("rocminfo.txt")) == [GPU("amd", "AMD Radeon Graphics", None, None, "rocm")]


def test_system_profiler_json_finds_apple_gpu():
    assert parsers.parse_system_profiler_json(sample("system_profiler-displays.json")) == [
        GPU("apple", "Apple M4 Max", None, None, "metal")]


@pytest.mark.parametrize("parser", [parsers.parse_nvidia_smi_csv, parsers.parse_vulkaninfo_summary,
                                    parsers.parse_rocminfo, parsers.parse_system_profiler_json,
                                    parsers.parse_system_profiler_displays])
@pytest.mark.parametrize("text", ["", "\n\n", "garbage: ,,, {not json", "NVIDIA-SMI has failed because it couldn't "
                                  "communicate with the NVIDIA driver.", "Devices:\n========\nGPU0:\n"])
def test_broken_or_empty_tool_output_gives_no_gpus_and_no_exception(parser, text):
    assert parser(text) == []


def test_truncated_samples_do_not_raise():
    for name, parser in (("nvidia-smi.csv", parsers.parse_nvidia_smi_csv),
                         ("vulkaninfo-summary.txt", parsers.parse_vulkaninfo_summary),
                         ("rocminfo.txt", parsers.parse_rocminfo),
                         ("system_profiler-displays.json", parsers.parse_system_profiler_json)):
        text = sample(name)
        parser(text[: len(text) // 2])
    assert parsers.parse_kfd_topology({"0": "simd_count garbage"}) == []


def test_a_probe_that_hangs_is_cut_off_and_reported():
    from engine.hardware.probe import probe

    report = probe(timeout=1.0, code="import time; time.sleep(60)")
    assert any("did not finish within 1 s" in n for n in report.notes)
    assert report.cores >= 1 and report.engine.get("llama_cpp_python")


def test_a_probe_that_crashes_is_reported():
    from engine.hardware.probe import probe

    report = probe(timeout=30, code="import os; os.abort()")
    assert any("failed" in n for n in report.notes)


def test_the_real_probe_sees_the_cpu_backend_and_its_fingerprint_is_stable():
    from engine.hardware.probe import probe

    a, b = probe(), probe()
    assert a.ram_mib and a.cores >= 1
    assert any(d.type == "cpu" for d in a.engine_devices)
    assert a.fingerprint() == b.fingerprint()


def test_ram_comes_from_psutil(monkeypatch):
    import psutil

    from engine.hardware import memory

    class VM:
        total, available = 64 * 2**30, 40 * 2**30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: VM())
    assert memory.total_ram_mib() == 65536
    assert memory.available_ram_bytes() == 40 * 2**30
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: (_ for _ in ()).throw(OSError("no")))
    assert memory.total_ram_mib() is None


def fake_nvml(names: list[str], *, fail_init: bool = False):
    """A stand-in for nvidia-ml-py's ``pynvml`` (this machine has no NVIDIA driver)."""
    import types

    class NVMLError(Exception):
        pass

    def init():
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    mod = types.ModuleType("pynvml")
    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = lambda: b"560.94"  # old bindings answer bytes
    mod.nvmlDeviceGetCount = lambda: len(names)
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetName = lambda h: names[h]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=49140 * 2**20, free=1, used=0)
    return mod


def test_nvidia_gpus_come_from_nvml_with_nvidia_smi_as_fallback(monkeypatch):
    import sys

    from engine.hardware import probe as probe_mod

    smi_calls: list[list[str]] = []

    def fake_run(cmd):
        smi_calls.append(cmd)
        return sample("nvidia-smi.csv") if cmd[0] == "nvidia-smi" else None

    monkeypatch.setattr(probe_mod, "_run", fake_run)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA H200"]))
    assert probe_mod._nvidia_gpus() == [GPU("nvidia", "NVIDIA H200", 49140, "560.94", "cuda")]
    assert not smi_calls  # NVML answered: no process started
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], fail_init=True))
    assert probe_mod._nvidia_gpus() == [GPU("nvidia", "NVIDIA RTX A6000", 49140, "560.94", "cuda")] * 2
    assert smi_calls and smi_calls[0][0] == "nvidia-smi"


def test_the_json_the_app_reads_decodes_to_the_typed_report_with_its_fingerprint_and_recommendation():
    """The app reads ``mtp-studio hardware --json``: the report's own fields typed, the CLI's additions (worked out
    from the report) left out and worked out again the same."""
    a = report(gpus=[GPU("nvidia", "RTX", 24000, "560.94", "cuda")],
               engine={"llama_cpp_python": "0.3.36", "backend": "cpu", "cache_key": "k1",
                       "loaded_backends": [{"name": "CPU", "library": "libggml-cpu-haswell.so"}]},
               engine_devices=[EngineDevice("CPU", "Xeon", "cpu", 60000, 64000),
                               EngineDevice("Vulkan0", "RTX", "gpu", 20000, 24000)])
    data = {**a.to_json(), "fingerprint": a.fingerprint(), "recommendation": {"backend": "cuda"}}
    b = HardwareReport.from_json(json.loads(json.dumps(data)))
    assert b == a and b.fingerprint() == a.fingerprint() and recommend(b) == recommend(a)
    assert b.backend == "cpu" and b.engine_version == "0.3.36"
    assert [d.name for d in b.gpu_devices] == ["Vulkan0"]
    assert [(lb.name, lb.library) for lb in b.loaded_backends] == [("CPU", "libggml-cpu-haswell.so")]
