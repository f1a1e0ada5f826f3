"""The README's promise: the example script under `torchrun --nproc_per_node=2`, streaming both
ranks through each transport and a real Celery worker into PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest

from collectors.models import Attempt, Event, IngestToken, Project, Run, StepMetric
from tests.e2e.conftest import ROOT, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

STEPS = 25


@pytest.fixture
def token(transactional_db) -> str:
    return IngestToken.issue(Project.objects.create(slug="demo"))[1]


@pytest.mark.parametrize("transport", ["http", "redis"])
def test_two_rank_torchrun_job_streams_every_step_of_both_ranks(transport, request, token, tmp_path,
                                                                 celery_worker_process, broker_url):
    url = request.getfixturevalue("live_server").url if transport == "http" else broker_url
    run_name = f"torchrun-{transport}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RUNWATCH_URL": url,
           "RUNWATCH_TOKEN": token, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}

    finished = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "examples/train_tiny.py", "--steps", str(STEPS), "--project", "demo", "--run-name", run_name,
         "--log-every", "5", "--checkpoint-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )

    assert finished.returncode == 0, finished.stderr[-3000:]
    wait_for(lambda: StepMetric.objects.filter(run__name=run_name).count() == 2 * STEPS
             and Run.objects.filter(name=run_name, status="finished").exists(),
             what=f"{2 * STEPS} step rows and the finish")
    run = Run.objects.get(name=run_name)
    assert run.world_size == 2
    assert run.config["steps"] == STEPS
    for rank in (0, 1):
        steps = list(StepMetric.objects.filter(run=run, rank=rank).order_by("step"))
        assert [s.step for s in steps] == list(range(STEPS))
        assert all(s.loss is not None and s.loss > 0 for s in steps)
        assert all(s.tokens == steps[0].tokens > 0 for s in steps)
        # A real model learns: the last steps' loss is below the first's.
        assert sum(s.loss for s in steps[-5:]) < sum(s.loss for s in steps[:5])
    assert Attempt.objects.filter(run=run).count() == 1
    assert Event.objects.filter(run=run, kind="start").count() == 2
    assert Event.objects.filter(run=run, kind="finish").count() == 2
