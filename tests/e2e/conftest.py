"""A real Celery worker process on the real Redis broker, writing into the test database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition, timeout: float = 60.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class WorkerProcess:
    def __init__(self, env: dict[str, str], log_path: Path):
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q", "ingest,runwatch",
             "--concurrency", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-n", f"e2e-{os.getpid()}@%h"],
            cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_for(lambda: b"ready." in self.log_path.read_bytes() or self.process.poll() is not None,
                 timeout=60, what="the Celery worker to start")
        if self.process.poll() is not None:
            raise RuntimeError(f"Celery worker exited at start:\n{self.output()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]
