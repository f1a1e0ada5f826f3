"""StepQuarter (collectors.step_quarters): the quarter-hour rollup the run page of a long run is
drawn from, kept by ingest and rebuild_rollups, against the raw rows it summarises."""

from __future__ import annotations

import copy
import importlib
import random
from datetime import UTC, datetime

import pytest
from django.db import connection

from collectors import rollups
from collectors.models import Run, StepQuarter
from collectors.tasks import ingest_batch
from tests.collectors.rollup_data import (
    QUARTER_NUMBERS,
    QUARTER_SUMS,
    T0,
    across_the_hour_batches,
    assert_same,
    batch,
    quarter_aggregates,
    stored_quarters,
    with_redeliveries,
)


@pytest.fixture
def across_the_quarter(token):
    """Two runs' random batches with redeliveries, shuffled: run-h's cross 10:00 UTC, a quarter
    hour's start, in every rank."""
    rng = random.Random(31)
    batches = across_the_hour_batches(rng)
    assert sum(ingest_batch(copy.deepcopy(b), token=token)["stored"]
               for b in with_redeliveries(rng, batches)) == len(batches)
    return [Run.objects.get(name="run-1"), Run.objects.get(name="run-h")]


def test_step_quarters_are_the_extremes_of_their_minutes(across_the_quarter):
    for run in across_the_quarter:
        assert_same(stored_quarters(run), quarter_aggregates(run), QUARTER_NUMBERS, QUARTER_SUMS)
    quarters = stored_quarters(across_the_quarter[1])
    assert {(rank, q.hour, q.minute) for rank, q in quarters} == {
        (rank, h, m) for rank in range(4) for h, m in ((9, 45), (10, 0))}
    # Every chart has a low and a high in each quarter, and they are different minutes.
    for row in quarters.values():
        assert row["loss_low"] < row["loss_high"]
        assert row["token_rate_low_at"] != row["token_rate_high_at"]


def test_rebuild_reproduces_step_quarters(across_the_quarter):
    expected = {run.pk: stored_quarters(run) for run in across_the_quarter}
    StepQuarter.objects.filter(run=across_the_quarter[0]).delete()
    StepQuarter.objects.update(loss_high=-1.0, minutes=99)  # wrong on purpose: rebuild replaces

    counts = rollups.rebuild()

    for run in across_the_quarter:
        assert_same(stored_quarters(run), expected[run.pk], QUARTER_NUMBERS, QUARTER_SUMS)
    assert counts["step_quarters"] == sum(len(rows) for rows in expected.values())


def test_migration_fills_the_quarters_of_minutes_stored_before_it(across_the_quarter):
    expected = {run.pk: stored_quarters(run) for run in across_the_quarter}
    StepQuarter.objects.all().delete()
    migration = importlib.import_module("collectors.migrations.0010_step_quarter")

    with connection.cursor() as cursor:
        cursor.execute(migration.FILL_SQL)

    for run in across_the_quarter:
        assert_same(stored_quarters(run), expected[run.pk], QUARTER_NUMBERS, QUARTER_SUMS)


def test_a_minute_completed_by_a_later_batch_moves_its_quarters_extremes(token):
    # The first batch leaves 10:01 with one step of loss 9 (the quarter's highest minute); the
    # second adds three steps of loss 1 to it: its mean is now 3, and 10:02's 5 is the highest.
    ingest_batch(batch(rank=0, host="n", steps=[(1, T0 + 65, 1.0, 10, 9.0, None),
                                                 (2, T0 + 125, 1.0, 10, 5.0, None)]), token=token)
    ingest_batch(batch(rank=0, host="n", steps=[(s, T0 + 60 + s, 1.0, 10, 1.0, None)
                                                 for s in (3, 4, 5)]), token=token)

    quarter = StepQuarter.objects.get()
    assert quarter.quarter == datetime.fromtimestamp(T0, tz=UTC)
    assert (quarter.minutes, quarter.steps, quarter.last_step) == (2, 5, 5)
    assert (quarter.loss_low, quarter.loss_low_step) == (3.0, 5)
    assert (quarter.loss_high, quarter.loss_high_step) == (5.0, 2)
