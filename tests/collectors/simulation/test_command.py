"""manage.py simulate: arguments, what it prints and writes, --live pacing and --via-broker."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command

from collectors.models import GpuSample, IngestedBatch, Interruption, Project, Run, StepMetric
from tests.e2e.conftest import ROOT, wait_for

SMALL = ["--gpus", "8", "--days", "0.05", "--start", "2026-07-01T06:00:00Z", "--no-progress"]


def simulate(*args: str) -> str:
    out = io.StringIO()
    call_command("simulate", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--days", "-1"], "--days must be more than 0"),
    (["--start", "last tuesday"], "is not a date or datetime"),
    (["--timezone", "Mars/Olympus_Mons"], "unknown time zone"),
    (["--sample-interval", "0"], "--sample-interval must be between"),
    (["--project", "has spaces"], "must be a slug"),
    (["--interruptions", "-2"], "cannot be negative"),
    (["--start", (datetime.now(UTC) - timedelta(hours=1)).isoformat()],
     "a backfill must end by now"),
    (["--truth-json", "/nonexistent-folder/truth.json"], "does not exist"),
    (["--token", "rw_not-a-token"], "not a live ingest token"),
])
def test_bad_arguments_are_refused_with_a_clear_error_and_write_nothing(args, message):
    with pytest.raises(CommandError, match=message):
        simulate("--gpus", "8", "--days", "0.05", "--no-progress", *args)
    assert not Run.objects.exists()
    assert not Project.objects.exists()


@pytest.mark.django_db
def test_via_broker_without_a_broker_is_refused():
    from dashboard.celery import app

    app.conf.task_always_eager = True
    try:
        with pytest.raises(CommandError, match="--via-broker needs a broker"):
            simulate(*SMALL, "--via-broker")
    finally:
        app.conf.task_always_eager = False
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_an_existing_run_name_is_refused_and_left_alone():
    simulate(*SMALL, "--run-name", "twice")
    steps = StepMetric.objects.count()
    with pytest.raises(CommandError, match="already exists"):
        simulate(*SMALL, "--run-name", "twice")
    assert Run.objects.count() == 1
    assert StepMetric.objects.count() == steps


@pytest.mark.django_db
def test_prints_the_truth_and_writes_it_as_json(tmp_path):
    path = tmp_path / "truth.json"
    printed = simulate(*SMALL, "--interruptions", "1", "--seed", "4", "--truth-json", str(path))
    truth = json.loads(path.read_text())
    run = Run.objects.get(pk=truth["run_id"])
    assert run.name == "sim-8gpu-0.05d-seed4"
    assert truth["gpus"] == 8 and truth["hosts"] == 1
    assert sum(truth["interruptions"].values()) == 1
    assert len(truth["hourly_deviation_pct"]) == 24
    assert f"Simulated sim/{run.name} (run id {run.pk})" in printed
    assert "ETTR:" in printed and "largest power swings" in printed
    # The JSON printed after the summary is the same truth.
    assert json.loads(printed.split("ground truth (JSON):", 1)[1]) == truth
    assert Interruption.objects.filter(run=run).count() == 1


@pytest.mark.django_db(transaction=True)
def test_live_streams_at_wall_clock_pace_and_finishes_when_stopped(worker_env, tmp_path):
    log = (tmp_path / "live.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "simulate", "--live", "--gpus", "8", "--days", "1",
         "--history", "0.05", "--run-name", "live", "--no-progress"],
        cwd=ROOT, env=worker_env | {"CELERY_TASK_ALWAYS_EAGER": "1"}, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        run = wait_for(lambda: Run.objects.filter(name="live").first(), timeout=60, what="the run")
        # The three minutes of history arrive at once ...
        wait_for(lambda: _newest_sample(run) is not None
                 and _newest_sample(run) > time.time() - 15, timeout=60, what="the backfill")
        first_seen, first_wall = _newest_sample(run), time.time()
        # ... then nothing from the future, and new samples as the wall clock moves on.
        time.sleep(12)
        wait_for(lambda: _newest_sample(run) > first_seen + 8, timeout=30, what="live samples")
        newest, now = _newest_sample(run), time.time()
        assert newest <= now + 1.0, "samples from the future"
        assert newest - first_seen == pytest.approx(now - first_wall, abs=12.0)
        assert StepMetric.objects.filter(run=run).order_by("-ts").first().ts.timestamp() <= now + 1
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, (tmp_path / "live.log").read_text()
        run.refresh_from_db()
        assert run.status == Run.Status.FINISHED
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
        Project.objects.filter(slug="sim").delete()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_via_broker_a_real_worker_stores_every_batch(celery_worker_process, tmp_path):
    path = tmp_path / "truth.json"
    os.environ.pop("CELERY_TASK_ALWAYS_EAGER", None)
    try:
        simulate(*SMALL, "--via-broker", "--interruptions", "1", "--seed", "9",
                 "--truth-json", str(path))
        truth = json.loads(path.read_text())
        run = Run.objects.get(pk=truth["run_id"])
        sent = truth["details"]["rows_sent"]
        wait_for(lambda: IngestedBatch.objects.filter(run=run).count() == sent["batches"],
                 timeout=120, what="the worker to store every batch")
        assert GpuSample.objects.filter(run=run).count() == sent["gpu_samples"]
        assert StepMetric.objects.filter(run=run).count() == sent["steps"]
        assert [i.category for i in Interruption.objects.filter(run=run)] \
            == list(truth["interruptions"])
    finally:
        Project.objects.filter(slug="sim").delete()


def _newest_sample(run: Run) -> float | None:
    newest = GpuSample.objects.filter(run=run).order_by("-ts").values_list("ts", flat=True).first()
    return newest.timestamp() if newest is not None else None
