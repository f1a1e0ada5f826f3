"""Stragglers: crafted rank-minutes (a persistent straggler, an occasional one, ties, one rank, two
ranks), the cost of waiting for them, and the PostgreSQL reduction against the pure one."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from collectors.analysis.stragglers import (
    Placement,
    RankMinute,
    read_stragglers,
    stragglers_from_rows,
    summarise_ranks,
    wait_cost,
)
from collectors.models import IngestedBatch, Run, StepMinute

T0 = datetime(2026, 6, 1, tzinfo=UTC).timestamp()


def rows_for(minutes: int, step_s) -> list[RankMinute]:
    """``step_s(minute_index, rank)`` → the rank's mean step time, or None when it sent nothing."""
    rows = []
    for i in range(minutes):
        for rank in range(8):
            value = step_s(i, rank)
            if value is not None:
                rows.append(RankMinute(T0 + 60 * i, rank, value, 10))
    return rows


def mixed(i: int, rank: int) -> float:
    if rank == 3:
        return 6.6  # 10% slower every minute
    if rank == 5 and i % 10 < 3:
        return 6.6  # 10% slower, but only 30% of the time
    if rank == 6:
        return 6.24  # 4% slower: under the 5% line
    return 6.0


def test_persistent_straggler_is_flagged_and_an_occasional_one_is_not():
    placements = {3: Placement("node000", 3), 5: Placement("node000", 5)}
    report = stragglers_from_rows(rows_for(100, mixed), placements)
    assert [s.rank for s in report.stragglers] == [3]
    top = report.stragglers[0]
    assert (top.host, top.gpu) == ("node000", 3)
    assert top.excess_pct == pytest.approx(10.0)
    assert (top.slow_minutes, top.minutes) == (100, 100)
    assert top.mean_step_s == pytest.approx(6.6)
    # Ranked by excess: 3 (10%), 6 (4%), 5 (3% on average), then the rest by rank.
    assert [s.rank for s in report.top[:4]] == [3, 6, 5, 0]
    rank5 = next(s for s in report.top if s.rank == 5)
    assert (rank5.slow_minutes, rank5.excess_pct) == (30, pytest.approx(3.0))
    assert report.median_rank_step_s == pytest.approx(6.0)


def test_cost_is_the_wait_for_the_slowest_and_the_part_the_stragglers_cause():
    cost = stragglers_from_rows(rows_for(100, mixed), {}).cost
    assert cost.minutes == 100 and cost.median_step_s == pytest.approx(6.0)
    assert cost.wait_s == pytest.approx(0.6)  # rank 3 is always the slowest
    # Without rank 3 the slowest is rank 5 (6.6) 30% of the time, else rank 6 (6.24).
    assert cost.straggler_wait_s == pytest.approx(0.7 * 0.36)
    assert cost.straggler_wait_pct == pytest.approx(100 * 0.7 * 0.36 / 6.0)
    assert cost.straggler_lost_s == pytest.approx(70 * 0.36 * 10)


def test_ties_flag_nobody_and_order_by_rank():
    report = stragglers_from_rows(rows_for(30, lambda i, rank: 6.0), {})
    assert report.stragglers == []
    assert [s.rank for s in report.top] == list(range(8))
    assert all(s.excess_pct == 0 and s.slow_minutes == 0 for s in report.top)
    assert report.cost.wait_s == 0 and report.cost.straggler_wait_s == 0


def test_single_rank_has_nothing_to_compare_with():
    report = stragglers_from_rows(rows_for(30, lambda i, rank: 9.0 if rank == 0 else None), {})
    assert report.ranks == [] and report.stragglers == [] and report.top == []
    assert report.cost.minutes == 0 and report.cost.wait_s is None


def test_minutes_with_one_rank_are_left_out():
    # Rank 1 only reports in the first 10 minutes; afterwards rank 0 is alone.
    rows = rows_for(40, lambda i, rank: {0: 6.0, 1: 6.0 if i < 10 else None}.get(rank))
    assert [(s.rank, s.minutes) for s in summarise_ranks(rows)] == [(0, 10), (1, 10)]


def test_two_ranks_ten_percent_apart_are_each_under_five_percent_from_their_median():
    # The median of two is their mean, so 6.6 vs 6.0 is +4.8% / −4.8%: nobody is flagged. With
    # two ranks "slower than the others" cannot be told from "the other is faster".
    report = stragglers_from_rows(rows_for(30, lambda i, rank: {0: 6.0, 1: 6.6}.get(rank)), {})
    assert report.stragglers == []
    assert report.top[0].rank == 1 and report.top[0].excess_pct == pytest.approx(100 * 0.3 / 6.3)


def test_a_rank_with_too_few_minutes_is_not_persistent():
    rows = rows_for(60, lambda i, rank: (7.0 if rank == 2 else 6.0) if i < 4 or rank != 2 else None)
    report = stragglers_from_rows(rows, {})
    assert report.stragglers == []
    assert report.top[0].rank == 2 and report.top[0].slow_minutes == 4


def test_wait_cost_with_every_rank_flagged_uses_the_median():
    cost = wait_cost(rows_for(5, lambda i, rank: 6.0 + rank), set(range(8)))
    assert cost.straggler_wait_s == pytest.approx(13.0 - 9.5)  # slowest − median


@pytest.mark.django_db
def test_postgresql_reduction_matches_the_pure_one_and_names_host_and_gpu(project):
    run = Run.objects.create(project=project, name="strag", world_size=32)
    rng = random.Random(5)
    start = datetime(2026, 6, 1, tzinfo=UTC)
    slow = {11: 1.08, 26: 1.15}
    rollups, rows = [], []
    for i in range(300):
        minute = start + timedelta(minutes=i)
        for rank in range(32):
            if rank == 7 and i % 3 == 0:
                continue  # a rank that misses minutes
            steps = 10 - (rank == 26)
            per_step = 6.0 * slow.get(rank, 1.0) * (1 + rng.gauss(0, 0.01))
            rollups.append(StepMinute(run=run, rank=rank, minute=minute, steps=steps,
                                      duration_n=steps, duration_sum=steps * per_step,
                                      tokens=steps * 1000))
            rows.append(RankMinute(minute.timestamp(), rank, per_step, steps))
    StepMinute.objects.bulk_create(rollups)
    for rank in range(32):
        for _ in range(3):
            IngestedBatch.objects.create(batch_id=uuid.uuid4(), run=run, rank=rank,
                                         host=f"node{rank // 8:03d}", local_rank=rank % 8)

    from_db = read_stragglers(run, top_n=5)
    pure = stragglers_from_rows(rows, {}, top_n=5)
    assert [s.rank for s in from_db.stragglers] == [26, 11]
    assert [(s.host, s.gpu) for s in from_db.stragglers] == [("node003", 2), ("node001", 3)]
    assert [s.rank for s in from_db.top] == [s.rank for s in pure.top]
    for db_rank, pure_rank in zip(from_db.ranks, pure.ranks, strict=True):
        assert db_rank.rank == pure_rank.rank and db_rank.minutes == pure_rank.minutes
        assert db_rank.slow_minutes == pure_rank.slow_minutes
        assert db_rank.excess_pct == pytest.approx(pure_rank.excess_pct, abs=1e-9)
    assert from_db.cost.wait_s == pytest.approx(pure.cost.wait_s)
    assert from_db.cost.straggler_wait_s == pytest.approx(pure.cost.straggler_wait_s)
    assert from_db.cost.straggler_lost_s == pytest.approx(pure.cost.straggler_lost_s)
    assert from_db.stragglers[0].excess_pct == pytest.approx(15.0, abs=0.5)


@pytest.mark.django_db
def test_finds_the_simulators_planted_stragglers_and_no_others(project):
    from collectors.models import IngestToken
    from collectors.simulation import SimConfig, run_simulation

    # Every rank reports steps: with the large-cluster default (one rank per host plus the slow
    # ones) 3 of the 6 reporting ranks would be slow, and the median itself would be a straggler.
    truth = run_simulation(SimConfig(project="llm", run_name="stragglers", gpus=32, days=0.25,
                                     seed=3, stragglers=3, step_ranks=list(range(32)),
                                     sample_interval_s=60.0),
                           token=IngestToken.issue(project)[1])
    planted = {s["rank"]: s for s in truth.stragglers}
    assert len(planted) == 3
    report = read_stragglers(Run.objects.get(pk=truth.run_id), top_n=len(planted))
    assert report.flagged_ranks == set(planted)
    assert {s.rank for s in report.top} == set(planted)
    for found in report.stragglers:
        assert (found.host, found.gpu) == (planted[found.rank]["host"], planted[found.rank]["gpu"])
        # Ranked by excess, each within a point of its planted slowdown.
        assert found.excess_pct == pytest.approx(100 * planted[found.rank]["slowdown"], abs=1.0)
    assert [s.rank for s in report.stragglers] == [s["rank"] for s in truth.stragglers]
    healthy = [r for r in report.ranks if r.rank not in planted]
    assert len(healthy) == 29 and max(r.excess_pct for r in healthy) < 1.0


@pytest.mark.django_db
def test_a_run_over_the_row_budget_is_read_every_kth_minute(project, monkeypatch):
    from collectors import minute_sample

    run = Run.objects.create(project=project, name="long", world_size=8)
    start = datetime(2026, 6, 1, tzinfo=UTC)
    StepMinute.objects.bulk_create(
        StepMinute(run=run, rank=rank, minute=start + timedelta(minutes=i), steps=10,
                   duration_n=10, duration_sum=10 * (6.6 if rank == 3 else 6.0), tokens=10)
        for i in range(600) for rank in range(8))
    exact = read_stragglers(run)
    monkeypatch.setattr(minute_sample, "ROW_BUDGET", 2400)  # stragglers read a third: 800
    sampled = read_stragglers(run)
    assert (exact.minutes_every, sampled.minutes_every) == (1, 6)
    assert sampled.flagged_ranks == exact.flagged_ranks == {3}
    assert sampled.stragglers[0].minutes == 100
    # Time lost is scaled back to the whole run.
    assert sampled.cost.straggler_lost_s == pytest.approx(exact.cost.straggler_lost_s)
