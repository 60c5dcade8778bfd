"""Models on disk: the sidecar doctor and repair, the library, memory fit, downloads."""
