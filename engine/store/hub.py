"""Finding GGUF models on the Hugging Face hub: search, a repository's files
grouped by quantization, and which MTP sidecar goes with a target.

Everything goes through ``huggingface_hub``; ``HF_ENDPOINT`` (or ``endpoint=``)
points it elsewhere, which is how the tests use a server on loopback.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engine.errors import EngineError

CATALOG = Path(__file__).resolve().parents[2] / "assets" / "catalog.json"
_QUANT = re.compile(r"(UD-)?(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)", re.IGNORECASE)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0
UNREACHABLE = "Hugging Face cannot be reached"  # how HubUnreachable's message begins (the GUI gets only text)


class HubUnreachable(EngineError):
    """The hub cannot be reached at all (no network, no DNS, nothing listening): said in plain words at once,
    instead of huggingface_hub's five retries and a raw socket error about 23 s later."""

    kind = "offline"


@dataclass(frozen=True)
class RepoSummary:
    repo_id: str
    downloads: int
    likes: int


@dataclass
class FileGroup:
    """One quantization of a model: one file, or every shard of a split model."""

    quant: str
    files: list[str] = field(default_factory=list)
    size: int = 0
    is_mtp: bool = False
    is_projector: bool = False  # a vision projector (mmproj-*.gguf), never a quantization of the model

    @property
    def shards(self) -> int:
        return len(self.files)


def unreachable_reason(endpoint: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached, in plain words, or None when it answers a TCP connection.

    Name lookup and connect run on a daemon thread joined with ``timeout``: ``getaddrinfo`` has no timeout
    of its own and can hang for tens of seconds on a machine with no network, so it is abandoned instead.
    """
    url = urlparse(_endpoint(endpoint) or DEFAULT_ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    where = host if url.port is None else f"{host}:{port}"
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):  # the connection goes to the proxy, so probe that
        purl = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = purl.hostname or host, purl.port or 8080
        where = f"the proxy {host}:{port}"
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            outcome.append(f"{host} could not be looked up: this computer seems to be offline "
                           "(no network or no name server)")
            return
        last: OSError | None = None
        for family, kind, proto, _name, address in infos:
            try:
                with socket.socket(family, kind, proto) as sock:
                    sock.settimeout(timeout)
                    sock.connect(address)
                outcome.append(None)
                return
            except OSError as exc:
                last = exc
        refused = isinstance(last, ConnectionRefusedError)
        outcome.append(f"nothing answers at {where}" + (" (connection refused)" if refused else ""))

    thread = threading.Thread(target=attempt, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"{where} did not answer within {timeout:.0f} s: this computer seems to be offline"
    return outcome[0]


def check_reachable(endpoint: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raises HubUnreachable, with what to do, when the hub cannot be reached."""
    reason = unreachable_reason(endpoint, timeout)
    if reason:
        raise HubUnreachable(f"{UNREACHABLE}: {reason}. Searching and downloading need a "
                             "connection: connect, then try again (HF_ENDPOINT points at another hub).")


def search(query: str, limit: int = 20, endpoint: str | None = None, token: str | None = None) -> list[RepoSummary]:
    """Raises HubUnreachable within about 3 s when the hub cannot be reached."""
    from huggingface_hub import HfApi

    check_reachable(endpoint)
    api = HfApi(endpoint=_endpoint(endpoint), token=token)
    return [RepoSummary(m.id, int(getattr(m, "downloads", 0) or 0), int(getattr(m, "likes", 0) or 0))
            for m in api.list_models(search=query, filter="gguf", limit=limit)]


def quant_of(filename: str) -> str:
    stem = _SHARD.sub("", Path(filename).name).removesuffix(".gguf")
    matches = _QUANT.findall(stem)
    return ("".join(matches[-1])).upper() if matches else "unknown"


def group_files(siblings: list[tuple[str, int]]) -> list[FileGroup]:
    """Group ``(filename, size)`` pairs into quantizations; shards go together; MTP files and vision
    projectors (``mmproj``, llama.cpp's naming rule) apart."""
    groups: dict[tuple[str, bool, bool, str], FileGroup] = {}
    for name, size in siblings:
        if not name.endswith(".gguf"):
            continue
        is_projector = "mmproj" in Path(name).name.lower()
        is_mtp = "mtp" in Path(name).name.lower() and not is_projector
        base = _SHARD.sub("", name)
        key = (quant_of(name), is_mtp, is_projector, base if _SHARD.search(name) else name)
        group = groups.setdefault(key, FileGroup(quant_of(name), is_mtp=is_mtp, is_projector=is_projector))
        group.files.append(name)
        group.size += size
    for g in groups.values():
        g.files.sort()
    return sorted(groups.values(), key=lambda g: (g.is_projector, g.is_mtp, g.size))


def repo_files(repo_id: str, endpoint: str | None = None, token: str | None = None) -> list[FileGroup]:
    from huggingface_hub import HfApi

    check_reachable(endpoint)
    info = HfApi(endpoint=_endpoint(endpoint), token=token).model_info(repo_id, files_metadata=True)
    return group_files([(s.rfilename, int(s.size or 0)) for s in info.siblings or []])


def catalog() -> list[dict[str, Any]]:
    """The catalog's families as plain dicts (``engine.store.catalog`` reads and checks them as types)."""
    return list(json.loads(CATALOG.read_text())["families"])


def suggest_sidecar(repo_id: str, groups: list[FileGroup]) -> tuple[str, str] | None:
    """(repo, file pattern) of the MTP sidecar for a target in ``repo_id``.

    First an ``mtp-*.gguf`` sibling in the same repository (the naming
    llama.cpp's ``--mtp`` export and its downloader use), then the catalog.
    """
    for g in groups:
        if g.is_mtp:
            return repo_id, g.files[0]
    for family in catalog():
        if repo_id in family.get("targets", []):
            side = family.get("sidecar")
            if side:
                return side["repo"], side.get("pattern", "*mtp*.gguf")
    return None


def _endpoint(endpoint: str | None) -> str | None:
    """``HF_ENDPOINT`` is read per call (huggingface_hub reads it once, at import)."""
    return endpoint or os.environ.get("HF_ENDPOINT") or None
