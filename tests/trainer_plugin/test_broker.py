"""The redis:// transport puts Celery task messages on the real Redis named by CELERY_BROKER_URL,
in the list kombu uses for the `ingest` queue, where the collectors' worker picks them up."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis

from trainer_plugin import Monitor
from trainer_plugin.protocol import validate_batch
from trainer_plugin.transports import PermanentSendError, TransientSendError, transport_for
from trainer_plugin.transports.broker import BrokerTransport


@pytest.fixture
def private_broker_url(tmp_path) -> Iterator[str]:
    """A redis-server of this test's own: in a whole-suite run the end-to-end tests' Celery worker
    (pytest-django runs them first) consumes the shared broker's `ingest` queue, and would take
    the messages this test reads."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=1)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.kill()
        server.wait()


@pytest.fixture
def ingest_list(private_broker_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(private_broker_url)
    client.delete("ingest")
    try:
        yield client
    finally:
        client.delete("ingest")
        client.close()


def _messages(client: redis.Redis) -> list[dict]:
    # kombu LPUSHes and consumers BRPOP, so the oldest message is at the right end.
    return [json.loads(raw) for raw in reversed(client.lrange("ingest", 0, -1))]


def test_monitor_sends_celery_tasks_to_the_ingest_queue(private_broker_url, ingest_list) -> None:
    monitor = Monitor("llm", "llama-8b", url=private_broker_url, token="s3cret",
                      flush_interval_s=0.05)
    for _ in range(3):
        monitor.step(tokens=10, loss=1.0)
    assert monitor.close(timeout_s=10)

    messages = _messages(ingest_list)
    assert messages
    steps, kinds = [], []
    for message in messages:
        assert message["headers"]["task"] == "collectors.ingest_batch"
        assert message["properties"]["delivery_info"]["routing_key"] == "ingest"
        assert "s3cret" not in message["headers"]["kwargsrepr"]
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        assert kwargs == {"token": "s3cret"}
        batch = validate_batch(args[0])
        steps += batch["steps"]["step"]
        kinds += [event["kind"] for event in batch["events"]]
    assert steps == [0, 1, 2]
    assert kinds == ["start", "finish"]


def test_unreachable_broker_is_a_transient_error() -> None:
    # CELERY_BROKER_URL names a live Redis in this suite: Celery's default connection would pick
    # it over the URL given, and this send would wrongly succeed there.
    transport = transport_for("redis://127.0.0.1:1/11", "t")
    with pytest.raises(TransientSendError, match="cannot reach the broker"):
        transport.send({"v": 1, "batch_id": "x"})


def test_unreachable_broker_never_raises_into_training() -> None:
    monitor = Monitor("llm", "r", url="redis://127.0.0.1:1/11", token="t", flush_interval_s=0.05)
    monitor.step(loss=1.0)
    assert monitor.close(timeout_s=2) is False


def test_broker_password_is_not_logged() -> None:
    transport = BrokerTransport("redis://user:hunter2@127.0.0.1:1/11", "t")
    with pytest.raises(TransientSendError) as caught:
        transport.send({"v": 1, "batch_id": "x"})
    assert "hunter2" not in str(caught.value)


def test_missing_celery_is_a_permanent_error_saying_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['celery'] = None  # as if not installed\n"
        "from trainer_plugin.transports import PermanentSendError, transport_for\n"
        "try:\n"
        "    transport_for('redis://127.0.0.1:6379/11', 't').send({'v': 1})\n"
        "except PermanentSendError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pip install 'runwatch[broker]'" in result.stdout
    assert PermanentSendError  # the type the sender drops on, checked above by message
