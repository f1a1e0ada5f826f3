"""How a training process ends, as the collector sees it: each signal, an exception in the main
thread or another thread, all reach the collector as an `interruption` with their evidence, and the
process ends exactly as it would without Runwatch."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A training loop that runs until it is told to stop. ``mode`` sets up what the job had before
# Runwatch: nothing, its own handler, or an ignored signal.
CHILD = r"""
import os, signal, sys, threading, time
from trainer_plugin import Monitor

mode = sys.argv[1]
if mode == "ignore-usr1":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
if mode == "own-term":
    def own(signum, frame):
        os.write(1, b"own handler ran\n")  # print() is not safe in a signal handler
        sys.exit(7)
    signal.signal(signal.SIGTERM, own)
monitor = Monitor(flush_interval_s=float(os.environ.get("CHILD_FLUSH_S", "30")),
                  heartbeat_interval_s=0)
for step in range(3):
    monitor.step(step, loss=1.0)
if mode == "thread-exception":
    def load():
        raise ValueError("shard 17 is truncated")
    worker = threading.Thread(target=load, name="loader-3")
    worker.start()
    worker.join()
    monitor.close()
    sys.exit(0)
if mode == "main-exception":
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def child_env(url: str | None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "RUNWATCH_PROJECT": "llm", "RUNWATCH_RUN": "signals", "RUNWATCH_TOKEN": "t",
           "RUNWATCH_SPOOL_DIR": os.environ["RUNWATCH_SPOOL_DIR"], "RUNWATCH_GPU_SAMPLING": "0"}
    if url:
        env["RUNWATCH_URL"] = url
    return env


def run_child(mode: str, url: str | None, send: list[signal.Signals],
              **extra_env: str) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=child_env(url) | extra_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if send:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready", process.stderr.read()
            for signum in send:
                process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def interruptions(collector) -> list[dict]:
    return [event for event in collector.events() if event["kind"] == "interruption"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT])
def test_a_signal_is_recorded_and_the_process_ends_as_without_runwatch(collector, signum) -> None:
    without = run_child("plain", None, [signum])
    result = run_child("plain", collector.url, [signum])

    assert result.returncode == without.returncode, result.stderr
    if signum == signal.SIGINT:
        # Python's own handler ran: KeyboardInterrupt, its traceback, and death by SIGINT.
        assert "KeyboardInterrupt" in result.stderr
        assert result.returncode == -signal.SIGINT
    else:
        assert result.returncode == -signum  # the default action: killed by that signal
    assert collector.wait_for(lambda: len(interruptions(collector)) >= 1, timeout_s=10)
    event = interruptions(collector)[0]
    assert event["source"] == "signal"
    assert event["signal"] == signum.name
    assert event["pid"] > 0 and event["thread"] == "MainThread"
    assert "in <module>" in event["traceback"]  # where the main thread was
    assert event["chained_to"] == ("KeyboardInterrupt" if signum == signal.SIGINT else "default")
    assert len(interruptions(collector)) == 1  # SIGINT's KeyboardInterrupt is not a second one
    # The steps before the signal were flushed with it.
    assert collector.steps()["step"] == [0, 1, 2]


def test_a_handler_the_job_had_still_runs_after_the_signal_is_recorded(collector) -> None:
    result = run_child("own-term", collector.url, [signal.SIGTERM])
    assert result.returncode == 7, result.stderr
    assert "own handler ran" in result.stdout
    events = interruptions(collector)
    assert [event["signal"] for event in events] == ["SIGTERM"]
    assert events[0]["chained_to"].endswith("own")
    # The handler exited through sys.exit: atexit ran, so the finish arrived too.
    assert collector.events()[-1]["kind"] == "finish"


def test_an_ignored_signal_stays_ignored_and_is_not_an_interruption(collector) -> None:
    result = run_child("ignore-usr1", collector.url, [signal.SIGUSR1, signal.SIGTERM])
    assert result.returncode == -signal.SIGTERM
    assert [event["signal"] for event in interruptions(collector)] == ["SIGTERM"]


def test_an_exception_in_the_main_thread_is_sent_with_its_evidence(collector) -> None:
    result = run_child("main-exception", collector.url, [])
    assert result.returncode == 1
    assert "RuntimeError: CUDA error" in result.stderr  # the user's traceback is intact
    (event,) = interruptions(collector)
    assert event["source"] == "exception"
    assert event["exc_type"] == "RuntimeError"
    assert event["message"] == "CUDA error: an illegal memory access was encountered"
    assert "in <module>" in event["traceback"] and "RuntimeError: CUDA error" in event["traceback"]
    assert event["thread"] == "MainThread"
    assert collector.events()[-1] == {**collector.events()[-1], "kind": "finish",
                                      "status": "failed"}


def test_an_exception_in_another_thread_is_sent_with_the_thread_name(collector) -> None:
    result = run_child("thread-exception", collector.url, [])
    assert result.returncode == 0, result.stderr
    assert "Exception in thread loader-3" in result.stderr  # Python's own report still printed
    (event,) = interruptions(collector)
    assert event["source"] == "exception"
    assert event["exc_type"] == "ValueError"
    assert event["message"] == "shard 17 is truncated"
    assert event["thread"] == "loader-3"
    assert "in load" in event["traceback"] and "ValueError: shard 17" in event["traceback"]


def test_a_signal_while_the_collector_hangs_leaves_the_interruption_on_disk(collector) -> None:
    # A collector that accepts connections and never answers: the sender hangs in a send.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = run_child("plain", url, [signal.SIGTERM], CHILD_FLUSH_S="0.05")
    assert result.returncode == -signal.SIGTERM, result.stderr

    spool = Path(os.environ["RUNWATCH_SPOOL_DIR"])
    sync = subprocess.run([sys.executable, "-m", "trainer_plugin", "sync", str(spool), "--url",
                           collector.url], env=child_env(None), capture_output=True, text=True,
                          timeout=120)
    assert sync.returncode == 0, sync.stderr
    # Copies of a batch keep its id; the collectors store an id once, so count ids once.
    unique = {batch["batch_id"]: batch for batch in collector.accepted}.values()
    events = [event for batch in unique for event in batch["events"]]
    assert [event["signal"] for event in events if event["kind"] == "interruption"] == ["SIGTERM"]
    assert sorted(step for batch in unique for step in batch["steps"]["step"]) == [0, 1, 2]
