"""Several batches stored in one transaction (collectors.ingest.store_batches, what a worker does
with the messages it drained together) against the same batches' raw rows: rows, rollups, run
progress and status come out as if each batch had been stored on its own."""

from __future__ import annotations

import copy
import random
import time

from collectors.ingest import authorize, store_batches
from collectors.models import (
    Attempt,
    Checkpoint,
    Event,
    GpuSample,
    IngestedBatch,
    Run,
    StepMetric,
)
from tests.batches import step_batch
from tests.collectors.rollup_data import (
    across_the_hour_batches,
    assert_rollups,
    expected_rollups,
    with_redeliveries,
)
from trainer_plugin.protocol import validate_batch


def store(token: str, batches: list[dict]) -> list:
    project_id = authorize(token, "llm").project_id
    return store_batches([(validate_batch(copy.deepcopy(b)), project_id) for b in batches])


def test_batches_stored_in_groups_have_the_rollups_of_their_raw_rows(token):
    """Two runs' batches (one straddling an hour), shuffled with a third delivered twice, stored in
    groups of 1 to 12: a group holds several ranks, hosts and runs, the same rank's minute split
    over batches, and a batch beside its own redelivery."""
    rng = random.Random(41)
    batches = across_the_hour_batches(rng)
    deliveries = with_redeliveries(rng, batches)
    groups = []
    while deliveries:
        size = rng.randint(1, 12)
        groups.append(deliveries[:size])
        deliveries = deliveries[size:]
    assert any(len({b["batch_id"] for b in g}) < len(g) for g in groups), "no in-group redelivery"
    stored = 0
    for group in groups:
        stored += sum(result.stored for result in store(token, group))

    assert stored == len(batches) == IngestedBatch.objects.count()
    for run in Run.objects.filter(name__in=["run-1", "run-h"]):
        assert StepMetric.objects.filter(run=run).count() == 4 * 8 * 50
        assert GpuSample.objects.filter(run=run).count() == 2 * 8 * 80
        assert_rollups(run, expected_rollups(run))


def test_each_result_says_whether_its_batch_was_stored(token):
    first = step_batch(rank=0, count=3, first_step=0)
    second = step_batch(rank=1, count=4, first_step=0)
    store(token, [first])

    results = store(token, [first, second, second, step_batch(run="run-2", count=2)])

    assert [r.stored for r in results] == [False, True, False, True]
    assert [r.steps for r in results] == [0, 4, 0, 2]
    assert results[0].run_id == results[1].run_id != results[3].run_id
    assert StepMetric.objects.filter(run__name="run-1").count() == 7
    assert IngestedBatch.objects.count() == 3


def test_each_claimed_batch_keeps_its_source_and_counts(token):
    # The first group claims through the run's creation, the second through the cached placement
    # (one statement with the run check): both record every field of every batch.
    first = step_batch(rank=0, count=3, first_step=0)
    first["source"].update(host="node-a", local_rank=7)
    later = [step_batch(rank=9, world_size=16, count=2, gpus=3),
             step_batch(rank=12, world_size=16, count=1, first_step=5)]
    later[0]["source"].update(host="node-b", local_rank=1)
    later[1]["source"].update(host="node-ü", local_rank=4)
    later[1]["events"] = [{"kind": "heartbeat", "ts": time.time()}]
    before = time.time()
    store(token, [first])
    store(token, later)

    rows = {str(row.batch_id): row for row in IngestedBatch.objects.all()}
    assert {batch_id: (row.rank, row.host, row.local_rank, row.steps, row.gpu_samples, row.events)
            for batch_id, row in rows.items()} == {
        first["batch_id"]: (0, "node-a", 7, 3, 0, 0),
        later[0]["batch_id"]: (9, "node-b", 1, 2, 3, 0),
        later[1]["batch_id"]: (12, "node-ü", 4, 1, 0, 1),
    }
    run = Run.objects.get(name="run-1")
    assert all(row.run_id == run.pk and row.received_at.timestamp() >= before - 1
               for row in rows.values())


def test_progress_and_status_fold_over_the_batches_in_time_order(token):
    now = time.time()
    results = store(token, [
        # Listed out of time order: the finish of rank 0 comes last in time.
        step_batch(rank=0, count=0, t0=now, events=[
            {"kind": "finish", "ts": now + 100, "status": "finished"},
            {"kind": "checkpoint_save", "ts": now + 90, "step": 59, "bytes": 1024,
             "duration_s": 2.0, "path": "/ckpt/59"}]),
        step_batch(rank=1, world_size=4, first_step=10, count=50, t0=now + 10),
        step_batch(rank=0, first_step=0, count=10, t0=now - 20,
                   events=[{"kind": "start", "ts": now - 30, "pid": 1}]),
    ])

    assert all(r.stored for r in results)
    run = Run.objects.get(name="run-1")
    assert run.status == Run.Status.FINISHED
    assert run.last_step == 59
    assert run.world_size == 4
    assert abs(run.first_seen_at.timestamp() - (now - 30)) < 1e-5
    assert abs(run.last_seen_at.timestamp() - (now + 100)) < 1e-5
    attempt = Attempt.objects.get(run=run)
    assert abs(attempt.started_at.timestamp() - (now - 30)) < 1e-5
    assert attempt.exit_reason == "finished"
    assert Checkpoint.objects.get(run=run).step == 59
    assert Event.objects.filter(run=run).count() == 3
