"""The stall detector: the pure decision, and the beat task's scan of the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from collectors.models import Attempt, Event, GpuSample, Interruption, Project, Run, StepMetric
from collectors.stalls import detect_stall, detect_stalls, stall_after_s
from collectors.tasks import detect_stalls as detect_stalls_task


def test_threshold_is_the_floor_or_ten_median_steps_whichever_is_longer():
    assert stall_after_s(None, 60) == 60
    assert stall_after_s(0.5, 60) == 60
    assert stall_after_s(20.0, 60) == 200.0


@pytest.mark.parametrize(
    ("last_step", "last_heartbeat", "median", "now", "expected"),
    [
        (1000.0, 1000.5, 1.0, 1059.0, None),  # silent 58.5 s < 60 s
        (1000.0, 1000.5, 1.0, 1061.0, "kill"),  # both stopped together
        (1000.0, None, 1.0, 1061.0, "kill"),  # no heartbeats at all: steps alone
        (1000.0, 1700.0, 1.0, 1761.0, "hang"),  # heartbeats went on 700 s after the last step
        (1000.0, 1700.0, 1.0, 1700.0, None),  # ... and are still arriving: not silent (yet)
        (1000.0, 1030.0, 1.0, 1100.0, "kill"),  # heartbeats outlived steps by less than 60 s
        (1000.0, None, 20.0, 1150.0, None),  # 20 s steps: 200 s of patience
        (1000.0, None, 20.0, 1201.0, "kill"),
        (None, None, None, 5000.0, None),  # never said anything: nothing to judge
    ],
)
def test_detect_stall_decides_from_last_step_heartbeat_and_median(last_step, last_heartbeat,
                                                                 median, now, expected):
    assert detect_stall(last_step, last_heartbeat, median, now, floor_s=60) == expected


def test_an_attempt_without_steps_is_judged_from_its_start():
    assert detect_stall(None, None, None, 200.0, floor_s=60, started_at=100.0) == "kill"
    assert detect_stall(None, 190.0, None, 200.0, floor_s=60, started_at=100.0) is None
    assert detect_stall(None, 190.0, None, 251.0, floor_s=60, started_at=100.0) == "hang"


def test_beat_runs_the_detector_every_30_seconds():
    entry = settings.CELERY_BEAT_SCHEDULE["detect-stalls"]
    assert entry["task"] == "collectors.detect_stalls" == detect_stalls_task.name
    assert entry["schedule"] <= 60
    assert settings.RUNWATCH_STALL_AFTER_S == 60


@pytest.fixture
def silent_run(db):
    project = Project.objects.create(slug="llm")
    run = Run.objects.create(project=project, name="r", status=Run.Status.RUNNING)
    now = timezone.now()
    attempt = Attempt.objects.create(run=run, number=0, started_at=now - timedelta(minutes=30))
    StepMetric.objects.bulk_create(
        StepMetric(run=run, attempt=attempt, rank=0, step=s,
                   ts=now - timedelta(minutes=20) + timedelta(seconds=s), duration_s=1.0)
        for s in range(100))
    return run, attempt, now


def test_a_killed_attempt_gets_one_interruption_however_often_beat_ticks(silent_run):
    run, attempt, now = silent_run
    last_step = now - timedelta(minutes=20) + timedelta(seconds=99)
    Event.objects.create(run=run, attempt=attempt, rank=0, host="n0", kind="heartbeat",
                         ts=last_step + timedelta(seconds=0.3))

    assert detect_stalls_task()["interruptions"]
    for _ in range(3):
        assert detect_stalls_task()["interruptions"] == []
    interruption = Interruption.objects.get()
    assert interruption.source == Interruption.Source.KILL
    assert interruption.ts == last_step + timedelta(seconds=0.3)
    assert interruption.evidence["heartbeat_lost"] is True
    assert interruption.evidence["detector"] == "kill"
    assert interruption.rule  # the classifier decided
    attempt.refresh_from_db()
    assert attempt.ended_at == interruption.ts
    run.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED


def test_gpu_samples_that_outlive_the_steps_make_it_a_hang(silent_run):
    run, attempt, now = silent_run
    last_step = now - timedelta(minutes=20) + timedelta(seconds=99)
    GpuSample.objects.bulk_create(
        GpuSample(run=run, attempt=attempt, host="n0", gpu=0,
                  ts=last_step + timedelta(seconds=s), power_w=100.0) for s in range(1, 601))
    [interruption] = detect_stalls(now=now)
    assert interruption.source == Interruption.Source.STALL
    assert interruption.ts == last_step + timedelta(seconds=600)
    assert interruption.evidence["heartbeat_lost"] is False


def test_a_live_or_ended_attempt_is_left_alone(silent_run):
    run, attempt, now = silent_run
    assert detect_stalls(now=now - timedelta(minutes=19, seconds=30)) == []  # 21 s silent
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=now - timedelta(minutes=18))
    assert detect_stalls(now=now) == []
    assert not Interruption.objects.exists()


def test_a_finished_run_is_not_scanned(silent_run):
    run, attempt, now = silent_run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED)
    assert detect_stalls(now=now) == []


def test_an_attempt_already_interrupted_is_not_recorded_again(silent_run):
    run, attempt, now = silent_run
    Interruption.objects.create(run=run, attempt=attempt, ts=now, source="exception")
    assert detect_stalls(now=now) == []
    assert Interruption.objects.count() == 1
