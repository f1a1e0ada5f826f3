"""A collector behind SECURE_SSL_REDIRECT (RUNWATCH_HTTPS=true), or a TLS proxy, answers a
plain-http POST with a redirect. urllib would follow it as a GET without the batch, the API would
refuse that GET (405), and the plugin would drop the batch as refused. The plugin must not follow
it: it keeps the batch, says which address to use, and delivers once the answer changes."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer_plugin import Monitor


@pytest.fixture
def redirecting_collector():
    """Redirects the first POST to /moved (where a GET gets a 405, as from the real API), then
    accepts every batch."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _answer(self, status: int, body: dict, **headers: str) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            seen.append(("GET", self.path))
            self._answer(405, {"error": "use POST with a JSON batch"})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(("POST", self.path))
            if len(seen) == 1:
                host = f"127.0.0.1:{self.server.server_address[1]}"
                self._answer(301, {}, Location=f"http://{host}/moved")
            else:
                self._answer(202, {"batch_id": "x", "rows": 1})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                     daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_a_redirect_keeps_the_batch_and_names_the_new_address(redirecting_collector, tmp_path,
                                                               caplog):
    url, seen = redirecting_collector
    monitor = Monitor("llm", "redirected", url=url, token="rw_t", flush_interval_s=0.05,
                      spool_dir=tmp_path, capture_signals=False, gpu_sampling=False)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        for step in range(10):
            monitor.step(step, loss=1.0)
        assert monitor.close(timeout_s=20)

    assert seen[0] == ("POST", "/api/v1/ingest")
    assert ("GET", "/moved") not in seen  # never re-sent as a bodiless GET
    assert monitor.stats["rows_dropped"] == 0 and monitor.stats["batches_dropped"] == 0
    assert "/moved" in caplog.text  # the address to configure instead
