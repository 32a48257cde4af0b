"""Free TCP ports for the rendezvous of locally spawned ranks.

A port picked by binding port 0 is free *now*; another process may take it before rank 0 binds it.
The local launcher therefore retries an arm whose ranks failed with "address already in use" on a
fresh port (see :func:`is_addr_in_use`).
"""

from __future__ import annotations

import re
import socket

# How torch's TCPStore / gloo / NCCL report a taken port (errno EADDRINUSE, text varies by layer).
_ADDR_IN_USE = re.compile(r"EADDRINUSE|address already in use|errno:?\s*98\b", re.IGNORECASE)


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on at the time of the call (kernel-chosen)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_addr_in_use(log_text: str) -> bool:
    """True when a rank's output says its rendezvous port was already taken."""
    return bool(_ADDR_IN_USE.search(log_text))
