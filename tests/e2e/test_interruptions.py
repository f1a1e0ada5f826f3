"""Each way a training process ends reaches PostgreSQL through the HTTP API and a real Celery
worker: a signal or an exception becomes an `interruption` Event and a classified Interruption
with its evidence; a checkpoint save and restore become Checkpoint rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from collectors.models import Checkpoint, Event, IngestToken, Interruption, Project, Run
from tests.e2e.conftest import ROOT, wait_for
from tests.trainer_plugin.test_interruptions import CHILD

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def token(transactional_db) -> str:
    return IngestToken.issue(Project.objects.create(slug="llm"))[1]


def run_child(mode: str, run_name: str, url: str, token: str, tmp_path,
              send: signal.Signals | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "HOME": str(tmp_path), "RUNWATCH_URL": url, "RUNWATCH_TOKEN": token,
           "RUNWATCH_PROJECT": "llm", "RUNWATCH_RUN": run_name, "RUNWATCH_GPU_SAMPLING": "0"}
    process = subprocess.Popen([sys.executable, "-c", CHILD, mode], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if send is not None:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
            process.send_signal(send)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # A signal handler waits at most 2 s for the collector; what a slow one did not take in time
    # is in the spool, which the next process of the run (here: `runwatch sync`) sends.
    sync = subprocess.run([sys.executable, "-m", "trainer_plugin", "sync", str(tmp_path / ".cache"),
                           "--url", url, "--token", token], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert sync.returncode == 0, sync.stderr
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def stored_interruption(run_name: str) -> Interruption:
    wait_for(lambda: Interruption.objects.filter(run__name=run_name).exists(),
             what=f"the interruption of {run_name}")
    return Interruption.objects.get(run__name=run_name)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT])
def test_a_signal_reaches_the_database_as_an_interruption(signum, live_server, celery_worker_process,
                                                          token, tmp_path) -> None:
    run_name = f"signal-{signum.name.lower()}"
    result = run_child("plain", run_name, live_server.url, token, tmp_path, send=signum)
    assert result.returncode == -signum, result.stderr

    interruption = stored_interruption(run_name)
    assert interruption.source == Interruption.Source.SIGNAL
    assert interruption.evidence["signal"] == signum.name
    event = Event.objects.get(run__name=run_name, kind="interruption")
    assert interruption.event_id == event.pk
    assert event.payload["signal"] == signum.name and event.payload["pid"] > 0
    assert Run.objects.get(name=run_name).last_step == 2


def test_an_exception_reaches_the_database_with_its_traceback(live_server, celery_worker_process,
                                                              token, tmp_path) -> None:
    result = run_child("main-exception", "crash", live_server.url, token, tmp_path)
    assert result.returncode == 1

    interruption = stored_interruption("crash")
    assert interruption.source == Interruption.Source.EXCEPTION
    assert interruption.evidence["exc_type"] == "RuntimeError"
    assert "illegal memory access" in interruption.evidence["text"]
    event = Event.objects.get(run__name="crash", kind="interruption")
    assert event.payload["thread"] == "MainThread"
    assert "in <module>" in event.payload["traceback"]
    wait_for(lambda: Run.objects.get(name="crash").status == Run.Status.FAILED,
             what="the run marked failed")


def test_an_exception_in_a_thread_reaches_the_database_with_the_thread(
        live_server, celery_worker_process, token, tmp_path) -> None:
    result = run_child("thread-exception", "thread-crash", live_server.url, token, tmp_path)
    assert result.returncode == 0

    interruption = stored_interruption("thread-crash")
    assert interruption.source == Interruption.Source.EXCEPTION
    assert interruption.evidence["exc_type"] == "ValueError"
    event = Event.objects.get(run__name="thread-crash", kind="interruption")
    assert event.payload["thread"] == "loader-3"


def test_checkpoint_save_and_restore_become_checkpoint_rows(live_server, celery_worker_process,
                                                            token, tmp_path) -> None:
    from trainer_plugin import Monitor

    path = tmp_path / "ckpt"
    with Monitor("llm", "checkpoints", url=live_server.url, token=token, flush_interval_s=0.2,
                 spool_dir=tmp_path / "spool", gpu_sampling=False) as monitor:
        monitor.checkpoint_loaded(40, path, duration_s=2.0)
        for step in range(41, 50):
            monitor.step(step, loss=1.0)
        with monitor.checkpoint_save(49, path):
            path.mkdir()
            (path / "model.bin").write_bytes(b"w" * 5000)
            (path / "optim.bin").write_bytes(b"o" * 3000)

    wait_for(lambda: Checkpoint.objects.filter(run__name="checkpoints").count() == 2,
             what="two checkpoint rows")
    load, save = Checkpoint.objects.filter(run__name="checkpoints").order_by("ts")
    assert (load.kind, load.step, load.duration_s, load.path) == ("load", 40, 2.0, str(path))
    assert (save.kind, save.step, save.bytes, save.path) == ("save", 49, 8000, str(path))
    assert save.duration_s >= 0
