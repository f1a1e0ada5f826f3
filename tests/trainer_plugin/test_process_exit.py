"""A script that forgets close(), or dies of an uncaught exception, still reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, url: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "RUNWATCH_URL": url, "RUNWATCH_PROJECT": "llm", "RUNWATCH_RUN": "exit-test",
           "RUNWATCH_TOKEN": "t", "RUNWATCH_SPOOL_DIR": os.environ["RUNWATCH_SPOOL_DIR"],
           "RUNWATCH_GPU_SAMPLING": "0"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)


def test_script_that_forgets_close_still_flushes_at_exit(collector) -> None:
    result = _run("from trainer_plugin import Monitor\n"
                  "m = Monitor(flush_interval_s=30)\n"
                  "for _ in range(5):\n"
                  "    m.step(loss=1.0)\n", collector.url)
    assert result.returncode == 0, result.stderr
    assert collector.steps()["step"] == [0, 1, 2, 3, 4]
    assert [e["kind"] for e in collector.events() if e["kind"] != "heartbeat"] == ["start", "finish"]
    assert collector.events()[-1]["status"] == "finished"


def test_uncaught_exception_is_recorded_as_interruption(collector) -> None:
    result = _run("from trainer_plugin import Monitor\n"
                  "m = Monitor(flush_interval_s=30)\n"
                  "m.step(loss=1.0)\n"
                  "raise MemoryError('host out of memory')\n", collector.url)
    assert result.returncode == 1
    assert "MemoryError: host out of memory" in result.stderr  # the user's traceback is intact
    events = [e for e in collector.events() if e["kind"] != "heartbeat"]
    assert [e["kind"] for e in events] == ["start", "interruption", "finish"]
    assert events[1]["exc_type"] == "MemoryError"
    assert events[2]["status"] == "failed"
