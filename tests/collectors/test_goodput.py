"""Goodput (ETTR and badput) against hand-computed small runs and a generated run whose truth is
planted exactly."""

from __future__ import annotations

import pytest

from collectors import reliability
from collectors.analysis.goodput import (
    AttemptSpan,
    CheckpointFact,
    InterruptionFact,
    kept_steps,
    run_goodput,
)
from tests.generated_run import generate_run


def test_one_clean_attempt_is_startup_then_productive_with_saves_taken_out():
    # Start at 0, first step row at 100, last at 1100; two saves of 10 s in between.
    attempt = AttemptSpan(number=0, started_at=0.0, first_step_at=100.0, last_step_at=1100.0,
                          first_step=1, last_step=500)
    saves = [CheckpointFact(attempt=0, kind="save", ts=400.0, step=100, duration_s=10.0),
             CheckpointFact(attempt=0, kind="save", ts=800.0, step=300, duration_s=10.0)]
    result = run_goodput([attempt], saves, [])
    assert result.total.as_dict() == {"productive": 980.0, "startup": 100.0, "checkpoint_save": 20.0,
                                      "lost_progress": 0.0, "restart_downtime": 0.0, "stall": 0.0}
    assert result.ettr == pytest.approx(980 / 1100)
    assert result.interruptions == 0 and result.mtbi_s is None


def test_crash_restart_splits_into_lost_progress_downtime_and_startup():
    # Attempt 0: start 0, steps 1..100 from t=10 to t=208 (2 s each), a 5 s save after step 50
    # (row of step 50 at t=108), crash at t=209. Attempt 1 starts at t=300, restores step 50,
    # first step (51) at t=330 and runs to step 80 at t=388.
    spans = [AttemptSpan(0, 0.0, 10.0, 208.0 + 5, 1, 100),
             AttemptSpan(1, 300.0, 330.0, 388.0, 51, 80)]
    checkpoints = [CheckpointFact(0, "save", 113.0, 50, 5.0),
                   CheckpointFact(1, "load", 310.0, 50, 8.0)]
    interruptions = [InterruptionFact(0, 214.0, "exception", "gpu_hardware", False, 1),
                     InterruptionFact(0, 215.0, "exception", "gpu_hardware", False, 2)]
    assert kept_steps(spans, checkpoints, interruptions) == {0: 50}
    result = run_goodput(spans, checkpoints, interruptions, {0: 108.0})
    first = result.attempts[0].badput
    assert first.startup == 10.0
    assert first.productive == 98.0  # t=10 → 108: steps 2..50
    assert first.checkpoint_save == 5.0
    assert first.lost_progress == pytest.approx(100.0 + 1.0)  # steps 51..100, then 1 s to crash
    assert first.restart_downtime == 86.0  # 214 → 300
    second = result.attempts[1].badput
    assert (second.startup, second.productive) == (30.0, 58.0)
    assert result.total.wall == 388.0
    assert result.ettr == pytest.approx((98 + 58) / 388)
    assert result.interruptions == 1  # two ranks reported the same crash
    assert result.mtbi_s == 388.0
    assert result.attempts[0].steps_lost == 50


def test_a_hang_is_stall_until_heartbeats_stopped():
    spans = [AttemptSpan(0, 0.0, 60.0, 660.0, 1, 301), AttemptSpan(1, 1500.0, 1560.0, 1600.0, 301, 321)]
    interruptions = [InterruptionFact(0, 1260.0, "stall", "nccl_timeout", False)]
    checkpoints = [CheckpointFact(0, "save", 661.0, 300, 0.0)]
    result = run_goodput(spans, checkpoints, interruptions, {0: 658.0})
    first = result.attempts[0].badput
    assert first.stall == 600.0
    assert first.lost_progress == 2.0
    assert first.restart_downtime == 240.0
    assert result.total.wall == 1600.0


def test_without_checkpoint_information_nothing_is_called_lost():
    spans = [AttemptSpan(0, 0.0, 10.0, 100.0, 1, 46)]
    result = run_goodput(spans, [], [InterruptionFact(0, 100.0, "kill", "unknown", False)])
    assert result.total.lost_progress == 0.0
    assert result.total.productive == 90.0


def test_next_attempt_first_step_says_what_was_kept_when_no_checkpoint_is_reported():
    spans = [AttemptSpan(0, 0.0, 10.0, 100.0, 1, 46), AttemptSpan(1, 200.0, 220.0, 240.0, 41, 51)]
    assert kept_steps(spans, [], []) == {0: 40}
    result = run_goodput(spans, [], [], {0: 88.0})
    assert result.attempts[0].badput.lost_progress == 12.0
    assert result.attempts[0].badput.restart_downtime == 100.0


def test_a_crash_before_the_first_step_is_all_startup_and_downtime():
    spans = [AttemptSpan(0, 0.0, None, None, None, None), AttemptSpan(1, 100.0, 110.0, 150.0, 1, 21)]
    result = run_goodput(spans, [], [InterruptionFact(0, 40.0, "exception", "dataloader", False)])
    assert result.attempts[0].badput.startup == 40.0
    assert result.attempts[0].badput.restart_downtime == 60.0
    assert result.total.wall == 150.0


def test_buckets_always_partition_the_wall_clock_even_when_attempts_overlap():
    # The next attempt started before the previous one's reported interruption time.
    spans = [AttemptSpan(0, 0.0, 10.0, 100.0, 1, 46), AttemptSpan(1, 95.0, 105.0, 200.0, 40, 90)]
    result = run_goodput(spans, [], [InterruptionFact(0, 120.0, "exception", "unknown", False)])
    assert result.total.wall == pytest.approx(200.0)
    assert sum(a.badput.wall for a in result.attempts) == pytest.approx(200.0)


def test_generated_run_ettr_matches_the_planted_truth(token):
    generated = generate_run(token)
    truth = generated.truth
    result = reliability.run_goodput(generated.run)

    assert result.interruptions == truth.interruptions == 3
    assert result.total.wall == pytest.approx(truth.wall, abs=0.05)
    assert abs(result.ettr - truth.ettr) * 100 < 0.1
    # Each bucket, to within the ranks' skew (a few ms per attempt).
    for bucket in ("productive", "startup", "checkpoint_save", "lost_progress",
                   "restart_downtime", "stall"):
        assert getattr(result.total, bucket) == pytest.approx(getattr(truth, bucket), abs=0.05), bucket
    assert result.mtbi_s == pytest.approx(truth.wall / 3, abs=0.05)
    sources = [a.interruption.source if a.interruption else None for a in result.attempts]
    assert sources == ["exception", "stall", "kill", None]
