"""A real HTTP collector stand-in on loopback: it decompresses, decodes and validates every batch
exactly as the ingest API does, records it, and answers what the test scripted (202 by default)."""

from __future__ import annotations

import copy
import gzip
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trainer_plugin.protocol import ProtocolError, validate_batch

RUNWATCH_VARS = ("RUNWATCH_PROJECT", "RUNWATCH_RUN", "RUNWATCH_URL", "RUNWATCH_TOKEN",
                 "RUNWATCH_ATTEMPT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                 "TORCHELASTIC_RESTART_COUNT", "RUNWATCH_MODE", "RUNWATCH_SPOOL_DIR",
                 "RUNWATCH_SPOOL_MAX_MB", "RUNWATCH_GPU_SAMPLING")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    batch: dict[str, Any] | None
    status: int
    at: float
    error: str | None = None


@dataclass
class Collector:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    # (status, headers, body) answers to give, in order; 202 once they run out.
    script: deque = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # While True, every request gets a 503: the collector is away.
    down: bool = False

    def answer(self, status: int, headers: dict[str, str] | None = None,
               error: str | None = None, times: int = 1) -> None:
        body = json.dumps({"error": error}).encode() if error else b"{}"
        for _ in range(times):
            self.script.append((status, headers or {}, body))

    @property
    def accepted(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.batch for r in self.received if r.status == 202 and r.batch is not None]

    def steps(self) -> dict[str, list]:
        """All accepted step rows, concatenated column by column."""
        out: dict[str, list] = {"step": [], "ts": [], "duration_s": [], "tokens": []}
        metrics: dict[str, list] = {}
        for batch in self.accepted:
            table = batch["steps"]
            n = len(table["step"])
            for name in out:
                out[name].extend(table[name])
            for name in set(metrics) | set(table["metrics"]):
                column = metrics.setdefault(name, [None] * (len(out["step"]) - n))
                column.extend(table["metrics"].get(name, [None] * n))
        out.update({f"metrics.{name}": column for name, column in metrics.items()})
        return out

    def events(self) -> list[dict[str, Any]]:
        return [event for batch in self.accepted for event in batch["events"]]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            headers = {name.lower(): value for name, value in self.headers.items()}
            batch, error = None, None
            try:
                body = gzip.decompress(raw) if headers.get("content-encoding") == "gzip" else raw
                batch = json.loads(body)
                validate_batch(copy.deepcopy(batch))
            except (ProtocolError, ValueError, OSError) as exc:
                error = str(exc)
            with collector.lock:
                status, extra, reply = (collector.script.popleft() if collector.script
                                        else (202, {}, b"{}"))
                if collector.down:
                    status, extra, reply = 503, {}, b'{"error": "down for the test"}'
                if error is not None:
                    status, extra, reply = 400, {}, json.dumps({"error": error}).encode()
                collector.received.append(Received(self.path, headers, batch, status,
                                                   time.monotonic(), error))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply)

    return Handler


@pytest.fixture
def collector() -> Iterator[Collector]:
    result = Collector()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(result))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    result.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield result
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Each test starts from an environment without Runwatch or torchrun variables, with its own
    empty spool directory and without a GPU sampler (tests that want one ask for it)."""
    for name in RUNWATCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUNWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("RUNWATCH_GPU_SAMPLING", "0")


@pytest.fixture
def closed_port_url() -> str:
    """An http URL on which nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
