"""Checkpoint history: intervals, blocking time and sizes per save; steps and time per restore."""

from __future__ import annotations

import pytest

from collectors import reliability
from collectors.analysis.checkpoints import checkpoint_history
from collectors.analysis.goodput import AttemptSpan, CheckpointFact, InterruptionFact, run_goodput
from tests.generated_run import generate_run


def test_saves_get_intervals_within_their_attempt_and_restores_their_cost():
    spans = [AttemptSpan(0, 0.0, 10.0, 213.0, 1, 100), AttemptSpan(1, 300.0, 330.0, 388.0, 51, 80)]
    checkpoints = [
        CheckpointFact(0, "save", 60.0, 25, 4.0, 1000),
        CheckpointFact(0, "save", 113.0, 50, 5.0, 1000),
        CheckpointFact(1, "load", 310.0, 50, 8.0, 1000),
        CheckpointFact(1, "save", 370.0, 75, 6.0, 1200),
    ]
    goodput = run_goodput(spans, checkpoints, [InterruptionFact(0, 214.0, "exception")], {0: 108.0})
    history = checkpoint_history(checkpoints, goodput)

    assert [(s.step, s.interval_s, s.interval_steps) for s in history.saves] == [
        (25, None, None), (50, 53.0, 25), (75, None, None)]
    [restore] = history.restores
    assert (restore.attempt, restore.step, restore.duration_s) == (1, 50, 8.0)
    assert restore.steps_lost == 50
    assert restore.lost_s == pytest.approx(100.0 + 1.0)  # steps 51..100 and the crashed step
    assert restore.downtime_s == 86.0
    summary = history.summary
    assert (summary.saves, summary.restores) == (3, 1)
    assert summary.median_blocking_s == 5.0 and summary.max_blocking_s == 6.0
    assert summary.total_blocking_s == 15.0
    assert summary.median_interval_s == 53.0
    assert summary.median_bytes == 1000
    assert summary.total_steps_lost == 50


def test_no_checkpoints_is_an_empty_history():
    history = checkpoint_history([], None)
    assert history.saves == [] and history.restores == []
    assert history.summary.median_blocking_s is None


def test_generated_run_checkpoints_match_the_plan(token):
    generated = generate_run(token)
    truth = generated.truth
    facts = reliability.checkpoint_facts(generated.run)
    history = checkpoint_history(facts, reliability.run_goodput(generated.run))

    assert history.summary.saves == truth.saves
    # Both ranks report each save; the slowest rank's blocking time counts, the shards add up.
    assert {s.duration_s for s in history.saves} == {6.0}
    assert {s.bytes for s in history.saves} == {4 * 2**30}
    assert {s.interval_steps for s in history.saves} == {None, 50}
    assert {round(s.interval_s, 3) for s in history.saves if s.interval_s} == {50 * 2.0 + 6.0}
    assert [(r.step, r.steps_lost) for r in history.restores] == [
        (t["step"], t["steps_lost"]) for t in truth.restores]
    for restore, planted in zip(history.restores, truth.restores, strict=True):
        assert restore.lost_s == pytest.approx(planted["lost_s"], abs=0.02)


def test_ranks_reporting_one_shared_path_count_its_size_once(db):
    from django.utils import timezone

    from collectors.models import Attempt, Checkpoint, Project, Run

    run = Run.objects.create(project=Project.objects.create(slug="p"), name="r")
    attempt = Attempt.objects.create(run=run, number=0)
    now = timezone.now()
    for rank in range(4):  # a shared directory, as the Hugging Face integration reports it
        Checkpoint.objects.create(run=run, attempt=attempt, rank=rank, kind="save", step=100,
                                  ts=now, duration_s=10.0 + rank, bytes=8000,
                                  path="/out/checkpoint-100")
    for rank in range(2):  # a shard per rank
        Checkpoint.objects.create(run=run, attempt=attempt, rank=rank, kind="save", step=200,
                                  ts=now, duration_s=5.0, bytes=3000,
                                  path=f"/out/step200/rank{rank}.pt")
    facts = reliability.checkpoint_facts(run)
    assert [(f.step, f.bytes, f.duration_s) for f in facts] == [(100, 8000, 13.0),
                                                                (200, 6000, 5.0)]
