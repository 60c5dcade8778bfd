"""Where MTP Studio keeps its files (platformdirs), overridable for tests."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "mtp-studio"


def data_dir() -> Path:
    """User data: the assembled default model, conversations, profiles.

    ``MTP_STUDIO_DATA_DIR`` overrides it (tests point it at a temporary folder).
    """
    override = os.environ.get("MTP_STUDIO_DATA_DIR")
    path = Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Regenerable files: synthetic models. ``MTP_STUDIO_CACHE_DIR`` overrides it."""
    override = os.environ.get("MTP_STUDIO_CACHE_DIR")
    path = Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    override = os.environ.get("MTP_STUDIO_CONFIG_DIR")
    path = Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path
