"""The redis:// transport puts Celery task messages on the real Redis named by CELERY_BROKER_URL,
in the list kombu uses for the `ingest` queue, where the collectors' worker picks them up."""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis
from kombu import compression, serialization

from trainer_plugin import Monitor
from trainer_plugin.protocol import validate_batch
from trainer_plugin.transports import (
    PermanentSendError,
    TransientSendError,
    broker,
    transport_for,
)
from trainer_plugin.transports.broker import BrokerTransport


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
        assert message["content-type"] == "application/json"
        assert message["headers"]["compression"] == "application/x-gzip"
        args, kwargs, _embed = json.loads(zlib.decompress(base64.b64decode(message["body"])))
        assert kwargs == {"token": "s3cret"}
        batch = validate_batch(args[0])
        steps += batch["steps"]["step"]
        kinds += [event["kind"] for event in batch["events"]]
    assert steps == [0, 1, 2]
    assert kinds == ["start", "finish"]


def _telemetry_batch(**extra) -> dict:
    """A batch with a minute of 8 GPUs' readings, digits as NVML gives them."""
    rng = random.Random(7)
    n = 8 * 60
    return {
        "v": 1, "batch_id": "b-1", "run": {"project": "llm", "name": "r", "attempt": 0, **extra},
        "source": {"host": "node1", "rank": 0, "local_rank": 0, "world_size": 8},
        "steps": {"step": [0], "ts": [1.7e9], "duration_s": [1.0123456789], "tokens": [4096],
                  "metrics": {"loss": [2.2345678901234]}},
        "gpus": {"ts": [1.7e9 + i // 8 + rng.random() / 200 for i in range(n)],
                 "gpu": [i % 8 for i in range(n)],
                 "temp_c": [float(rng.randint(55, 82)) for _ in range(n)],
                 "power_w": [rng.randint(380_000, 700_000) / 1000 for _ in range(n)],
                 "util_pct": [float(rng.choice([100, 99, 0])) for _ in range(n)],
                 "mem_used_mb": [float(rng.randint(30_000, 38_000)) for _ in range(n)],
                 "sm_clock_mhz": [1980.0 - 15 * rng.randint(0, 7) for _ in range(n)],
                 "throttle": [0] * n, "simulated": False},
        "events": [],
    }


def test_batches_travel_compressed_and_decode_with_celerys_own_codecs(
        private_broker_url, ingest_list) -> None:
    # An integer beyond 64 bits is more than orjson writes: kombu's JSON writes that message.
    sent = [_telemetry_batch(), _telemetry_batch(config={"seed": 2**70})]
    transport = BrokerTransport(private_broker_url, "s3cret")
    for batch in sent:
        transport.send(batch)
    transport.close()

    for batch, message in zip(sent, _messages(ingest_list), strict=True):
        body = base64.b64decode(message["body"])
        plain = json.dumps([[batch], {"token": "s3cret"}, {}]).encode()
        assert len(body) < len(plain) / 2
        # What a worker does with it: kombu's registered decompressor and JSON decoder.
        args, kwargs, _ = serialization.loads(
            compression.decompress(body, message["headers"]["compression"]),
            message["content-type"], message["content-encoding"])
        assert args == [batch] and kwargs == {"token": "s3cret"}


def test_batches_go_compressed_with_zstd_to_their_own_queue_while_zstd_readers_run(
        private_broker_url, ingest_list, monkeypatch) -> None:
    monkeypatch.setattr(broker, "ZSTD_CHECK_INTERVAL_S", 0.0)  # look up the key at every send
    ingest_list.delete(broker.ZSTD_QUEUE, broker.ZSTD_READERS_KEY)
    transport = BrokerTransport(private_broker_url, "s3cret")
    sent = [_telemetry_batch(), _telemetry_batch(), _telemetry_batch()]
    transport.send(sent[0])  # no worker reads zstd: zlib, on the queue every worker reads
    ingest_list.set(broker.ZSTD_READERS_KEY, "worker@host", ex=60)
    transport.send(sent[1])
    ingest_list.delete(broker.ZSTD_READERS_KEY)  # the last of them stopped: zlib again
    transport.send(sent[2])
    transport.close()

    zstd_messages = [json.loads(raw) for raw in ingest_list.lrange(broker.ZSTD_QUEUE, 0, -1)]
    assert [m["headers"]["compression"] for m in _messages(ingest_list)] == [
        "application/x-gzip", "application/x-gzip"]
    (message,) = zstd_messages
    assert message["headers"]["compression"] == "application/zstd"
    assert message["properties"]["delivery_info"]["routing_key"] == broker.ZSTD_QUEUE
    body = base64.b64decode(message["body"])
    assert len(body) < len(zlib.compress(json.dumps([[sent[1]], {"token": "s3cret"}, {}]).encode(), 1))
    args, kwargs, _ = serialization.loads(compression.decompress(body, "application/zstd"),
                                          message["content-type"], message["content-encoding"])
    assert args == [sent[1]] and kwargs == {"token": "s3cret"}
    ingest_list.delete(broker.ZSTD_QUEUE)


def test_the_zstd_readers_key_is_looked_up_once_a_minute(private_broker_url, ingest_list) -> None:
    transport = BrokerTransport(private_broker_url, "t")
    transport.send({"v": 1, "batch_id": "x"})
    ingest_list.set(broker.ZSTD_READERS_KEY, "worker@host", ex=60)
    try:
        transport.send({"v": 1, "batch_id": "y"})  # within the minute: still zlib on ingest
        assert len(_messages(ingest_list)) == 2
        assert ingest_list.llen(broker.ZSTD_QUEUE) == 0
    finally:
        ingest_list.delete(broker.ZSTD_READERS_KEY, broker.ZSTD_QUEUE)
        transport.close()


def test_the_batch_codec_leaves_kombus_json_as_it_was() -> None:
    from trainer_plugin.transports import message_codec

    message_codec.options()
    # Other Celery apps in the training process still write kombu's JSON, types and all.
    content_type, _, body = serialization.dumps({"at": datetime(2026, 1, 2, tzinfo=UTC)}, "json")
    assert serialization.registry.type_to_name[content_type] == "json"
    assert serialization.loads(body, content_type, "utf-8") == {
        "at": datetime(2026, 1, 2, tzinfo=UTC)}


def test_batches_go_out_without_orjson(private_broker_url, ingest_list) -> None:
    code = (
        "import sys\n"
        "sys.modules['orjson'] = None  # the broker extra without it\n"
        "from trainer_plugin.transports.broker import BrokerTransport\n"
        f"t = BrokerTransport({private_broker_url!r}, 't')\n"
        "t.send({'v': 1, 'batch_id': 'x', 'n': [1.5, 2]})\n"
        "t.close()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    (message,) = _messages(ingest_list)
    args, _, _ = json.loads(zlib.decompress(base64.b64decode(message["body"])))
    assert args == [{"v": 1, "batch_id": "x", "n": [1.5, 2]}]


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
