"""The catalog of known MTP families, read and checked as types; offline
detection of the hub in about 3 s; the library's word for a broken sidecar."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest

from engine.store import catalog, hub, library
from engine.store.fit import MemoryEstimate
from engine.synth import SynthSpec
from tests.engine.conftest import synth
from tests.fake_hub import FakeHub

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_shipped_catalog_is_well_formed_and_points_only_inside_the_repository():
    data = json.loads(catalog.CATALOG.read_text())
    assert catalog.problems(data) == []
    recs = catalog.load()
    assert len(recs) == len(data["families"]) >= 5
    assert any(r.sidecar is not None for r in recs) and any(r.size for r in recs)
    text = catalog.CATALOG.read_text()
    assert "shared/" not in text
    for mentioned in re.findall(r"\b(?:engine|tests|app|docs)/[\w/]+\.\w+", text):
        assert (ROOT / mentioned).exists(), mentioned


@pytest.mark.parametrize(("change", "complaint"), [
    (lambda f: f.update(mtp="sometimes"), "'mtp' must be one of"),
    (lambda f: f.pop("sidecar"), "a 'sidecar' entry belongs"),
    (lambda f: f["recommended"].update(repo="someone/else"), "not one of its targets"),
    (lambda f: f["recommended"].update(size=-3), "positive number of bytes"),
    (lambda f: f["recommended"].update(size=10, size_basis=""), "size_basis"),
    (lambda f: f.update(targets=["no-owner"], recommended={"repo": "no-owner"}), "not an owner/name"),
])
def test_a_malformed_family_is_named_with_what_is_wrong(tmp_path, change, complaint):
    family = {"name": "X", "arch": "glm4moe", "targets": ["a/b"], "mtp": "sidecar",
              "recommended": {"repo": "a/b", "quant": "Q4_K_M", "size": None},
              "sidecar": {"repo": "a/b-MTP", "pattern": "*MTP*.gguf", "size": None}}
    assert catalog.problems({"families": [family]}) == []
    change(family)
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"families": [family]}))
    with pytest.raises(catalog.CatalogError, match=re.escape(complaint)):
        catalog.load(path)


def test_the_fit_badge_is_the_fit_verdict_on_the_catalog_size():
    assert catalog.badge(catalog.fit_estimate(5 * GIB, available=16 * GIB)) == "fits"
    assert catalog.badge(catalog.fit_estimate(14 * GIB, available=16 * GIB)) == "tight fit"
    assert catalog.badge(catalog.fit_estimate(68 * GIB, available=16 * GIB)) == "does not fit"
    assert catalog.badge(catalog.fit_estimate(None, available=16 * GIB)) == "size unknown"
    assert isinstance(catalog.fit_estimate(1, available=2), MemoryEstimate)


def test_an_unreachable_hub_is_said_in_plain_words_within_three_seconds(monkeypatch):
    url = closed_port_url()
    monkeypatch.setenv("HF_ENDPOINT", url)
    start = time.monotonic()
    with pytest.raises(hub.HubUnreachable, match="cannot be reached: nothing answers at 127.0.0.1.*connect, then"):
        hub.search("qwen")
    assert time.monotonic() - start < 3.5
    with FakeHub({}) as server:
        assert hub.unreachable_reason(server.url) is None


def test_resolve_finds_the_recommended_quantization_and_the_sidecar_on_the_hub():
    model = synth("glm4moe")
    repos = {"test/Synth-GGUF": {"Synth-Q8_0.gguf": model.path("trunk"), "Synth-F16-00001-of-00002.gguf":
                                 model.path("sharded"), "Synth-F16-00002-of-00002.gguf":
                                 model.path("sharded").with_name("sharded-00002-of-00002.gguf")},
             "test/Synth-MTP-GGUF": {"Synth-MTP-Q8_0.gguf": model.path("sidecar"), "README.md": model.path("trunk")}}
    rec = catalog.Recommendation("Synth", "glm4moe", "sidecar", "test/Synth-GGUF", "F16", None, "",
                                 catalog.Sidecar("test/Synth-MTP-GGUF", "*MTP*.gguf", None), "")
    with FakeHub(repos) as server:
        resolved = catalog.resolve(rec, server.url)
        assert [f for _r, f in resolved.files] == ["Synth-F16-00001-of-00002.gguf", "Synth-F16-00002-of-00002.gguf",
                                                   "Synth-MTP-Q8_0.gguf"]
        assert resolved.size > model.path("sidecar").stat().st_size
        with pytest.raises(catalog.CatalogError, match="has no Q2_K files .*F16, Q8_0"):
            catalog.resolve(catalog.Recommendation("Synth", "glm4moe", "in-file", "test/Synth-GGUF", "Q2_K",
                                                   None, "", None, ""), server.url)


def test_resolve_offers_the_vision_projector_the_targets_repository_ships():
    from engine.synth.projector import ProjectorSpec, projector_path

    model = synth("glm4moe")
    projector = projector_path(ProjectorSpec(target=SynthSpec(arch="qwen35", weights="random", seed=1)))
    repos = {"test/Vision-GGUF": {"Vision-Q8_0.gguf": model.path("combined"), "mmproj-Vision-F32.gguf": projector,
                                  "mmproj-Vision-F16.gguf": projector, "Vision-MTP-Q8_0.gguf": model.path("sidecar")}}
    rec = catalog.Recommendation("Vision", "glm4moe", "in-file", "test/Vision-GGUF", "Q8_0", None, "", None, "")
    with FakeHub(repos) as server:
        resolved = catalog.resolve(rec, server.url)
    assert [f for _r, f in resolved.files] == ["Vision-Q8_0.gguf", "mmproj-Vision-F16.gguf"]
    assert resolved.size == model.path("combined").stat().st_size + projector.stat().st_size
    with FakeHub({"test/Vision-GGUF": {"Vision-Q8_0.gguf": model.path("combined")}}) as server:
        assert catalog.resolve(rec, server.url).projector == []  # a text-only model: nothing more


def test_a_broken_sidecar_is_not_listed_as_a_trunk_only_export():
    model = synth("glm4moe")
    labels = {layout: library.LibraryEntry(model.path(layout), library.read_facts(model.path(layout))).layout
              for layout in ("combined", "sidecar", "sidecar-relative", "sidecar-renumbered")}
    assert labels["combined"] == "combined" and labels["sidecar"] == "MTP sidecar"
    for broken in ("sidecar-relative", "sidecar-renumbered"):
        assert "trunk-only" not in labels[broken] and "combined" not in labels[broken]
        assert labels[broken].startswith("MTP sidecar, blocks misnumbered") and "Repair" in labels[broken]
