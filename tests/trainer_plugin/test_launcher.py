"""runwatch-run (trainer_plugin.run) with real child processes against the loopback collector:
output passes through, the exit code is kept, and a failure (exit code, SIGKILL, segfault, torchrun's
ChildFailedError) arrives as one interruption event with its evidence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from trainer_plugin import Monitor
from trainer_plugin.run import StderrTail, default_run_name, parse_child_failed

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def launcher_args(url: str | None, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "trainer_plugin.run"]
    if url:
        args += ["--project", "llm", "--run", "launched", "--url", url, "--token", "rw_test"]
    return [*args, *extra]


def launch(url: str | None, command: list[str], *extra: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*launcher_args(url, *extra), "--", *command], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def only_interruption(collector) -> dict:
    assert len(collector.accepted) == 1, collector.received
    batch = collector.accepted[0]
    assert batch["run"]["project"] == "llm"
    assert batch["run"]["name"] == "launched"
    assert batch["source"]["rank"] == 0
    assert batch["steps"]["step"] == []
    [event] = batch["events"]
    assert event["kind"] == "interruption"
    assert event["source"] == "launcher"
    return event


def test_success_passes_output_through_and_reports_nothing(collector):
    done = launch(collector.url, python("""
        import sys
        print("step 1 loss 2.5")
        print("a warning", file=sys.stderr)
        print("step 2 loss 2.1")
    """))

    assert done.returncode == 0
    assert done.stdout == "step 1 loss 2.5\nstep 2 loss 2.1\n"
    assert done.stderr == "a warning\n"
    assert collector.received == []


def test_exit_code_is_kept_and_reported_with_the_stderr_tail(collector):
    done = launch(collector.url, python("""
        import sys
        print("training")
        for i in range(500):
            print(f"log line {i}", file=sys.stderr)
        sys.exit(3)
    """), "--tail-lines", "50")

    assert done.returncode == 3
    assert done.stdout == "training\n"
    # Every line passes through; the launcher adds one line of its own at the end.
    assert done.stderr.splitlines()[:500] == [f"log line {i}" for i in range(500)]
    assert done.stderr.splitlines()[500].startswith("runwatch-run: reported to Runwatch: exit code 3")
    event = only_interruption(collector)
    assert event["exit_code"] == 3
    assert "signal" not in event
    assert event["reason"] == "exit code 3"
    assert event["stderr_tail"].splitlines() == [f"log line {i}" for i in range(450, 500)]
    assert event["command"].endswith("sys.exit(3)\n'")
    assert collector.received[0].headers["authorization"] == "Bearer rw_test"


def test_sigkill_is_reported_as_the_signal(collector):
    done = launch(collector.url, python("""
        import os, signal, sys
        print("allocating", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """))

    assert done.returncode == 128 + signal.SIGKILL
    event = only_interruption(collector)
    assert event["signal"] == "SIGKILL"
    assert event["exit_code"] == -signal.SIGKILL
    assert event["reason"] == "killed by SIGKILL"
    assert event["stderr_tail"] == "allocating"


def test_segfault_is_reported_as_sigsegv_with_the_fault_report(collector):
    done = launch(collector.url, [sys.executable, "-X", "faulthandler", "-c",
                                  "import ctypes; ctypes.string_at(0)"])

    assert done.returncode == 128 + signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    event = only_interruption(collector)
    assert event["signal"] == "SIGSEGV"
    assert event["exit_code"] == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in event["stderr_tail"]
    assert "string_at" in event["stderr_tail"]


def test_torchrun_child_failed_error_is_reported_with_the_real_root_cause(collector, tmp_path):
    script = tmp_path / "train_shards.py"
    script.write_text(textwrap.dedent("""
        import os, time
        if os.environ["RANK"] == "1":
            raise ValueError("shard 17 of the dataset is corrupt")
        time.sleep(120)
    """))

    done = launch(collector.url, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node=2", str(script)])

    assert done.returncode == 1
    assert "ChildFailedError" in done.stderr
    event = only_interruption(collector)
    assert event["exit_code"] == 1
    assert "Root Cause (first observed failure)" in event["stderr_tail"]
    cause = event["root_cause"]
    assert cause["rank"] == 1
    assert cause["local_rank"] == 1
    assert cause["exitcode"] == 1
    assert cause["worker_traceback"].startswith("Traceback (most recent call last):")
    assert cause["worker_traceback"].endswith("ValueError: shard 17 of the dataset is corrupt")
    assert "ChildFailedError" not in cause["worker_traceback"]
    assert event["reason"] == "ChildFailedError: rank 1 exit code 1"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_signals_to_the_launcher_reach_the_whole_process_group(collector, tmp_path, signum):
    # The command starts a worker of its own, as torchrun does; both must hear the signal.
    child = tmp_path / "job.py"
    child.write_text(textwrap.dedent("""
        import signal, subprocess, sys, time
        def stop(signum, frame):
            # One write per line: both processes share the pipe, and print() may split a line
            # into several writes (unbuffered stdout) that interleave with the other's.
            sys.stdout.write("job got " + signal.Signals(signum).name + chr(10)); sys.stdout.flush()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # Seen once in CI: the worker outlived the signal. Say what its kernel state was
                # (blocked, pending, caught signals), then wait on: the test's timeout bounds it,
                # and a worker that never heard the signal ends its sleep without "worker got".
                with open(f"/proc/{worker.pid}/status") as status:
                    sys.stderr.write("".join(line for line in status
                                             if line.startswith(("State", "Sig", "Shd"))))
                worker.wait()
            sys.exit(7)
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, stop)
        worker = subprocess.Popen([sys.executable, "-c", '''
        import signal, sys, time
        def stop(signum, frame):
            sys.stdout.write("worker got " + signal.Signals(signum).name + chr(10)); sys.stdout.flush()
            sys.exit(0)
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, stop)
        print("ready", flush=True)
        time.sleep(120)
        '''])
        time.sleep(120)
    """))
    launcher = subprocess.Popen([*launcher_args(collector.url), "--", sys.executable, str(child)],
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline() == "ready\n"
        launcher.send_signal(signum)
        stdout, stderr = launcher.communicate(timeout=TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()

    name = signal.Signals(signum).name
    assert launcher.returncode == 7, stderr
    assert sorted(stdout.splitlines()) == [f"job got {name}", f"worker got {name}"]
    event = only_interruption(collector)
    assert event["exit_code"] == 7
    assert event["received_signal"] == name


def test_unhandled_sigterm_ends_the_command_and_is_reported(collector):
    launcher = subprocess.Popen(
        [*launcher_args(collector.url), "--", *python("""
            import time
            print("ready", flush=True)
            time.sleep(120)
        """)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline() == "ready\n"
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()

    assert launcher.returncode == 128 + signal.SIGTERM
    event = only_interruption(collector)
    assert event["signal"] == "SIGTERM"
    assert event["received_signal"] == "SIGTERM"


def test_the_command_reports_to_the_same_run_through_runwatch_variables(collector, tmp_path):
    script = tmp_path / "pretrain_llm.py"
    script.write_text("import os\nfor name in ('RUNWATCH_PROJECT', 'RUNWATCH_RUN', 'RUNWATCH_URL', "
                      "'RUNWATCH_TOKEN'):\n    print(os.environ.get(name))\nraise SystemExit(1)\n")

    done = subprocess.run(
        [sys.executable, "-m", "trainer_plugin.run", "--", sys.executable, str(script)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RUNWATCH_PROJECT": "llm",
             "RUNWATCH_URL": collector.url, "RUNWATCH_TOKEN": "rw_env"},
    )

    assert done.returncode == 1
    # No --run and no RUNWATCH_RUN: the script's name, which is what its Monitor would choose.
    assert done.stdout.splitlines() == ["llm", "pretrain_llm", collector.url, "rw_env"]
    [batch] = collector.accepted
    assert batch["run"]["name"] == "pretrain_llm"
    assert collector.received[0].headers["authorization"] == "Bearer rw_env"


def test_an_unreachable_collector_changes_neither_exit_code_nor_output(closed_port_url):
    done = launch(closed_port_url, python("""
        import sys
        print("out")
        print("err", file=sys.stderr)
        sys.exit(5)
    """))

    assert done.returncode == 5
    assert done.stdout == "out\n"
    lines = done.stderr.splitlines()
    assert lines[0] == "err"
    assert lines[1].startswith("runwatch-run: could not report the failure to Runwatch")


def test_an_undelivered_report_is_sent_by_the_next_start_of_the_run(closed_port_url, collector):
    done = launch(closed_port_url, python("import sys; sys.exit(5)"))
    assert done.returncode == 5
    assert "the report waits in" in done.stderr

    # The requeued job's Monitor (same run, same rank) finds the report in the spool and sends it.
    monitor = Monitor(project="llm", run="launched", url=collector.url, flush_interval_s=0.1)
    assert monitor.close()

    interruptions = [e for e in collector.events() if e["kind"] == "interruption"]
    assert len(interruptions) == 1
    assert interruptions[0]["source"] == "launcher"
    assert interruptions[0]["exit_code"] == 5


def test_a_refused_report_changes_nothing_and_says_why(collector):
    collector.answer(401, error="unknown or revoked token")

    done = launch(collector.url, python("import sys; sys.exit(2)"))

    assert done.returncode == 2
    assert len(collector.received) == 1  # a 4xx is never retried
    assert "Runwatch refused the failure report" in done.stderr
    assert "unknown or revoked token" in done.stderr


def test_without_configuration_it_only_runs_the_command():
    done = launch(None, python("import sys; print('hi'); sys.exit(4)"))

    assert done.returncode == 4
    assert done.stdout == "hi\n"
    assert "Runwatch is not configured" in done.stderr


def test_a_command_that_cannot_start_exits_127_and_is_reported(collector):
    done = launch(collector.url, ["/nonexistent/train-binary", "--lr", "3e-4"])

    assert done.returncode == 127
    assert "cannot run '/nonexistent/train-binary'" in done.stderr
    event = only_interruption(collector)
    assert event["exit_code"] == 127
    assert "No such file or directory" in event["stderr_tail"]


def test_no_command_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "trainer_plugin.run", "--project", "llm"],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)

    assert done.returncode == 2
    assert "give the command to run after --" in done.stderr


def test_the_console_script_points_at_main():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["runwatch-run"] == "trainer_plugin.run:main"


# --- pure parts ---------------------------------------------------------------------------------


def test_tail_keeps_the_last_lines_across_chunks_and_redrawn_progress_bars():
    tail = StderrTail(3)
    for chunk in (b"one\ntw", b"o\nthree\n", b"10%\r50%\r100%\r\n", b"\x1b[31mred\x1b[0m\nlast"):
        tail.feed(chunk)

    assert tail.text() == "100%\nred\nlast"


def test_tail_cuts_endless_lines_to_their_end():
    tail = StderrTail(5)
    tail.feed(b"x" * 100_000 + b"END\n")

    [line] = tail.text().splitlines()
    assert line.endswith("xEND")
    assert len(line) <= 2001


def test_tail_decodes_broken_utf8():
    tail = StderrTail(5)
    tail.feed("température ".encode() + b"\xff\n")

    assert tail.text() == "température \ufffd"


RECORDED_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
rec.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_17:30:00
  host      : node017
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 23811)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 23811
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_17:29:58
  host      : node017
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 23812)
  error_file: /tmp/torchelastic_dl0vjl1v/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
      return f(*args, **kwargs)
    File "/tmp/h/rec.py", line 6, in main
      raise RuntimeError("CUDA error: an illegal memory access was encountered")
  RuntimeError: CUDA error: an illegal memory access was encountered

============================================================
"""


def test_root_cause_with_a_recorded_traceback():
    cause = parse_child_failed(RECORDED_REPORT)

    assert cause["rank"] == 3
    assert cause["local_rank"] == 1
    assert cause["host"] == "node017"
    assert cause["exitcode"] == 1
    assert cause["pid"] == 23812
    assert cause["error_file"] == "/tmp/torchelastic_dl0vjl1v/attempt_0/1/error.json"
    assert cause["traceback"].splitlines()[0] == "Traceback (most recent call last):"
    assert cause["traceback"].splitlines()[-1] == \
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "worker_traceback" not in cause
    # The other rank, stopped by torchrun's SIGTERM, is not the root cause.
    assert "SIGTERM" not in cause["block"]


def test_root_cause_killed_by_a_signal_with_rank_prefixed_output():
    text = textwrap.dedent("""\
        [rank0]:Traceback (most recent call last):
        [rank0]:  File "train.py", line 3, in <module>
        [rank0]:KeyboardInterrupt
        [rank1]:Traceback (most recent call last):
        [rank1]:  File "train.py", line 9, in <module>
        [rank1]:    loss.backward()
        [rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
        Root Cause (first observed failure):
        [0]:
          time      : 2026-12-02_17:29:58
          host      : node017
          rank      : 1 (local_rank: 1)
          exitcode  : -9 (pid: 4242)
          error_file: <N/A>
          traceback : Signal 9 (SIGKILL) received by PID 4242
        ============================================================
    """)

    cause = parse_child_failed(text)

    assert cause["exitcode"] == -9
    assert cause["signal"] == "SIGKILL"
    assert cause["traceback"] == "Signal 9 (SIGKILL) received by PID 4242"
    assert cause["worker_traceback"].splitlines()[-1] == \
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_no_root_cause_without_a_torchrun_report():
    assert parse_child_failed("Traceback (most recent call last):\nValueError: x") is None


@pytest.mark.parametrize(("command", "name"), [
    (["torchrun", "--nproc_per_node=8", "scripts/train_llm.py", "--lr", "3e-4"], "train_llm"),
    (["python", "-u", "train.py"], "train"),
    (["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"], "train"),
    (["python", "-m", "recipes.pretrain"], "pretrain"),
    (["/opt/bin/trainer", "--config", "a.yaml"], "trainer"),
])
def test_default_run_name_is_what_the_script_s_monitor_would_choose(command, name):
    assert default_run_name(command) == name
