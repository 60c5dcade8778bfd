"""Vision projectors in the store: listed as projectors and never as models, grouped apart on the hub,
and checked against their target by the doctor (width and family) from the headers alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.cli import main
from engine.store import hub, library
from engine.store.doctor import diagnose_projector
from engine.store.projectors import read_projector
from engine.synth import SynthModel, SynthSpec
from engine.synth.projector import ProjectorSpec, projector_path

QWEN35 = SynthSpec(arch="qwen35", weights="random", seed=1)


@pytest.fixture()
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A library of one folder: a qwen35 target, its projector, and a projector saved under a model's name."""
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setattr(library, "hub_cache", lambda: tmp_path / "no-hub-cache")
    monkeypatch.setattr(library, "folders", lambda: [lib])
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    shutil.copyfile(SynthModel(QWEN35).path("combined"), lib / "Qwen3.5-tiny-Q8_0.gguf")
    shutil.copyfile(projector_path(ProjectorSpec(target=QWEN35)), lib / "mmproj-Qwen3.5-tiny-F32.gguf")
    shutil.copyfile(projector_path(ProjectorSpec(target=QWEN35, seed=2)), lib / "vision-encoder.gguf")
    return lib


def test_a_projector_is_listed_as_a_projector_and_never_as_a_model(folder: Path) -> None:
    assert [e.path.name for e in library.scan()] == ["Qwen3.5-tiny-Q8_0.gguf"]
    projectors = {p.path.name: p for p in library.scan_projectors()}
    # by llama.cpp's naming rule, and by the clip header when the name does not say
    assert set(projectors) == {"mmproj-Qwen3.5-tiny-F32.gguf", "vision-encoder.gguf"}
    facts = projectors["mmproj-Qwen3.5-tiny-F32.gguf"].facts
    assert facts is not None and (facts.projector_type, facts.width, facts.vision) == ("qwen3vl_merger", 64, True)
    assert facts.quantization == {"F32": 34}
    assert library.projectors_beside(folder / "Qwen3.5-tiny-Q8_0.gguf") == [folder / "mmproj-Qwen3.5-tiny-F32.gguf"]


def test_models_list_names_projectors_apart(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "vision projector qwen3vl_merger, output width 64" in out
    model_lines = [line for line in out.splitlines() if "qwen35," in line]
    assert len(model_lines) == 1


def test_the_doctor_passes_the_projector_made_for_the_target(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = diagnose_projector(folder / "Qwen3.5-tiny-Q8_0.gguf", folder / "mmproj-Qwen3.5-tiny-F32.gguf")
    assert d.ok, d.report()
    assert "projection width 64 = the target's embedding width" in d.report()
    assert main(["models", "doctor", str(folder / "Qwen3.5-tiny-Q8_0.gguf"),
                 str(folder / "mmproj-Qwen3.5-tiny-F32.gguf")]) == 0
    assert "fits Qwen3.5-tiny-Q8_0.gguf" in capsys.readouterr().out


def test_the_doctor_refuses_a_projector_of_another_width_naming_both(folder: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    wrong = folder / "mmproj-other-F32.gguf"
    shutil.copyfile(projector_path(ProjectorSpec(target=QWEN35, projection_dim=48)), wrong)
    d = diagnose_projector(folder / "Qwen3.5-tiny-Q8_0.gguf", wrong)
    assert not d.ok
    assert "writes rows 48 wide; Qwen3.5-tiny-Q8_0.gguf takes 64" in d.report()
    assert main(["models", "doctor", str(folder / "Qwen3.5-tiny-Q8_0.gguf"), str(wrong)]) == 1
    assert "cannot be used with" in capsys.readouterr().out


def test_the_doctor_refuses_a_projector_of_another_family(folder: Path) -> None:
    glm = SynthModel(SynthSpec(arch="glm4moe")).path("combined")  # the same width (64), another family
    d = diagnose_projector(glm, folder / "mmproj-Qwen3.5-tiny-F32.gguf")
    assert not d.ok
    assert "belongs to qwen35, qwen35moe, qwen3vl, qwen3vlmoe models; combined.gguf is glm4moe" in d.report()


def test_a_model_file_is_not_read_as_a_projector(folder: Path) -> None:
    from engine.errors import ModelFileError

    with pytest.raises(ModelFileError, match="not a vision projector: its architecture is 'qwen35'"):
        read_projector(folder / "Qwen3.5-tiny-Q8_0.gguf")


def test_the_hub_groups_projectors_apart_from_the_quantizations() -> None:
    groups = hub.group_files([("Qwen3.5-9B-Q4_K_M.gguf", 5), ("mmproj-F16.gguf", 1),
                              ("mmproj-Qwen3.5-9B-BF16.gguf", 2), ("mtp-Qwen3.5-9B-Q8_0.gguf", 1)])
    kinds = [(g.files[0], g.is_projector, g.is_mtp) for g in groups]
    assert kinds == [("Qwen3.5-9B-Q4_K_M.gguf", False, False), ("mtp-Qwen3.5-9B-Q8_0.gguf", False, True),
                     ("mmproj-F16.gguf", True, False), ("mmproj-Qwen3.5-9B-BF16.gguf", True, False)]
