"""Nothing lost: the broker dies in the middle of a 2-rank torchrun run and comes back; every step
of both ranks and every event is stored exactly once, and training never noticed.

The broker is our own redis-server on a free port (the shared one is never touched), with an
append-only file fsynced on every write: a broker that acknowledged a batch must still have it
after a crash, or the promise could not hold for any client. Its own Celery worker consumes it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db.models import Count, Sum

from collectors.models import Event, IngestedBatch, IngestToken, Project, Run, StepMetric
from tests.e2e.conftest import ROOT, WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

STEPS = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, port: int, directory: Path):
        self.port = port
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, timeout=30, what=f"redis-server on port {self.port}")

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=1).ping())
        except redis.exceptions.ConnectionError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture
def own_broker(tmp_path):
    server = RedisServer(free_port(), tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_worker(own_broker, worker_env, tmp_path):
    # Redelivery of what a worker had reserved when the broker died comes after the visibility
    # timeout; a short one keeps the test short (a redelivered batch is stored once anyway).
    env = dict(worker_env, CELERY_BROKER_URL=own_broker.url, CELERY_VISIBILITY_TIMEOUT="5")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def token(transactional_db) -> str:
    return IngestToken.issue(Project.objects.create(slug="demo"))[1]


def stored(run_name: str) -> int:
    return StepMetric.objects.filter(run__name=run_name).count()


def supervised(worker: WorkerProcess, condition):
    """``condition``, restarting the worker if it has exited meanwhile, as the production compose
    file's `restart: unless-stopped` does. (Celery 5.7's worker can die of an AttributeError while
    closing its connection to a broker that vanished, cf. celery/kombu#582; that is the
    collectors' side, and what it costs them is a restart, not data: the batches it had reserved
    are redelivered after the visibility timeout and stored once.)"""
    def check():
        if worker.process is not None and worker.process.poll() is not None:
            worker.restarts = getattr(worker, "restarts", 0) + 1
            worker.start()
        return condition()
    return check


@pytest.mark.timeout(900)
def test_broker_dies_mid_run_and_every_step_and_event_arrives_exactly_once(
        own_broker, own_worker, token, tmp_path) -> None:
    run_name = "outage"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1", "RUNWATCH_URL": own_broker.url, "RUNWATCH_TOKEN": token,
           "RUNWATCH_GPU_SAMPLING": "0"}
    log_path = tmp_path / "torchrun.log"
    with log_path.open("w") as log:
        training = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
             "examples/train_tiny.py", "--steps", str(STEPS), "--project", "demo",
             "--run-name", run_name, "--log-every", "10"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: stored(run_name) >= 20 or training.poll() is not None, timeout=300,
                     what="the first steps stored")
            assert training.poll() is None, log_path.read_text()[-3000:]
            own_broker.kill()
            killed_at = stored(run_name)
            time.sleep(5)
            own_broker.start()  # same port, same append-only file
            wait_for(supervised(own_worker, lambda: training.poll() is not None), timeout=600,
                     what="training to finish")
            assert training.returncode == 0, log_path.read_text()[-3000:]
        finally:
            if training.poll() is None:
                training.kill()
                training.wait()
    output = log_path.read_text()
    # The plugin did see the outage (and said where it kept the batches meanwhile).
    assert "Runwatch: cannot deliver metrics" in output, output[-3000:]
    assert killed_at < 2 * STEPS  # the broker died with training still to do

    wait_for(supervised(own_worker, lambda: stored(run_name) >= 2 * STEPS
                        and Event.objects.filter(run__name=run_name, kind="finish").count() == 2),
             timeout=240, what=f"{2 * STEPS} steps and both finishes")
    time.sleep(12)  # past the visibility timeout: a late redelivery would show up as a duplicate
    run = Run.objects.get(name=run_name)
    for rank in (0, 1):
        per_step = dict(StepMetric.objects.filter(run=run, rank=rank).values("step")
                        .annotate(n=Count("id")).values_list("step", "n"))
        assert sorted(per_step) == list(range(STEPS)), rank
        assert set(per_step.values()) == {1}, f"rank {rank} has duplicated steps"
    batches = IngestedBatch.objects.filter(run=run).aggregate(steps=Sum("steps"), events=Sum("events"))
    assert batches["steps"] == 2 * STEPS  # each stored batch's rows, once
    assert Event.objects.filter(run=run).count() == batches["events"]
    assert Event.objects.filter(run=run, kind="start").count() == 2
    assert Event.objects.filter(run=run, kind="finish").count() == 2
    heartbeats = list(Event.objects.filter(run=run, kind="heartbeat").values_list("rank", "ts"))
    assert len(heartbeats) == len(set(heartbeats))
    # Everything spooled during the outage was replayed and removed.
    spool = tmp_path / ".cache" / "runwatch" / "spool" / "demo" / run_name
    assert not list(spool.rglob("*.json.gz"))
    assert run.status == Run.Status.FINISHED
    print(f"outage: broker killed with {killed_at} step rows stored; stored in the end "
          f"{StepMetric.objects.filter(run=run).count()} step rows in "
          f"{IngestedBatch.objects.filter(run=run).count()} batches, "
          f"{batches['events']} events ({len(heartbeats)} heartbeats); "
          f"worker restarts: {getattr(own_worker, 'restarts', 0)}")
