"""runwatch-run end to end: a command killed by SIGKILL, one that segfaults, and a torchrun job whose
rank 1 runs out of memory each reach PostgreSQL, through the HTTP API and a real Celery worker, as a
launcher `interruption` Event with its evidence and a classified Interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from collectors.models import Attempt, Event, IngestToken, Interruption, Project, Run
from tests.e2e.conftest import ROOT, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def token(transactional_db) -> str:
    return IngestToken.issue(Project.objects.create(slug="llm"))[1]


def launch(command: list[str], run_name: str, url: str, token: str, tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "HOME": str(tmp_path), "RUNWATCH_URL": url, "RUNWATCH_TOKEN": token,
           "RUNWATCH_PROJECT": "llm", "RUNWATCH_GPU_SAMPLING": "0"}
    return subprocess.run([sys.executable, "-m", "trainer_plugin.run", "--run", run_name, "--",
                           *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def stored_interruption(run_name: str) -> Interruption:
    wait_for(lambda: Interruption.objects.filter(run__name=run_name).exists(),
             what=f"the interruption of {run_name}")
    return Interruption.objects.get(run__name=run_name)


def test_a_sigkilled_command_reaches_the_database(live_server, celery_worker_process, token,
                                                  tmp_path):
    done = launch([sys.executable, "-c", "import os, signal, sys; print('loading shards', "
                   "file=sys.stderr, flush=True); os.kill(os.getpid(), signal.SIGKILL)"],
                  "oom-killed", live_server.url, token, tmp_path)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr

    interruption = stored_interruption("oom-killed")
    event = Event.objects.get(run__name="oom-killed", kind="interruption")
    assert event.payload["source"] == "launcher"
    assert event.payload["signal"] == "SIGKILL"
    assert event.payload["exit_code"] == -9
    assert event.payload["stderr_tail"] == "loading shards"
    assert interruption.event == event
    assert interruption.source == Interruption.Source.LAUNCHER
    assert interruption.category == "host"
    assert interruption.evidence["signal"] == "SIGKILL"
    run = Run.objects.get(name="oom-killed")
    assert run.status == Run.Status.INTERRUPTED
    assert Attempt.objects.get(run=run).exit_reason == "killed by SIGKILL"
    # The launcher reports only the end: no start or finish of its own.
    assert list(Event.objects.filter(run=run).values_list("kind", flat=True)) == ["interruption"]


def test_a_segfault_reaches_the_database_with_the_fault_report(live_server, celery_worker_process,
                                                               token, tmp_path):
    done = launch([sys.executable, "-X", "faulthandler", "-c", "import ctypes; ctypes.string_at(0)"],
                  "segfault", live_server.url, token, tmp_path)
    assert done.returncode == 128 + signal.SIGSEGV, done.stderr

    interruption = stored_interruption("segfault")
    assert interruption.event.payload["signal"] == "SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in interruption.event.payload["stderr_tail"]
    assert interruption.source == Interruption.Source.LAUNCHER
    assert interruption.category == "software_bug"
    assert interruption.rule == "segfault"


def test_torchrun_child_failed_error_is_classified_by_its_root_cause(live_server,
                                                                     celery_worker_process, token,
                                                                     tmp_path):
    script = tmp_path / "train_oom.py"
    script.write_text(textwrap.dedent("""
        import os, time
        import torch
        if os.environ["RANK"] == "1":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        time.sleep(120)
    """))

    done = launch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node=2", str(script)], "torchrun-oom", live_server.url, token,
                  tmp_path)
    assert done.returncode == 1, done.stderr
    assert "ChildFailedError" in done.stderr

    interruption = stored_interruption("torchrun-oom")
    payload = interruption.event.payload
    assert payload["exit_code"] == 1
    assert payload["root_cause"]["rank"] == 1
    assert payload["root_cause"]["exitcode"] == 1
    assert payload["root_cause"]["worker_traceback"].endswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert payload["reason"] == "ChildFailedError: rank 1 exit code 1"
    # Not "software_bug" from torchrun's own ChildFailedError traceback: the worker's OOM decides.
    assert interruption.category == "gpu_oom"
    assert interruption.rule == "cuda-oom"
    assert "CUDA out of memory" in interruption.evidence["matched"]
    assert Run.objects.get(name="torchrun-oom").status == Run.Status.INTERRUPTED
