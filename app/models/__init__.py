"""The Models page: recommended models, hub search, the download queue and its rows, the library on disk, and
the target + sidecar pair with its doctor and repair."""
