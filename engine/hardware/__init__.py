"""Hardware detection, the engine-build recommendation, and the machine fingerprint."""

import os


def physical_cores() -> int:
    """Cores, not hardware threads (two hyperthreads share one core's arithmetic units)."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unable to tell on this platform
        n = None
    return max(1, n or os.cpu_count() or 1)


def default_threads() -> int:
    """Decode threads to start with: every physical core but one, at least 1, at most 8.

    Why not every core: ggml's threads meet at a barrier after every
    operation, so when another program takes one core, the thread sharing it
    makes all the others wait. Measured on this project's 2-core machine
    (docs/benchmarks.md, "Threads"): with one core kept busy, 2 threads
    collapse (a tiny model from thousands of tok/s to tens) while 1 thread
    keeps nearly its quiet speed; on a quiet machine 2 threads are faster
    than 1 by a smaller margin. Desktop machines always have something else
    running, so the default gives up that margin to never collapse; autotune
    measures the counts on the machine and can choose more.
    """
    return max(1, min(physical_cores() - 1, 8))
