"""A small TCP proxy a test can cut, to take a server off the network and bring it back.

``cut()`` drops every live connection at once (both sides see the connection closed) and from
then on closes each new connection as soon as it is accepted; ``black_hole()`` keeps every
connection open and relays nothing, old or new (a host gone off the network without a reset);
``restore()`` lets connections through again. Plain asyncio streams: each connection is two
pumps copying at most ``CHUNK`` bytes at a time and waiting for the other side to drain, so
memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 5.0


class TcpProxy:
    """Listens on 127.0.0.1 (a free port, ``.port``) and forwards to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.accepted = 0  # connections forwarded to the target
        self.refused = 0  # connections closed on arrival (or cut while connecting)
        self._server: asyncio.Server | None = None
        self._open = True
        self._relaying = asyncio.Event()  # cleared: a black hole, nothing goes either way
        self._relaying.set()
        self._epoch = 0  # bumped by every cut: a connection made before it must not survive it
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def active(self) -> int:
        """Connections the proxy is still serving (0 once stopped)."""
        return len(self._tasks)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        """Close every live connection and refuse new ones until ``restore()``."""
        self._open = False
        self._epoch += 1
        for client, upstream in list(self._links):
            client.transport.abort()
            upstream.transport.abort()

    def black_hole(self) -> None:
        """Accept connections and relay nothing on any of them until ``restore()``."""
        self._relaying.clear()

    def restore(self) -> None:
        """Forward new connections again (the ones cut stay closed), and relay again."""
        self._open = True
        self._relaying.set()

    async def stop(self) -> None:
        """Stop listening, close every connection and wait for every task of the proxy."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await asyncio.sleep(0)  # connections accepted just before the close get their task
        self._relaying.set()  # nothing waits in a black hole any more
        while self._tasks:
            self.cut()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- connections ---------------------------------------------------------------------------

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, not a coroutine: the task is known to the proxy from the first moment.
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        epoch = self._epoch
        if not self._open:
            self.refused += 1
            client_w.transport.abort()
            return
        await self._relaying.wait()  # a black hole holds the connection open, unanswered
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                upstream_r, upstream_w = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
        except (OSError, TimeoutError):
            self.refused += 1
            client_w.transport.abort()
            return
        if not self._open or epoch != self._epoch:  # cut while connecting
            self.refused += 1
            client_w.transport.abort()
            upstream_w.transport.abort()
            return
        self.accepted += 1
        link = (client_w, upstream_w)
        self._links.add(link)
        pumps = [
            asyncio.create_task(_pump(client_r, upstream_w, self._relaying)),
            asyncio.create_task(_pump(upstream_r, client_w, self._relaying)),
        ]
        try:
            # One side closing ends the link: these protocols never half-close on purpose.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._links.discard(link)
            client_w.transport.abort()
            upstream_w.transport.abort()
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, relaying: asyncio.Event
) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            await relaying.wait()
            writer.write(data)
            await writer.drain()
