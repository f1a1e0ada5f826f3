"""The vertical slice for real: the plugin in a training process → HTTP API or Redis broker →
a Celery worker process → PostgreSQL, and the same batch delivered three times stored once."""

from __future__ import annotations

import copy
import gzip
import json
import math
import urllib.request

import pytest
from celery import Celery

from collectors.models import Event, IngestedBatch, IngestToken, Project, RejectedBatch, Run, StepMetric
from tests.batches import step_batch
from tests.e2e.conftest import wait_for
from trainer_plugin import Monitor

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def token(transactional_db) -> str:
    project = Project.objects.create(slug="llm")
    return IngestToken.issue(project)[1]


def train(monitor: Monitor, steps: int) -> None:
    for step in range(steps):
        monitor.step(loss=3.0 * math.exp(-step / 20), lr=1e-3, tokens=2048, grad_norm=1.5)


def stored_steps(run: str) -> int:
    return StepMetric.objects.filter(run__name=run).count()


def test_http_transport_streams_a_run_into_postgres(live_server, celery_worker_process, token):
    with Monitor(project="llm", run="over-http", url=live_server.url, token=token,
                 flush_interval_s=0.2) as monitor:
        train(monitor, 60)

    wait_for(lambda: Run.objects.filter(name="over-http", status="finished").exists()
             and stored_steps("over-http") == 60, what="60 steps and the finish")
    run = Run.objects.get(name="over-http")
    steps = list(StepMetric.objects.filter(run=run).order_by("step"))
    assert [s.step for s in steps] == list(range(60))
    assert steps[0].loss == pytest.approx(3.0)
    assert steps[59].tokens == 2048
    assert run.last_step == 59
    assert set(Event.objects.filter(run=run).values_list("kind", flat=True)) >= {"start", "finish"}


def test_broker_transport_streams_a_run_into_postgres(celery_worker_process, broker_url, token):
    with Monitor(project="llm", run="over-redis", url=broker_url, token=token,
                 flush_interval_s=0.2) as monitor:
        train(monitor, 40)

    wait_for(lambda: stored_steps("over-redis") == 40
             and Run.objects.filter(name="over-redis", status="finished").exists(),
             what="40 steps through the broker")
    assert StepMetric.objects.filter(run__name="over-redis", grad_norm=1.5).count() == 40


def _post(url: str, batch: dict, token: str) -> int:
    request = urllib.request.Request(
        f"{url}/api/v1/ingest", data=gzip.compress(json.dumps(batch).encode()), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Encoding": "gzip",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def test_same_batch_delivered_three_times_over_http_is_stored_once(live_server, celery_worker_process,
                                                                   token):
    batch = step_batch(run="http-dupes", count=25, events=[{"kind": "heartbeat", "ts": 1.0e9}])

    statuses = [_post(live_server.url, copy.deepcopy(batch), token) for _ in range(3)]

    assert statuses == [202, 202, 202]
    # The redeliveries may share the first delivery's transaction (a drain), so their log lines
    # can come before it commits: wait for both.
    wait_for(lambda: celery_worker_process.output().count(batch["batch_id"]) >= 2
             and stored_steps("http-dupes") > 0, what="the worker to see both redeliveries")
    assert stored_steps("http-dupes") == 25
    assert Event.objects.filter(run__name="http-dupes").count() == 1
    assert IngestedBatch.objects.filter(batch_id=batch["batch_id"]).count() == 1


def test_same_batch_delivered_three_times_through_the_broker_is_stored_once(celery_worker_process,
                                                                            broker_url, token):
    batch = step_batch(run="broker-dupes", count=30)
    # Not the current app: shared tasks in later tests must keep resolving to the project's app
    # (its queues and routes), or their batches go to a queue no worker reads.
    app = Celery(broker=broker_url, set_as_current=False)
    for _ in range(3):
        app.send_task("collectors.ingest_batch", args=[copy.deepcopy(batch)], kwargs={"token": token},
                      queue="ingest")

    wait_for(lambda: celery_worker_process.output().count(batch["batch_id"]) >= 2
             and stored_steps("broker-dupes") > 0, what="the worker to see both redeliveries")
    assert stored_steps("broker-dupes") == 30
    assert IngestedBatch.objects.filter(batch_id=batch["batch_id"]).count() == 1


def test_broker_batch_with_a_foreign_token_is_dead_lettered_not_written(celery_worker_process,
                                                                        broker_url, token):
    outsider = IngestToken.issue(Project.objects.create(slug="vision"))[1]
    batch = step_batch(project="llm", run="trespass", count=5)

    Celery(broker=broker_url, set_as_current=False).send_task(
        "collectors.ingest_batch", args=[batch], kwargs={"token": outsider}, queue="ingest")

    rejected = wait_for(lambda: RejectedBatch.objects.filter(batch_id=batch["batch_id"]).first(),
                        what="the rejection to be recorded")
    assert "cannot write into project 'llm'" in rejected.reason
    assert not Run.objects.filter(name="trespass").exists()


def test_batches_queued_together_are_stored_together_and_a_refused_one_sinks_none(
        celery_worker_process, broker_url, token):
    app = Celery(broker=broker_url, set_as_current=False)
    batches = [step_batch(run="drained", rank=rank, world_size=24, count=10) for rank in range(24)]
    bad = step_batch(run="drained", rank=99, count=3)
    bad["steps"]["step"][1] = "eleven"
    for batch in batches[:12] + [bad] + batches[12:]:
        app.send_task("collectors.ingest_batch", args=[batch], kwargs={"token": token},
                      queue="ingest")
    # Malformed messages in the same burst: refused one by one, never the drain as a whole.
    app.send_task("collectors.ingest_batch", args=["not a batch", token, "extra"], queue="ingest")
    app.send_task("collectors.ingest_batch", args=[], kwargs={"token": 42}, queue="ingest")

    wait_for(lambda: stored_steps("drained") == 240 and RejectedBatch.objects.count() == 3,
             what="the 24 good batches stored and the 3 bad messages refused")
    assert RejectedBatch.objects.filter(batch_id=bad["batch_id"]).exists()
    assert IngestedBatch.objects.filter(run__name="drained").count() == 24
    drains = [int(line.split("drained ")[1].split()[0])
              for line in celery_worker_process.output().splitlines()
              if "ingest messages in one" in line]
    # Sent back to back, the 25 messages reach the worker faster than it stores one: most of them
    # share a transaction with others.
    assert max(drains) > 1, drains
