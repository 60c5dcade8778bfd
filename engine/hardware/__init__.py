"""Hardware detection, the engine-build recommendation, and the machine fingerprint."""
