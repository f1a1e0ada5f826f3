"""The embedded mode (`make demo`: SQLite, Celery tasks in-process) serves the dashboard.

The suite runs on PostgreSQL, so the embedded mode runs in a child process with its own settings
(tests/embedded_demo.py): it ingests a two-rank run with a checkpoint, an interruption and a
restart through the API, runs the stall detector and reads every dashboard page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from collectors import queries, reliability, stalls
from collectors.models import Attempt, IngestToken, Project, Run
from collectors.tasks import ingest_batch
from tests.batches import step_batch
from tests.embedded_demo import demo_batches

ROOT = Path(__file__).resolve().parent.parent


def run_embedded(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL",
                                                            "CELERY_TASK_ALWAYS_EAGER")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'embedded.sqlite3'}", PYTHONPATH=str(ROOT),
               DJANGO_SETTINGS_MODULE="dashboard.settings")
    child = subprocess.run([sys.executable, "-m", "tests.embedded_demo"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=180)
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_embedded_mode_ingests_and_serves_every_dashboard_page(tmp_path):
    result = run_embedded(tmp_path)
    statuses, seen = result["statuses"], result["seen"]

    assert statuses.pop("ingest") == [202] * 4
    assert statuses == {"runs.json": 200, "runs": 200, "run": 200, "series.json": 200,
                        "failures": 200, "checkpoints": 200, "sim_run": 200, "sim_failures": 200}
    assert seen["run"] == "run-1"
    assert seen["last_step"] == 60
    assert seen["attempts"] == seen["header_attempts"] == 2
    assert seen["steps_per_s"] > 0
    assert seen["loss_traces"] == 2
    # One save merged over the ranks (slowest rank's time, both shards' bytes), then the load.
    assert seen["checkpoints"] == [[0, "save", 20, 4.0, 2_000_000], [1, "load", 20, None, None]]
    # make demo's simulated cluster, on SQLite: stored, classified as planted, finished.
    simulated = seen["sim"]
    assert simulated["timezone"] == "America/Chicago"
    assert simulated["status"] == "finished"
    assert simulated["attempts"] == 2
    assert {category: 1 for category in simulated["interruptions"]} == simulated["planted"]


@pytest.fixture
def token(db) -> str:
    return IngestToken.issue(Project.objects.create(slug="llm"))[1]


def test_portable_reads_match_the_postgresql_ones(token, monkeypatch):
    """The embedded mode's ORM reads answer what the PostgreSQL SQL answers, on the same rows.
    (Checkpoints are read by the same SQL on every database.)"""
    for batch in demo_batches(time.time() - 600):
        ingest_batch(batch, token=token)
    ingest_batch(step_batch(run="run-2", count=5), token=token)
    runs = Run.objects.all()
    attempt = Attempt.objects.get(run__name="run-1", number=1)

    fast = (queries.run_overviews(runs), reliability.attempt_spans(runs.get(name="run-1")),
            stalls._median_step_s(attempt.run_id, attempt.pk))
    for module in (queries, reliability, stalls):
        monkeypatch.setattr(module, "connection", SimpleNamespace(vendor="sqlite"))
    portable = (queries.run_overviews(runs), reliability.attempt_spans(runs.get(name="run-1")),
                stalls._median_step_s(attempt.run_id, attempt.pk))

    assert portable == fast
    assert [overview.run.name for overview in fast[0]] == ["run-2", "run-1"]
    assert [span.number for span in fast[1]] == [0, 1]
