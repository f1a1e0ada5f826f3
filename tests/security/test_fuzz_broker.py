"""Property-based fuzzing of the broker path: batches put straight on the `ingest` queue (as a
trainer with RUNWATCH_URL=redis://... does) and processed by a real Celery worker process.

For any input the worker stores the batch or records it in the dead-letter list (RejectedBatch)
with its reason, writes nothing else for a refused batch, and stays alive: no task may fail with an
unexpected error. 5 hostile batches and 40 mutated ones per run (each waits for the worker)."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, assume, example, given, settings

from collectors.models import IngestedBatch, IngestToken, Project, RejectedBatch
from collectors.tasks import ingest_batch
from tests.batches import step_batch
from tests.e2e.conftest import wait_for
from tests.reliability_report import record
from tests.security.strategies import mutated_batches
from tests.security.tables import changed, table_counts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLES = 40
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


def _hostile_examples():
    """Always tried first: text the database cannot hold, where the dead-letter record itself
    used to fail (so the refused batch was lost with the failed task)."""
    cases = []
    for mutate in (lambda b: b.__setitem__("batch_id", "ab\x00"),
                   lambda b: b["run"].__setitem__("project", "l\x00m"),
                   lambda b: b["run"].__setitem__("project", "l\ud800m"),
                   lambda b: b["source"].__setitem__("host", "node\x00"),
                   lambda b: b["steps"]["step"].__setitem__(0, 2**63)):
        batch = step_batch(gpus=1)
        mutate(batch)
        cases.append(batch)

    def apply(test):
        for batch in reversed(cases):
            test = example(batch=batch)(test)
        return test

    return apply


def _outcomes() -> tuple[int, int]:
    return IngestedBatch.objects.count(), RejectedBatch.objects.count()


def test_worker_stores_or_dead_letters_every_fuzzed_batch_and_stays_alive(
        transactional_db, celery_worker_process):
    project = Project.objects.create(slug="llm")
    token = IngestToken.issue(project)[1]
    tally = {"stored": 0, "dead-lettered": 0}

    @FUZZ
    @given(batch=mutated_batches())
    @_hostile_examples()
    def run(batch):
        try:
            json.dumps(batch)
        except (RecursionError, ValueError):
            assume(False)  # the sender's own JSON encoder refuses it: it never reaches a queue
        if isinstance(batch, dict) and isinstance(batch.get("batch_id"), str):
            try:
                uuid.UUID(batch["batch_id"])
                batch["batch_id"] = str(uuid.uuid4())  # shrinking replays must not be duplicates
            except ValueError:
                pass
        before = table_counts()
        stored, rejected = _outcomes()

        ingest_batch.apply_async(args=[batch], kwargs={"token": token})

        wait_for(lambda: _outcomes() != (stored, rejected), timeout=60,
                 what="the worker to store or dead-letter the batch")
        now_stored, now_rejected = _outcomes()
        if now_rejected > rejected:
            dead = RejectedBatch.objects.order_by("-pk").first()
            assert len(dead.reason) > 10
            diff = changed(before, table_counts())
            assert set(diff) == {RejectedBatch._meta.db_table}, diff  # nothing else written
            tally["dead-lettered"] += 1
        else:
            assert now_stored == stored + 1
            tally["stored"] += 1

    run()
    # Still alive and still working: a good batch after all the bad ones is stored.
    good = step_batch(run="after-fuzz")
    ingest_batch.apply_async(args=[good], kwargs={"token": token})
    wait_for(lambda: IngestedBatch.objects.filter(batch_id=good["batch_id"]).exists(), timeout=60,
             what="the worker to store a good batch after the fuzzing")
    assert celery_worker_process.process.poll() is None
    log = celery_worker_process.log_path.read_text(errors="replace")
    assert "raised unexpected" not in log, celery_worker_process.output()
    print(f"fuzz broker: {sum(tally.values())} batches: {tally}")
    assert tally["dead-lettered"] > EXAMPLES // 3
    record("fuzz-broker", fault="fuzzed batches through the broker path (hypothesis, real worker)",
           action=f"{sum(tally.values())} near-valid batches on the ingest queue; "
                  f"{tally['dead-lettered']} dead-lettered with a reason, 0 partial writes, "
                  "0 failed tasks, worker alive",
           sent=tally["stored"], stored=tally["stored"], unit="valid batches")
