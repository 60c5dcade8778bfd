"""Repository ids and file names from the user or the hub, checked before they touch the disk.

Both end up in paths: the CLI names its folder after the repository
(``acme/model`` -> ``acme__model``) and the file keeps its name. A repo id
``..`` would make that folder the data folder's parent, and a NUL byte makes
every ``os`` call raise ``ValueError``. They used to reach huggingface_hub
(or ``mkdir``) first and end in a traceback, after an empty folder had been
made; here they are refused with a message, before anything is created.
"""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath

from engine.errors import EngineError


class HubNameError(EngineError):
    kind = "download"


def check_repo_id(repo_id: str) -> None:
    """``owner/name`` or ``name`` as the hub allows them (its own validator decides).

    Raises:
        HubNameError: the id is not one the hub could have, in words a user can act on.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str) or not repo_id:
        raise HubNameError("No repository named: give one as owner/name, for example unsloth/GLM-4.5-Air-GGUF.")
    parts = repo_id.split("/")
    if any(part in ("", ".", "..") for part in parts) or len(parts) > 2:
        raise HubNameError(f"Refusing the repository {repo_id!r}: a repository is owner/name, "
                           "and neither part may be empty, '.' or '..'.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise HubNameError(f"Refusing the repository {_shown(repo_id)}: the hub's names are letters, digits, "
                           "'-', '_' and '.', at most 96 characters, as owner/name.") from None


def check_filename(filename: str) -> None:
    """A file name inside a repository: relative, no ``..``, no NUL or other control characters.

    Raises:
        HubNameError: the name could not be a file of the repository, or would leave the models folder.
    """
    if not isinstance(filename, str) or not filename.strip():
        raise HubNameError("No file named: give the file's name in the repository, for example model-Q4_K_M.gguf.")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in filename):
        raise HubNameError(f"Refusing the file name {_shown(filename)}: it holds a NUL or other control character.")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in filename):
        raise HubNameError(f"Refusing the file name {_shown(filename)}: it is not valid Unicode.")
    for pure in (PurePosixPath(filename), PureWindowsPath(filename)):
        if pure.is_absolute() or pure.anchor or ".." in pure.parts:
            raise HubNameError(f"Refusing the file name {_shown(filename)}: it would leave the models folder.")
    if filename.endswith(("/", "\\")):
        raise HubNameError(f"Refusing the file name {_shown(filename)}: it names a folder, not a file.")


def _shown(text: str) -> str:
    """The name as the user can read it: escapes for NUL and surrogates, never an encoding error."""
    return ascii(text) if len(text) <= 200 else ascii(text[:200]) + "…"
