"""Every rule kind fires once and resolves once on recorded data, with one firing and one resolved
message to a real HTTP endpoint; a repeat evaluation changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from collectors.alerts import evaluate
from collectors.alerts.models import Alert, Channel
from collectors.models import Attempt, Checkpoint, GpuSample, Run
from tests.collectors.alerts.conftest import make_rule
from tests.dashboard.conftest import add_steps, make_run

NOW = timezone.now().replace(microsecond=0)


def gpu_rows(run, attempt, start, seconds, gpus, temp=60.0, watts=300.0):
    return GpuSample.objects.bulk_create([
        GpuSample(run=run, attempt=attempt, host="node000", gpu=g,
                  ts=start + timedelta(seconds=s), temp_c=temp(g) if callable(temp) else temp,
                  power_w=watts(s) if callable(watts) else watts, throttle=0)
        for s in range(seconds) for g in range(gpus)
    ])


def stall(run, attempt):
    add_steps(run, attempt, ranks=1, steps=range(1, 11), start=NOW - timedelta(minutes=25),
              every_s=60)
    rule = {"minutes": 10}

    def clear():
        add_steps(run, attempt, ranks=1, steps=range(11, 12), start=NOW - timedelta(seconds=660),
                  every_s=60)  # step 11 at NOW - 0 s
        return NOW
    return rule, clear


def throughput_drop(run, attempt):
    start = NOW - timedelta(minutes=65)
    add_steps(run, attempt, ranks=1, steps=range(0, 360), start=start, every_s=10, tokens=1000,
              duration=lambda rank, step: 1.0)   # 1000 tokens/s for an hour
    add_steps(run, attempt, ranks=1, steps=range(360, 390), start=start, every_s=10, tokens=1000,
              duration=lambda rank, step: 2.0)   # then 500 tokens/s for the last 5 min
    rule = {"percent": 30, "minutes": 5}

    def clear():
        add_steps(run, attempt, ranks=1, steps=range(390, 426), start=start, every_s=10,
                  tokens=1000, duration=lambda rank, step: 1.0)  # back to 1000 for 6 min
        return NOW + timedelta(minutes=6)
    return rule, clear


def gpu_temperature(run, attempt):
    gpu_rows(run, attempt, NOW - timedelta(seconds=30), 10, gpus=2,
             temp=lambda g: 92.0 if g == 0 else 60.0)
    rule = {"max_temp_c": 85}

    def clear():
        gpu_rows(run, attempt, NOW + timedelta(seconds=20), 5, gpus=2, temp=70.0)
        return NOW + timedelta(seconds=30)
    return rule, clear


def power_swing(run, attempt):
    # 8 GPUs at 400 W, all dropping to 50 W at once (everyone waiting): -2.8 kW within a second.
    gpu_rows(run, attempt, NOW - timedelta(seconds=100), 60, gpus=8,
             watts=lambda s: 400.0 if s < 30 else 50.0)
    rule = {"kw": 1.0, "window_s": 10}

    def clear():
        gpu_rows(run, attempt, NOW + timedelta(seconds=100), 300, gpus=8, watts=50.0)
        return NOW + timedelta(seconds=400)
    return rule, clear


def ettr_below(run, attempt):
    # 50 min of startup before the first step, then steps for 70 min: ETTR 58%.
    Attempt.objects.filter(pk=attempt.pk).update(started_at=NOW - timedelta(hours=2))
    add_steps(run, attempt, ranks=1, steps=range(0, 71), start=NOW - timedelta(minutes=70),
              every_s=60)
    rule = {"target_pct": 90}

    def clear():
        # Ten more hours of steps: (70 min + 10 h) / 12 h = 93%.
        add_steps(run, attempt, ranks=1, steps=range(71, 671), start=NOW - timedelta(minutes=70),
                  every_s=60)
        return NOW + timedelta(hours=10)
    return rule, clear


def checkpoint_overdue(run, attempt):
    Run.objects.filter(pk=run.pk).update(first_seen_at=NOW - timedelta(hours=2))
    run.refresh_from_db()
    Checkpoint.objects.create(run=run, attempt=attempt, rank=0, kind="save", step=100,
                              ts=NOW - timedelta(hours=1))
    rule = {"minutes": 30}

    def clear():
        Checkpoint.objects.create(run=run, attempt=attempt, rank=0, kind="save", step=200,
                                  ts=NOW - timedelta(minutes=1))
        return NOW
    return rule, clear


SCENARIOS = {f.__name__: f for f in (stall, throughput_drop, gpu_temperature, power_swing,
                                     ettr_below, checkpoint_overdue)}


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_rule_fires_once_and_resolves_once(kind, project, webhook_server, eager,
                                           django_capture_on_commit_callbacks):
    run, (attempt,) = make_run(project, f"run-{kind}", last_seen_at=NOW)
    parameters, clear = SCENARIOS[kind](run, attempt)
    channel = Channel.objects.create(project=project, kind="webhook", name="hook",
                                     config={"url": webhook_server.url})
    rule = make_rule(project, kind, [channel], **parameters)

    with django_capture_on_commit_callbacks(execute=True):
        evaluate.evaluate_windows(now=NOW)
        evaluate.evaluate_windows(now=NOW + timedelta(seconds=1))
    [alert] = Alert.objects.filter(rule=rule)
    assert alert.state == "firing" and alert.run == run
    assert [r["json"]["state"] for r in webhook_server.requests] == ["firing"]

    later = clear()
    with django_capture_on_commit_callbacks(execute=True):
        evaluate.evaluate_windows(now=later)
        evaluate.evaluate_windows(now=later + timedelta(seconds=1))
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolved_at == later
    assert Alert.objects.filter(rule=rule).count() == 1
    assert [r["json"]["state"] for r in webhook_server.requests] == ["firing", "resolved"]
    assert webhook_server.requests[1]["json"]["what"].startswith("Resolved: ")


def test_rule_for_another_run_ignores_this_one(project):
    run, (attempt,) = make_run(project, "watched", last_seen_at=NOW)
    other, (other_attempt,) = make_run(project, "other", last_seen_at=NOW)
    stall(other, other_attempt)
    rule = make_rule(project, "stall", minutes=10)
    rule.run = run
    rule.save()
    evaluate.evaluate_windows(now=NOW)
    assert not Alert.objects.exists()


def test_finished_run_does_not_stall(project):
    run, (attempt,) = make_run(project, "done", status=Run.Status.FINISHED, last_seen_at=NOW)
    stall(run, attempt)
    make_rule(project, "stall", minutes=10)
    evaluate.evaluate_windows(now=NOW)
    assert not Alert.objects.exists()


def test_pure_decisions():
    assert evaluate.throughput_drop([10, 10, 10], [6, 6], 30) == (10, 6)
    assert evaluate.throughput_drop([10, 10, 10], [8], 30) is None
    assert evaluate.is_hot(70, 0x40, 85) and evaluate.is_hot(90, 0, 85)
    assert not evaluate.is_hot(70, 0x1, 85)  # idle is not throttling
    series = evaluate.cluster_power([(0, "a", 100), (0, "b", 100), (1, "a", 600), (5, "b", 0)])
    assert series == [(0, 200), (1, 700), (2, 700), (3, 700), (4, 700), (5, 600)]
    swing = evaluate.largest_swing(series, 3)
    assert swing.kw == pytest.approx(0.5) and (swing.start, swing.end) == (0, 1)
