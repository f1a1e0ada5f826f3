"""Run as a child process by tests/test_embedded_mode.py: drives the embedded mode (SQLite, tasks
in-process) the way `make demo` does, through the ingest API and the dashboard pages, and prints
what it saw as one JSON object on the last line of stdout. Not collected by pytest; the suite
itself refuses SQLite, so this runs with its own settings in its own process."""

from __future__ import annotations

import json
import sys
import time

import django


def demo_batches(t0: float) -> list[dict]:
    """Attempt 0 starts at ``t0``, saves a checkpoint at step 20 and is interrupted; attempt 1
    resumes from it two minutes later. Two ranks, each with GPU samples."""
    from tests.batches import step_batch

    batches = []
    for rank in (0, 1):
        batches.append(step_batch(rank=rank, attempt=0, count=30, t0=t0, gpus=2, events=[
            {"kind": "start", "ts": t0 - 5},
            {"kind": "checkpoint_save", "ts": t0 + 20.5, "step": 20, "duration_s": 3.0 + rank,
             "bytes": 1_000_000, "path": f"/ckpt/step20/rank{rank}.pt"},
            {"kind": "interruption", "ts": t0 + 40, "exc_type": "RuntimeError",
             "message": "NCCL watchdog timeout"},
        ]))
    t1 = t0 + 120
    for rank in (0, 1):
        batches.append(step_batch(rank=rank, attempt=1, first_step=21, count=40, t0=t1, gpus=2,
                                  events=[
            {"kind": "start", "ts": t1 - 10},
            {"kind": "checkpoint_load", "ts": t1 - 5, "step": 20,
             "path": f"/ckpt/step20/rank{rank}.pt"},
        ]))
    return batches


def main() -> None:
    django.setup()

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from collectors.models import IngestToken, Project, Run
    from collectors.reliability import checkpoint_facts
    from collectors.stalls import detect_stalls

    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert settings.CELERY_TASK_ALWAYS_EAGER
    call_command("migrate", verbosity=0)
    get_user_model().objects.create_superuser("admin", "admin@example.com", "embedded-pass")
    project = Project.objects.create(slug="llm", name="llm")
    _, token = IngestToken.issue(project, "demo")

    client = Client(HTTP_HOST="127.0.0.1")  # the embedded default ALLOWED_HOSTS
    statuses: dict[str, list[int] | int] = {"ingest": []}

    def ingest(batch: dict) -> None:
        response = client.post("/api/v1/ingest", data=json.dumps(batch),
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {token}")
        statuses["ingest"].append(response.status_code)
        if response.status_code != 202:
            print("ingest answered", response.status_code, response.content.decode()[:500],
                  file=sys.stderr)

    for batch in demo_batches(time.time() - 600):
        ingest(batch)

    detect_stalls()

    client.login(username="admin", password="embedded-pass")
    runs = client.get("/runs.json")
    statuses["runs.json"] = runs.status_code
    run_id = runs.json()["runs"][0]["id"] if runs.status_code == 200 else 0
    pages = {
        "runs": "/",
        "run": f"/runs/{run_id}/",
        "series.json": f"/runs/{run_id}/series.json",
        "failures": f"/runs/{run_id}/failures/",
        "checkpoints": f"/runs/{run_id}/checkpoints/",
    }
    seen: dict[str, object] = {}
    for name, url in pages.items():
        response = client.get(url)
        statuses[name] = response.status_code
        if name == "series.json" and response.status_code == 200:
            seen["loss_traces"] = len(response.json()["charts"]["loss"]["data"])
            seen["header_attempts"] = response.json()["run"]["attempts"]
    seen["checkpoints"] = [[f.attempt, f.kind, f.step, f.duration_s, f.bytes]
                           for f in checkpoint_facts(Run.objects.get(pk=run_id))]
    if runs.status_code == 200:
        [row] = runs.json()["runs"]
        seen.update(run=row["name"], last_step=row["last_step"], attempts=row["attempts"],
                    steps_per_s=row["steps_per_s"])

    # The simulated cluster `make demo` runs beside the real job: stored on SQLite through the
    # same ingest task, its pages served.
    from datetime import UTC, datetime, timedelta

    from collectors.simulation import SimConfig, run_simulation

    truth = run_simulation(SimConfig(
        project="llm", run_name="sim-cluster", gpus=8, days=0.05, seed=3, interruptions=1,
        start=datetime.now(UTC) - timedelta(days=0.06)))
    for name, url in {"sim_run": f"/runs/{truth.run_id}/",
                      "sim_failures": f"/runs/{truth.run_id}/failures/"}.items():
        statuses[name] = client.get(url).status_code
    simulated = Run.objects.get(pk=truth.run_id)
    seen["sim"] = {"timezone": simulated.timezone, "status": simulated.status,
                   "attempts": simulated.attempts.count(),
                   "interruptions": list(simulated.interruptions.values_list("category", flat=True)),
                   "planted": truth.interruptions}
    print(json.dumps({"statuses": statuses, "seen": seen}))


if __name__ == "__main__":
    main()
