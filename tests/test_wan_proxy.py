"""scripts/wan_proxy.py: the loopback proxy that adds a round-trip time and a rate limit."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from wan_proxy import WanProxy  # noqa: E402


@pytest.fixture
def echo():
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def _round_trip(port: int, payload: bytes) -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        t0 = time.perf_counter()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(65536)
        assert got == payload
        return time.perf_counter() - t0


def test_the_proxy_adds_the_round_trip_time_and_limits_the_rate(echo):
    with WanProxy(echo, rtt_ms=0) as fast:
        base = _round_trip(fast.port, b"x")
    with WanProxy(echo, rtt_ms=120) as slow:
        assert 0.12 <= _round_trip(slow.port, b"x") < 0.12 + base + 0.3
        assert slow.turns == 1  # one request that waited for its answer
    with WanProxy(echo, rtt_ms=0, mbit=1.0) as thin:  # 125 kB/s each way: 50 kB there and back ~0.8 s
        assert _round_trip(thin.port, b"y" * 50_000) >= 0.7


def test_the_proxy_stays_on_loopback_and_stops_by_itself(echo):
    with pytest.raises(ValueError, match="loopback only"):
        WanProxy(echo, host="8.8.8.8")
    proxy = WanProxy(echo, max_seconds=0.5).start()
    time.sleep(1.5)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).recv(1)
