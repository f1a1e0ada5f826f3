"""The Celery worker as production starts it (docker-compose.yml): every task is routed to a queue
that worker consumes, it stores what the plugin's broker transport sends, and it keeps one
PostgreSQL connection across batches yet survives that connection being killed.

Each test has a redis-server of its own, so the session's e2e worker cannot take its messages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from django.db import connection

from collectors import zstd_ingest
from collectors.models import GpuSample, IngestedBatch, IngestToken, Project, RejectedBatch, StepMetric
from dashboard.celery import app
from tests.e2e.conftest import ROOT, wait_for
from trainer_plugin import protocol
from trainer_plugin.transports import broker
from trainer_plugin.transports.broker import BrokerTransport

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
WORKER_APP_NAME = "runwatch-settings-test"


def compose_worker_command() -> list[str]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return list(compose["services"]["worker"]["command"])


def consumed_queues(command: list[str]) -> set[str]:
    return set(command[command.index("-Q") + 1].split(","))


def test_every_task_is_routed_to_a_queue_the_production_worker_consumes() -> None:
    app.loader.import_default_modules()
    tasks = sorted(name for name in app.tasks if not name.startswith("celery."))
    assert "collectors.ingest_batch" in tasks and "alerts.deliver" in tasks
    queues = consumed_queues(compose_worker_command())
    routed = {name: app.amqp.router.route({}, name)["queue"].name for name in tasks}
    # Telemetry has a queue of its own, so a backlog of batches never delays alerts and stalls.
    assert routed["collectors.ingest_batch"] == "ingest"
    assert routed["collectors.detect_stalls"] != "ingest"
    assert routed["alerts.deliver"] != "ingest"
    assert {name: queue for name, queue in routed.items() if queue not in queues} == {}


class Worker:
    """``celery -A dashboard worker`` with the given arguments, as a child process."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dashboard", *args,
             "-n", f"settings-{os.getpid()}-{time.monotonic_ns()}@%h"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: b" ready." in log_path.read_bytes() or self.process.poll() is not None,
                 timeout=90, what="the Celery worker to start")
        assert self.process.poll() is None, self.output()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def start_worker(worker_env, private_broker_url, tmp_path) -> Iterator:
    started: list[Worker] = []

    def start(args: list[str], **settings: str) -> Worker:
        # Named sessions: other tests' workers may hold sessions on the same test database.
        env = dict(worker_env, CELERY_BROKER_URL=private_broker_url,
                   DATABASE_URL=f"{worker_env['DATABASE_URL']}?application_name={WORKER_APP_NAME}",
                   **settings)
        worker = Worker(args, env, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def transport(private_broker_url, transactional_db) -> Iterator[BrokerTransport]:
    project = Project.objects.create(slug="llm")
    sender = BrokerTransport(private_broker_url, IngestToken.issue(project)[1])
    yield sender
    sender.close()


def host_batch(host: str, first_second: int, seconds: int = 5, gpus: int = 8) -> dict:
    """What a host's local rank 0 sends: its steps and its GPUs' samples at 1 Hz."""
    t0 = 1_700_000_000.0 + first_second
    rows = seconds * gpus
    return protocol.make_batch(
        run={"project": "llm", "name": "scale", "attempt": 0},
        source={"host": host, "rank": 0, "local_rank": 0, "world_size": 8},
        steps={"step": list(range(first_second, first_second + seconds)),
               "ts": [t0 + s for s in range(seconds)], "duration_s": [1.0] * seconds,
               "tokens": [4096] * seconds, "metrics": {"loss": [2.0] * seconds}},
        gpus={"ts": [t0 + i // gpus for i in range(rows)], "gpu": [i % gpus for i in range(rows)],
              "temp_c": [65.0] * rows, "power_w": [600.0] * rows, "util_pct": [99.0] * rows,
              "mem_used_mb": [70_000.0] * rows, "sm_clock_mhz": [1980.0] * rows,
              "throttle": [0] * rows, "simulated": False})


def stored(batch: dict) -> bool:
    return IngestedBatch.objects.filter(batch_id=batch["batch_id"]).exists()


def worker_backends() -> set[int]:
    """The PostgreSQL sessions of this test's worker."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = %s", [WORKER_APP_NAME])
        return {pid for (pid,) in cursor.fetchall()}


def test_worker_started_as_in_production_stores_batches_from_the_broker_transport(
        start_worker, transport) -> None:
    command = compose_worker_command()
    assert command[:3] == ["celery", "-A", "dashboard"]
    worker = start_worker(command[3:])
    batches = [host_batch(f"node{h:03d}", 0) for h in range(6)]
    for batch in batches:
        transport.send(batch)
    # Work on the other queue (stall detection) is consumed by the same production worker.
    with app.connection_for_write(transport.url) as broker:
        app.send_task("collectors.detect_stalls", connection=broker)

    wait_for(lambda: all(stored(b) for b in batches), timeout=60,
             what=f"6 batches stored; worker log:\n{worker.output()}")
    assert GpuSample.objects.count() == 6 * 40
    assert StepMetric.objects.count() == 6 * 5
    assert set(GpuSample.objects.values_list("host", flat=True)) == {f"node{h:03d}" for h in range(6)}
    wait_for(lambda: "collectors.detect_stalls" in worker.output()
             and "succeeded" in worker.output().split("collectors.detect_stalls", 1)[1],
             timeout=30, what="the stall task to run on the production worker")
    assert not RejectedBatch.objects.exists()


def test_worker_keeps_its_database_connection_from_one_batch_to_the_next(
        start_worker, transport) -> None:
    start_worker(["worker", "-Q", "ingest,runwatch", "--concurrency", "1", "--loglevel", "INFO"])
    sessions = []
    for second in (0, 10, 20):
        batch = host_batch("node000", second)
        transport.send(batch)
        wait_for(lambda batch=batch: stored(batch), timeout=60, what="the batch to be stored")
        time.sleep(0.5)  # the task's own clean-up, after its commit
        sessions.append(worker_backends())
    # One pool process, one session kept open across all three batches (Celery alone would have
    # closed it after each task: no session left between batches).
    assert len(sessions[0]) == 1
    assert sessions[0] == sessions[1] == sessions[2]


def test_worker_reconnects_when_its_database_session_is_killed(start_worker, transport) -> None:
    start_worker(["worker", "-Q", "ingest,runwatch", "--concurrency", "1", "--loglevel", "INFO"])
    first = host_batch("node000", 0)
    transport.send(first)
    wait_for(lambda: stored(first), timeout=60, what="the first batch to be stored")
    time.sleep(0.5)
    before = worker_backends()
    assert before
    with connection.cursor() as cursor:
        for pid in before:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(lambda: not (worker_backends() & before), timeout=10, what="the session to end")

    second = host_batch("node000", 10)
    transport.send(second)
    wait_for(lambda: stored(second), timeout=60, what="the batch after the killed session")
    assert GpuSample.objects.count() == 80
    assert not RejectedBatch.objects.exists()
    assert worker_backends() and not (worker_backends() & before)


def test_a_drain_acknowledges_its_batches_in_one_round_trip(start_worker, transport) -> None:
    # A drain wait long enough for the twelve batches to arrive together.
    start_worker(["worker", "-Q", "ingest,runwatch", "--concurrency", "1", "--loglevel", "INFO"],
                 RUNWATCH_INGEST_DRAIN_WAIT_S="2")
    broker = redis.Redis.from_url(transport.url)
    broker.config_resetstat()
    batches = [host_batch(f"node{h:03d}", 0) for h in range(12)]
    for batch in batches:
        transport.send(batch)
    wait_for(lambda: all(stored(b) for b in batches), timeout=60, what="12 batches stored")
    wait_for(lambda: broker.hlen("unacked") == 0, timeout=10, what="every message acknowledged")

    stats = broker.info("commandstats")
    # Each message is copied into the unacked hash in a transaction of its own (kombu's, on
    # receipt) and acknowledged by a ZREM and an HDEL; the drain sends all its acknowledgements
    # in one more transaction, where one each would make 24.
    assert stats["cmdstat_zrem"]["calls"] == 12
    assert stats["cmdstat_hdel"]["calls"] == 12
    assert 12 < stats["cmdstat_exec"]["calls"] <= 12 + 3, stats["cmdstat_exec"]
    assert GpuSample.objects.count() == 12 * 40
    assert not RejectedBatch.objects.exists()


def test_a_worker_that_decodes_zstd_reads_the_zstd_queue_and_tells_plugins(
        start_worker, transport) -> None:
    command = compose_worker_command()
    worker = start_worker(command[3:])
    client = redis.Redis.from_url(transport.url)
    assert client.get(broker.ZSTD_READERS_KEY), worker.output()
    assert 0 < client.ttl(broker.ZSTD_READERS_KEY) <= zstd_ingest.ADVERTISE_TTL_S
    client.config_resetstat()
    batches = [host_batch(f"node{h:03d}", 0) for h in range(4)]
    for batch in batches:
        transport.send(batch)

    wait_for(lambda: all(stored(b) for b in batches), timeout=60,
             what=f"4 zstd batches stored; worker log:\n{worker.output()}")
    # They went through the zstd queue: the plain one was never pushed to.
    pushed = client.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0)
    assert pushed == 4 and client.llen(broker.QUEUE) == 0
    assert GpuSample.objects.count() == 4 * 40
    assert not RejectedBatch.objects.exists()


def test_a_worker_that_does_not_read_zstd_is_never_handed_a_zstd_batch(
        start_worker, transport) -> None:
    # A fleet mid-upgrade: a newer worker elsewhere says it reads zstd; this one (zstd turned
    # off, as an older version or one without the package) reads only the plain queue.
    old = start_worker(["worker", "-Q", "ingest,runwatch", "--concurrency", "1",
                        "--loglevel", "INFO"], RUNWATCH_INGEST_ZSTD="false")
    client = redis.Redis.from_url(transport.url)
    assert client.get(broker.ZSTD_READERS_KEY) is None, old.output()
    client.set(broker.ZSTD_READERS_KEY, "newer@elsewhere", ex=60)
    batch = host_batch("node000", 0)
    transport.send(batch)
    time.sleep(3)  # several drain waits: the old worker would have stored or refused it by now
    assert client.llen(broker.ZSTD_QUEUE) == 1 and not stored(batch)
    assert not RejectedBatch.objects.exists()

    start_worker(["worker", "-Q", "ingest,runwatch", "--concurrency", "1", "--loglevel", "INFO"])
    wait_for(lambda: stored(batch), timeout=60, what="the zstd batch stored by a zstd reader")
    assert not RejectedBatch.objects.exists()
