"""The listening sockets the servers are given (bound by us rather than by the server, so a
taken port fails fast, as an exception, before anything starts)."""

from __future__ import annotations

import socket


def listening_socket(
    host: str, port: int, *, backlog: int = 2048, shared: bool = False
) -> socket.socket:
    """A listening TCP socket that says it is TCP (proto IPPROTO_TCP): asyncio turns Nagle off
    only on such sockets, and with it on every response waits ~40 ms for a delayed ACK.
    ``shared``: other processes may bind the same port (SO_REUSEPORT), the kernel spreading
    connections over them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
