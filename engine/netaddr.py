"""Is an address this machine only? Both servers we run (the OpenAI-compatible
API and ggml's RPC server) bind loopback by default and ask for more care
(a key, a warning) for anything else."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere
