"""A user-space TCP proxy that makes loopback look like a WAN: delay and a rate limit.

    python scripts/wan_proxy.py --target 9092 --rtt-ms 50 --mbit 100 --max-seconds 600

Listens on 127.0.0.1 (``--port``, default: a free one, printed) and forwards every
connection to ``127.0.0.1:<target>``. Point the SuperNodes at the proxy's port instead of
the SuperLink's: each byte then waits half the round-trip time on its way in each
direction, and each direction of each connection is limited to ``--mbit`` (its bytes are
serialised at that rate, after the delay, as on a link of that speed). Kernels without
netem (this one) cannot do this with ``tc``.

Bounded: loopback only (it refuses any other address), at most ``--max-connections`` at a
time, and it stops by itself after ``--max-seconds`` (default 900) or when idle for
``--idle-seconds`` (default: never). ``WanProxy`` runs the same in a thread
(scripts/measure_wan.py uses it). Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import socket
import threading
import time
from collections import deque

LOOPBACK = "127.0.0.1"
READ = 1 << 16


def _loopback(host: str) -> str:
    if not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        raise ValueError(f"{host}: the WAN proxy runs on loopback only")
    return host


class WanProxy:
    """Forward ``127.0.0.1:port`` to ``127.0.0.1:target`` with ``rtt_ms`` round trip and ``mbit`` per direction."""

    def __init__(self, target: int, rtt_ms: float = 0.0, mbit: float = 0.0, port: int = 0,
                 max_connections: int = 64, max_seconds: float = 900.0, idle_seconds: float = 0.0,
                 host: str = LOOPBACK) -> None:
        self.host = _loopback(host)
        self.target, self.port = int(target), int(port)
        self.delay = max(0.0, rtt_ms) / 2000.0  # one way, seconds
        self.rate = mbit * 1e6 / 8 if mbit > 0 else 0.0  # bytes per second; 0: unlimited
        self.max_connections, self.max_seconds, self.idle_seconds = max_connections, max_seconds, idle_seconds
        self.open = 0
        self.bytes = 0
        self.connections = 0
        self.turns = 0  # requests that followed an answer on their connection: each waits a round trip
        self._last = time.monotonic()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    # -- one direction of one connection ------------------------------------------------------
    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool = False,
                    last: list | None = None) -> None:
        queue: deque[tuple[float, bytes]] = deque()
        more = asyncio.Event()
        done = False

        async def deliver() -> None:
            free = 0.0  # when the link has finished sending what it was given
            while queue or not done:
                if not queue:
                    more.clear()
                    await more.wait()
                    continue
                due, data = queue.popleft()
                now = time.monotonic()
                start = max(due, free, now)
                free = start + (len(data) / self.rate if self.rate else 0.0)
                if free > now:
                    await asyncio.sleep(free - now)
                writer.write(data)
                await writer.drain()
                self.bytes += len(data)
                self._last = time.monotonic()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(READ)
                if not data:
                    break
                if last is not None and last[0] != up:  # the conversation turned
                    last[0] = up
                    self.turns += up
                queue.append((time.monotonic() + self.delay, data))
                more.set()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            more.set()
            try:
                await sender
            except (ConnectionError, OSError):
                pass
            try:
                writer.close()
            except (ConnectionError, OSError):
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_connections:
            writer.close()
            return
        self.open += 1
        self.connections += 1
        self._last = time.monotonic()
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.target)
        except OSError:
            writer.close()
            self.open -= 1
            return
        try:
            last: list = [None]  # which way the connection's bytes last went
            await asyncio.gather(self._pipe(reader, up_writer, True, last), self._pipe(up_reader, writer, False, last))
        finally:
            self.open -= 1

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        started = time.monotonic()
        async with server:
            while not self._stop.is_set():
                now = time.monotonic()
                if now - started > self.max_seconds:
                    break
                if self.idle_seconds and not self.open and now - self._last > self.idle_seconds:
                    break
                try:
                    await asyncio.wait_for(self._stop.wait(), 0.5)
                except asyncio.TimeoutError:
                    pass
            server.close()

    # -- in a thread ---------------------------------------------------------------------------
    def start(self) -> "WanProxy":
        """Serve in a daemon thread; returns once the port is open (``self.port``)."""
        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._main())
            pending = asyncio.all_tasks(loop)  # connections still open: end them before the loop
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="wan-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the WAN proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5)

    def __enter__(self) -> "WanProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=int, required=True, help="the SuperLink's port on 127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="the proxy's port (default: a free one)")
    p.add_argument("--rtt-ms", type=float, default=50.0, help="round-trip time to add, ms")
    p.add_argument("--mbit", type=float, default=0.0, help="rate limit per direction and connection, Mbit/s (0: none)")
    p.add_argument("--max-connections", type=int, default=64)
    p.add_argument("--max-seconds", type=float, default=900.0, help="stop after this long")
    p.add_argument("--idle-seconds", type=float, default=0.0, help="stop after this long without a connection")
    args = p.parse_args()
    proxy = WanProxy(args.target, args.rtt_ms, args.mbit, args.port, args.max_connections, args.max_seconds,
                     args.idle_seconds)
    asyncio.run(_announce(proxy))


async def _announce(proxy: WanProxy) -> None:
    task = asyncio.ensure_future(proxy._main())
    await asyncio.get_running_loop().run_in_executor(None, proxy._ready.wait, 10)
    print(f"wan-proxy: 127.0.0.1:{proxy.port} -> 127.0.0.1:{proxy.target}, rtt {proxy.delay * 2000:g} ms, "
          f"{proxy.rate * 8 / 1e6:g} Mbit/s per direction, stops after {proxy.max_seconds:g} s", flush=True)
    await task


if __name__ == "__main__":
    main()
