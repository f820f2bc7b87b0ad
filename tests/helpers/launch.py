"""What multi-process tests (``accelerate launch`` of collection or training) need: a free local port."""

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for ``accelerate launch --main_process_port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
