"""The ingest task's write path against the real PostgreSQL (binary COPY), called directly."""

from __future__ import annotations

import copy
import time

import pytest

from collectors.models import (
    Attempt,
    Checkpoint,
    Event,
    GpuSample,
    IngestedBatch,
    IngestToken,
    RejectedBatch,
    Run,
    StepMetric,
)
from collectors.tasks import ingest_batch
from tests.batches import step_batch


def test_batch_rows_land_in_their_tables_with_their_values(token):
    batch = step_batch(count=5, gpus=2, first_step=100)
    result = ingest_batch(copy.deepcopy(batch), token=token)

    assert result["stored"] is True
    run = Run.objects.get(name="run-1")
    rows = list(StepMetric.objects.filter(run=run).order_by("step"))
    assert [r.step for r in rows] == [100, 101, 102, 103, 104]
    assert rows[0].loss == pytest.approx(1.0)
    assert rows[0].lr == pytest.approx(3e-4)
    assert rows[0].tokens == 4096
    assert rows[0].duration_s == 0.5
    assert rows[0].extra == {"accuracy": pytest.approx(0.6)}
    assert rows[0].ts.timestamp() == pytest.approx(batch["steps"]["ts"][0], abs=1e-6)
    gpus = list(GpuSample.objects.filter(run=run).order_by("gpu"))
    assert [(g.gpu, g.temp_c, g.host) for g in gpus] == [(0, 60.0, "node000"), (1, 61.0, "node000")]
    assert run.last_step == 104
    assert run.world_size == 2
    assert run.config == {"lr": 3e-4}


def test_duplicate_batch_is_stored_once(token):
    batch = step_batch(count=7, events=[{"kind": "heartbeat", "ts": time.time()}])
    results = [ingest_batch(copy.deepcopy(batch), token=token) for _ in range(3)]

    assert [r["stored"] for r in results] == [True, False, False]
    assert StepMetric.objects.count() == 7
    assert Event.objects.count() == 1
    assert IngestedBatch.objects.count() == 1


def test_two_ranks_fold_into_one_run_and_attempt(token):
    ingest_batch(step_batch(rank=0, count=10), token=token)
    ingest_batch(step_batch(rank=1, count=12), token=token)

    run = Run.objects.get()
    assert run.attempts.count() == 1
    assert sorted(StepMetric.objects.values_list("rank", flat=True).distinct()) == [0, 1]
    assert run.last_step == 11


def test_last_step_never_moves_backwards_when_batches_arrive_out_of_order(token):
    ingest_batch(step_batch(first_step=50, count=10), token=token)
    ingest_batch(step_batch(first_step=0, count=10), token=token)

    assert Run.objects.get().last_step == 59


def test_start_and_finish_events_set_attempt_and_run_status(token):
    now = time.time()
    ingest_batch(step_batch(count=3, t0=now, events=[{"kind": "start", "ts": now - 5, "pid": 1}]),
                 token=token)
    run = Run.objects.get()
    assert run.status == Run.Status.RUNNING
    attempt = Attempt.objects.get()
    assert attempt.started_at.timestamp() == pytest.approx(now - 5)

    ingest_batch(step_batch(count=0, events=[{"kind": "finish", "ts": now + 10, "status": "finished"}]),
                 token=token)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert run.status == Run.Status.FINISHED
    assert attempt.ended_at.timestamp() == pytest.approx(now + 10)


def test_failure_on_any_rank_marks_the_run_failed(token):
    now = time.time()
    ingest_batch(step_batch(rank=3, world_size=4, count=0,
                            events=[{"kind": "finish", "ts": now, "status": "failed"}]), token=token)
    assert Run.objects.get().status == Run.Status.FAILED


def test_interruption_then_restart_marks_running_again(token):
    now = time.time()
    ingest_batch(step_batch(attempt=0, count=0, events=[
        {"kind": "interruption", "ts": now, "exc_type": "RuntimeError", "message": "NCCL timeout"}]),
        token=token)
    run = Run.objects.get()
    assert run.status == Run.Status.INTERRUPTED
    assert Attempt.objects.get(number=0).exit_reason == "RuntimeError"

    ingest_batch(step_batch(attempt=1, count=2, events=[{"kind": "start", "ts": now + 60}]), token=token)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert run.attempts.count() == 2


def test_checkpoint_events_become_checkpoint_rows(token):
    now = time.time()
    ingest_batch(step_batch(count=0, events=[
        {"kind": "checkpoint_save", "ts": now, "step": 1000, "duration_s": 12.5, "bytes": 2_000_000,
         "path": "/ckpt/step1000"},
        {"kind": "checkpoint_load", "ts": now + 100, "step": 1000, "path": "/ckpt/step1000"},
    ]), token=token)

    saves = Checkpoint.objects.filter(kind="save")
    assert [(c.step, c.duration_s, c.bytes, c.path) for c in saves] == [
        (1000, 12.5, 2_000_000, "/ckpt/step1000")]
    assert Checkpoint.objects.filter(kind="load", step=1000).count() == 1


def test_invalid_batch_is_rejected_with_its_reason_and_writes_nothing(token):
    batch = step_batch(count=3)
    batch["steps"]["ts"].pop()

    result = ingest_batch(batch, token=token)

    assert "equal lengths" in result["rejected"]
    assert StepMetric.objects.count() == 0
    assert Run.objects.count() == 0
    rejected = RejectedBatch.objects.get()
    assert rejected.batch_id == batch["batch_id"]
    assert rejected.field == "steps.ts"


def test_token_of_another_project_cannot_write(token, other_token):
    result = ingest_batch(step_batch(project="llm"), token=other_token)

    assert "belongs to project 'vision'" in result["rejected"]
    assert StepMetric.objects.count() == 0
    assert Run.objects.count() == 0


def test_revoked_token_cannot_write(token):
    IngestToken.objects.update(revoked_at="2026-01-01T00:00:00Z")

    result = ingest_batch(step_batch(), token=token)

    assert "not valid or has been revoked" in result["rejected"]
    assert StepMetric.objects.count() == 0


def test_tokens_are_stored_only_as_hashes(token):
    stored = IngestToken.objects.get()
    assert token not in (stored.hashed, stored.prefix)
    assert token.startswith(stored.prefix)
    assert IngestToken.objects.authenticate(token) == stored
    assert IngestToken.objects.authenticate(token[:-1] + "x") is None


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_moves_no_progress_does_not_wait_for_another_workers_batch(token):
    """Workers storing one run must not take turns on the run's row: a batch whose steps are all
    older than what is committed leaves the row alone, so it does not wait for a concurrent
    batch that holds the row's lock until it commits."""
    import threading

    from django.db import connection, transaction

    from collectors.ingest import store_batch
    from collectors.models import Project
    from trainer_plugin.protocol import validate_batch

    project_id = Project.objects.get(slug="llm").pk
    now = time.time()
    ingest_batch(step_batch(rank=0, first_step=100, count=100, t0=now - 100), token=token)
    holding, release = threading.Event(), threading.Event()

    def newer_batch_held_open():
        try:
            with transaction.atomic():
                store_batch(validate_batch(step_batch(rank=0, first_step=200, count=10, t0=now)),
                            project_id)
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    worker = threading.Thread(target=newer_batch_held_open)
    worker.start()
    try:
        assert holding.wait(30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '3s'")
            result = store_batch(
                validate_batch(step_batch(rank=1, first_step=0, count=10, t0=now - 60)),
                project_id)
        assert result.stored
    finally:
        release.set()
        worker.join(30)
    run = Run.objects.get()
    assert run.last_step == 209
    assert StepMetric.objects.count() == 120


def test_a_run_deleted_between_batches_is_created_again(token):
    """The worker remembers run and attempt ids; a run deleted since must not swallow batches."""
    ingest_batch(step_batch(count=3), token=token)
    Run.objects.all().delete()

    result = ingest_batch(step_batch(count=4), token=token)

    assert result["stored"] is True
    assert Run.objects.get().pk == result["run_id"]
    assert StepMetric.objects.filter(run_id=result["run_id"]).count() == 4
    assert Attempt.objects.get().run_id == result["run_id"]


def test_a_run_created_in_a_rolled_back_transaction_is_not_remembered(token):
    from django.db import transaction

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        ingest_batch(step_batch(count=3), token=token)
        raise Abort

    result = ingest_batch(step_batch(count=5), token=token)

    assert result["stored"] is True
    assert StepMetric.objects.filter(run__name="run-1").count() == 5
    assert StepMetric.objects.count() == 5


def test_a_token_revoked_after_use_is_refused_from_the_next_batch(token):
    """The worker remembers which row a token is, never that it is valid."""
    assert ingest_batch(step_batch(count=2), token=token)["stored"] is True
    IngestToken.objects.update(revoked_at="2026-01-01T00:00:00Z")

    result = ingest_batch(step_batch(count=3), token=token)

    assert "not valid or has been revoked" in result["rejected"]
    assert StepMetric.objects.count() == 2


def test_a_token_used_again_keeps_its_project_and_last_use(token, other_token):
    assert ingest_batch(step_batch(count=2), token=token)["stored"] is True
    IngestToken.objects.update(last_used_at=None)

    assert ingest_batch(step_batch(count=2), token=token)["stored"] is True
    refused = ingest_batch(step_batch(project="vision"), token=token)

    assert "belongs to project 'llm'" in refused["rejected"]
    assert IngestToken.objects.get(project__slug="llm").last_used_at is not None
    assert IngestToken.objects.get(project__slug="vision").last_used_at is None


def test_each_stored_batch_records_its_rank_host_and_local_rank(token):
    ingest_batch(step_batch(rank=9, world_size=16, count=2), token=token)  # first: creates the run
    ingest_batch(step_batch(rank=3, world_size=16, count=4, gpus=2), token=token)  # cached ids

    assert sorted(IngestedBatch.objects.values_list(
        "rank", "host", "local_rank", "steps", "gpu_samples", "events")) == [
        (3, "node000", 3, 4, 2, 0), (9, "node001", 1, 2, 0, 0)]
