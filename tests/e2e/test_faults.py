"""Faults during a real 2-rank torchrun job streaming steps, simulated GPU telemetry and events
through Redis and Celery into PostgreSQL; after each, every row the plugin sent is stored exactly
once and training finished without an error.

One test per fault, each on its own private servers (tests/e2e/fault_services.py: PostgreSQL
cluster, redis-server, Celery workers, gunicorn), so that stopping one never touches the shared
services or another test. Each prints what it counted and records its row in docs/reliability.md.

    Redis stopped 60 s ............ 2.4 min    (setup and test, on the shared 2-core machine
    PostgreSQL crash-restarted .... 1.9 min     with a load average of 9-15; a quiet machine
    worker SIGKILLed mid-batch ×3 . 1.5 min     mostly saves the ~30 s each job takes to start)
    HTTP ingest down 60 s ......... 2.1 min

Run with `make test-faults` (marker ``faults``; `make test` leaves them out)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, wait_for
from tests.e2e.fault_counts import Count, count, read_records
from tests.e2e.fault_services import VISIBILITY_TIMEOUT_S, PrivateStack
from tests.reliability_report import record

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

PROJECT = "faults"
RANKS = 2
OUTAGE_S = 60


class TrainingJob:
    """tests/e2e/fault_training.py under torchrun, in the background, until told to stop."""

    def __init__(self, directory: Path, run_name: str, url: str, token: str):
        self.directory = directory
        self.run_name = run_name
        self.stop_file = directory / "stop"
        self.record_dir = directory / "records"
        self.log_path = directory / "torchrun.log"
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(directory), "PYTHONPATH": str(ROOT),
                    "PYTHONUNBUFFERED": "1", "RUNWATCH_URL": url, "RUNWATCH_TOKEN": token,
                    "RUNWATCH_GPU_SAMPLING": "simulated"}
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.record_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={RANKS}", "tests/e2e/fault_training.py", "--project", PROJECT,
                 "--run-name", self.run_name, "--stop-file", str(self.stop_file),
                 "--record-dir", str(self.record_dir)],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def note(self, what: str) -> None:
        """Prints the phase with the seconds since training started, for the run's story."""
        print(f"{self.run_name} +{time.monotonic() - self.started:5.1f} s: {what}", flush=True)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def finish(self, stack: PrivateStack, timeout: float = 240) -> list[dict]:
        """Asks the ranks to stop, waits for them, and returns their records."""
        self.stop_file.touch()
        self.note("asked the ranks to stop")

        def ended() -> bool:
            stack.supervise()
            return not self.running()

        wait_for(ended, timeout=timeout, interval=0.5, what="training to finish")
        self.note(f"training ended with exit status {self.process.returncode}")
        output = self.output()
        assert self.process.returncode == 0, output
        assert "Traceback" not in output, output
        return read_records(self.record_dir, RANKS)

    def kill(self) -> None:
        if self.running():
            self.process.kill()
            self.process.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def stack(tmp_path):
    stack = PrivateStack(tmp_path / "servers", project=PROJECT)
    try:
        yield stack.start()
    finally:
        stack.stop()


def stored_steps(stack: PrivateStack, run_name: str) -> int:
    try:
        with stack.postgres.connect("runwatch", connect_timeout=2) as conn:
            return conn.execute(
                "SELECT count(*) FROM collectors_stepmetric s JOIN collectors_run r "
                "ON r.id = s.run_id WHERE r.name = %s", [run_name]).fetchone()[0]
    except Exception:  # the database may be the thing that is down
        return 0


def training(stack: PrivateStack, tmp_path: Path, run_name: str, url: str) -> TrainingJob:
    job = TrainingJob(tmp_path / "job", run_name, url, stack.token)
    job.start()
    wait_for(lambda: stored_steps(stack, run_name) >= RANKS * 10 or not job.running(),
             timeout=180, what="the first steps stored")
    assert job.running(), job.output()
    job.note(f"{stored_steps(stack, run_name)} steps stored; the fault comes now")
    return job


def settle_and_count(stack: PrivateStack, job: TrainingJob, records: list[dict]) -> Count:
    """Waits until the collectors have nothing in flight and every sent row could be there, then
    counts. Nothing in flight means no late redelivery can still add a duplicate."""
    sent = sum(r["steps"] for r in records)

    def settled() -> bool:
        stack.supervise()
        return stack.in_flight() == 0 and stored_steps(stack, job.run_name) >= sent

    try:
        wait_for(settled, timeout=240, interval=0.5, what="the collectors to store everything")
    except AssertionError:
        pass  # counted and reported below, with what is missing
    time.sleep(1)
    job.note("the collectors have nothing in flight; counting")
    found = count(stack.database_url, job.run_name, records)
    print(f"{job.run_name}: {found.summary()}; {found.batches} batches; plugin counters: "
          + ", ".join(f"rank {r['rank']} {r['stats']}" for r in records))
    return found


def assert_training_clean(records: list[dict]) -> None:
    for rec in records:
        assert rec["delivered"], rec  # close() said: everything delivered, nothing left on disk
        assert rec["stats"]["rows_dropped"] == 0, rec
        assert rec["stats"]["spooled_batches"] == 0, rec
        assert rec["steps"] == rec["stats"]["steps_recorded"], rec
    assert sum(rec["gpu_rows"] for rec in records) > 0  # the simulated sampler did send


def report(key: str, fault: str, action: str, found: Count) -> None:
    total = found.total()
    record(key, fault=fault, action=f"{action} Counted: {found.summary()}.", sent=total.sent,
           stored=total.stored, duplicated=total.duplicated)


@pytest.mark.timeout(600)
def test_redis_stopped_for_a_minute_loses_and_duplicates_nothing(stack, tmp_path):
    job = training(stack, tmp_path, "redis-stop", stack.redis.url)
    try:
        stack.redis.stop()
        stopped_at = time.monotonic()
        time.sleep(OUTAGE_S)
        assert job.running(), job.output()  # training went on through the outage
        stack.redis.start()  # same port, same append-only file
        job.note("redis-server started again")
        outage = time.monotonic() - stopped_at
        for _ in range(20):  # training goes on while the plugin replays its spool
            stack.supervise()
            time.sleep(0.5)
        records = job.finish(stack)
    finally:
        job.kill()
    found = settle_and_count(stack, job, records)
    spooled = sum(r["stats"]["rows_spooled"] for r in records)
    report("fault-redis-stopped", "Redis (the broker) stopped for 60 s mid-run",
           f"2-rank torchrun job, redis:// transport, simulated GPUs; redis-server (AOF, fsync "
           f"always) stopped with SIGTERM for {outage:.0f} s and started again; the plugin "
           f"spooled {spooled} rows and replayed them; worker restarts "
           f"{sum(w.restarts for w in stack.workers)}.", found)
    assert_training_clean(records)
    assert spooled > 0, "the outage never reached the plugin"
    found.assert_exactly_once()


@pytest.mark.timeout(600)
def test_postgresql_crash_restart_loses_and_duplicates_nothing(stack, tmp_path):
    job = training(stack, tmp_path, "postgres-restart", stack.redis.url)
    try:
        stack.postgres.stop("immediate")  # a crash: recovery from the WAL at the next start
        time.sleep(15)
        stack.postgres.start()
        job.note("PostgreSQL started again")
        for _ in range(20):
            stack.supervise()
            time.sleep(0.5)
        records = job.finish(stack)
    finally:
        job.kill()
    found = settle_and_count(stack, job, records)
    worker_log = "".join(w.log_path.read_text(errors="replace") for w in stack.workers)
    retried = worker_log.count("Retry in")
    report("fault-postgres-restart", "PostgreSQL crash-restarted mid-run",
           f"2-rank torchrun job, redis:// transport, simulated GPUs; private PostgreSQL stopped "
           f"with `pg_ctl stop -m immediate` (a crash), started 15 s later (WAL recovery); "
           f"{retried} ingest tasks failed on the database and were retried.", found)
    assert_training_clean(records)
    assert retried > 0, "no ingest task ever met the database down"
    found.assert_exactly_once()


def backend_blocked_in_copy(stack: PrivateStack) -> bool:
    with stack.postgres.connect("runwatch") as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'runwatch' AND "
            "wait_event_type = 'Lock' AND query LIKE 'COPY \"collectors_stepmetric\"%'"
        ).fetchone()[0] > 0


@pytest.mark.timeout(600)
def test_worker_sigkilled_mid_batch_three_times_loses_and_duplicates_nothing(tmp_path):
    # One pool process: the one executing the batch is the one killed.
    stack = PrivateStack(tmp_path / "servers", project=PROJECT, concurrency=1).start()
    try:
        job = training(stack, tmp_path, "worker-kill", stack.redis.url)
        (worker,) = stack.workers
        kills = []
        try:
            for kill in ("whole worker", "pool process", "whole worker"):
                before = stored_steps(stack, job.run_name)
                # Hold the step table: the next ingest task claims its batch id, writes its run
                # and attempt, and then waits inside its transaction at the COPY of the steps.
                # That is the middle of a batch, made certain rather than hoped for.
                with stack.postgres.connect("runwatch") as lock:
                    lock.autocommit = False
                    lock.execute("LOCK TABLE collectors_stepmetric IN SHARE ROW EXCLUSIVE MODE")
                    wait_for(lambda: backend_blocked_in_copy(stack), timeout=60,
                             what="an ingest task in the middle of its batch")
                    if kill == "whole worker":
                        worker.kill_all()  # main process and pool: the node died
                    else:
                        (child,) = worker.pool_pids()
                        subprocess.run(["kill", "-KILL", str(child)], check=True)
                    kills.append(kill)
                    job.note(f"SIGKILL to the {kill} in the middle of a batch")
                    lock.rollback()
                if kill == "whole worker":
                    # The replacement comes up after the dead worker's messages have passed the
                    # visibility timeout, so that it restores them as it starts (kombu otherwise
                    # scans for them only every 100 s).
                    time.sleep(VISIBILITY_TIMEOUT_S + 1)
                stack.supervise()
                wait_for(lambda before=before: stored_steps(stack, job.run_name) > before + 20,
                         timeout=120, what="steps stored again after the kill")
            records = job.finish(stack)
        finally:
            job.kill()
        found = settle_and_count(stack, job, records)
        worker_log = worker.log_path.read_text(errors="replace")
        lost_workers = worker_log.count("WorkerLostError")
        report("fault-worker-sigkill", "Celery worker SIGKILLed in the middle of a batch, 3 times",
               "2-rank torchrun job, redis:// transport, simulated GPUs; each time an ingest task "
               "had claimed its batch id and was blocked writing the steps (a table lock held by "
               f"the test) when it was killed: {', '.join(kills)} (SIGKILL); redelivered by "
               "acks_late (the pool process: at once; the whole worker: after the visibility "
               f"timeout, on restart; {worker.restarts} restarts).", found)
        assert_training_clean(records)
        assert worker.restarts >= 2
        assert lost_workers >= 1, "the pool process's death was not seen as a lost worker"
        found.assert_exactly_once()
    finally:
        stack.stop()


@pytest.mark.timeout(600)
def test_http_ingest_down_for_a_minute_loses_and_duplicates_nothing(stack, tmp_path):
    ingest = stack.start_ingest()
    job = training(stack, tmp_path, "http-down", ingest.url)
    try:
        ingest.stop()
        stopped_at = time.monotonic()
        time.sleep(OUTAGE_S)
        assert job.running(), job.output()
        ingest.start()  # same port
        job.note("the ingest API started again")
        outage = time.monotonic() - stopped_at
        for _ in range(20):
            stack.supervise()
            time.sleep(0.5)
        records = job.finish(stack)
    finally:
        job.kill()
    found = settle_and_count(stack, job, records)
    spooled = sum(r["stats"]["rows_spooled"] for r in records)
    report("fault-http-down", "HTTP ingest API down for 60 s mid-run",
           f"2-rank torchrun job, http:// transport to gunicorn, simulated GPUs; gunicorn "
           f"stopped for {outage:.0f} s and started again on the same port; the plugin spooled "
           f"{spooled} rows and replayed them.", found)
    assert_training_clean(records)
    assert spooled > 0, "the outage never reached the plugin"
    found.assert_exactly_once()
