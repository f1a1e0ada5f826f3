"""runwatch-run: runs a training command and reports to Runwatch how it ended when it fails.

    runwatch-run --project llm --run llama-8b -- torchrun --nproc_per_node=8 train.py
    python -m trainer_plugin.run -- python train.py          # project, run, url, token from RUNWATCH_*

A process killed by the OOM killer (SIGKILL), a segfault, or torchrun giving up with a
``ChildFailedError`` cannot report its own end: the launcher can. It starts the command in its own
process group with the same environment (plus RUNWATCH_* so the command's Monitor reports to the
same run), passes stdout through untouched and stderr through live while keeping its last lines,
and forwards SIGINT, SIGTERM, SIGHUP and SIGUSR1 to the whole group, so a scheduler's preemption
notice reaches torchrun and its workers. When the command fails it sends one ``interruption`` event
with ``source: "launcher"``, the exit code or signal, the stderr tail and, for torchrun, the
"Root Cause (first observed failure)" block; then it exits as a shell would (the exit code, or
128 + the signal's number). On success it says nothing: the command's own Monitor records the
finish.

The event goes out in a batch of its own rather than through a Monitor, because a Monitor would
also record a ``start`` and a ``finish`` for the launcher, and the collectors would count a restart
that never happened. A report that cannot be delivered waits in the rank's spool directory, where
the next start of the run finds and sends it. Nothing Runwatch does can change the exit code or hide
the command's output.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer_plugin import environment
from trainer_plugin.protocol import ProtocolError, make_batch, validate_batch
from trainer_plugin.spool import Spool, default_root, directory_for
from trainer_plugin.transports import PermanentSendError, TransientSendError, transport_for

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
DEFAULT_TAIL_LINES = 300
#: A line longer than this (a progress bar redrawn with \r, a dumped tensor) keeps its end.
MAX_LINE_CHARS = 2000
#: How long the launcher tries to deliver its report before giving up.
SEND_ATTEMPTS = 4
SEND_TIMEOUT_S = 10.0
#: After the command exits, how long to wait for the rest of its stderr: a daemon it left behind
#: may hold the pipe open forever.
DRAIN_TIMEOUT_S = 5.0
#: Exit codes a shell uses when it cannot start a command.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

#: ``python -m`` modules that launch the real script, which comes later on the command line.
LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _say(message: str) -> None:
    try:
        print(f"runwatch-run: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


# --- stderr -------------------------------------------------------------------------------------


class StderrTail:
    """The last ``lines`` lines of a byte stream fed in arbitrary chunks."""

    def __init__(self, lines: int = DEFAULT_TAIL_LINES):
        self._lines: deque[bytes] = deque(maxlen=max(1, lines))
        self._partial = b""
        self._lock = threading.Lock()

    def feed(self, chunk: bytes) -> None:
        with self._lock:
            pieces = (self._partial + chunk).split(b"\n")
            self._partial = pieces.pop()[-4 * MAX_LINE_CHARS:]
            self._lines.extend(pieces[-self._lines.maxlen:])

    def text(self) -> str:
        with self._lock:
            lines = list(self._lines) + ([self._partial] if self._partial else [])
        lines = lines[-self._lines.maxlen:]
        return "\n".join(_clean_line(line) for line in lines)


def _clean_line(raw: bytes) -> str:
    # A progress bar redraws itself with \r: only its last drawing is worth keeping.
    raw = raw.rstrip(b"\r")
    raw = raw.rsplit(b"\r", 1)[-1]
    line = _ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace"))
    return line if len(line) <= MAX_LINE_CHARS else "…" + line[-MAX_LINE_CHARS:]


def _pump(source_fd: int, tail: StderrTail) -> None:
    """Copies the command's stderr to ours as it comes, and into the tail. Keeps reading even when
    our stderr is gone, so that the command never blocks on a full pipe."""
    passing = True
    while True:
        try:
            chunk = os.read(source_fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        if passing:
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(2, view):]
            except OSError:
                passing = False
        tail.feed(chunk)
    try:
        os.close(source_fd)
    except OSError:
        pass


# --- torchrun's report --------------------------------------------------------------------------

_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):[ \t]*\n(?P<block>.*?)(?:\n[ \t]*={5,}|\Z)",
                         re.DOTALL)
_FIELD = re.compile(r"^\s{2}(?P<name>[a-z_]+)\s*:\s?(?P<value>.*)$")
_CHILD_FAILED = "ChildFailedError"
_TRACEBACK_HEAD = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[(?:default|rank)(?P<rank>\d+)\]:")


def parse_child_failed(text: str) -> dict[str, Any] | None:
    """The "Root Cause (first observed failure)" block of torchrun's ChildFailedError report as a
    dict (rank, local_rank, host, time, exitcode, pid, signal, error_file, traceback), plus the
    failing worker's own traceback from the output before the report when the block has none.
    None when ``text`` holds no such report."""
    match = _ROOT_CAUSE.search(text)
    if match is None:
        return None
    fields: dict[str, str] = {}
    current = None
    for line in match.group("block").splitlines():
        field = _FIELD.match(line)
        if field and field.group("name") in ("time", "host", "rank", "exitcode", "error_file",
                                             "traceback"):
            current = field.group("name")
            fields[current] = field.group("value").rstrip()
        elif current == "traceback":
            fields[current] += "\n" + line[2:].rstrip()
    cause: dict[str, Any] = {"block": match.group("block").strip()}
    for name in ("time", "host"):
        if name in fields:
            cause[name] = fields[name].strip()
    rank = re.match(r"\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?", fields.get("rank", ""))
    if rank:
        cause["rank"] = int(rank.group(1))
        if rank.group(2) is not None:
            cause["local_rank"] = int(rank.group(2))
    exitcode = re.match(r"\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?", fields.get("exitcode", ""))
    if exitcode:
        cause["exitcode"] = int(exitcode.group(1))
        if exitcode.group(2) is not None:
            cause["pid"] = int(exitcode.group(2))
        if cause["exitcode"] < 0:
            name = _signal_name(-cause["exitcode"])
            if name:
                cause["signal"] = name
    error_file = fields.get("error_file", "").strip()
    if error_file and error_file != "<N/A>":
        cause["error_file"] = error_file
    traceback = fields.get("traceback", "").strip()
    if traceback:
        cause["traceback"] = traceback
    if _TRACEBACK_HEAD not in traceback:
        # Without torch.distributed.elastic's @record the block only says how to enable tracebacks;
        # the worker printed its own on the shared stderr before torchrun's report.
        worker = _worker_traceback(text[:match.start()], cause.get("rank"))
        if worker:
            cause["worker_traceback"] = worker
    return cause


def _worker_traceback(text: str, rank: int | None) -> str | None:
    lines = text.splitlines()
    # With --tee or --local-ranks-filter torchrun prefixes each line with its rank: use that rank's.
    prefixed = [(m, line) for line in lines if (m := _RANK_PREFIX.match(line))]
    if prefixed and rank is not None:
        lines = [line[m.end():].removeprefix(" ") for m, line in prefixed
                 if int(m.group("rank")) == rank]
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if line.startswith(_TRACEBACK_HEAD):
            current = [line]
            blocks.append(current)
        elif current is not None:
            current.append(line)
            if line and not line[0].isspace():
                current = None  # the exception line ("ValueError: ...") ends a traceback
    complete = blocks
    # The launcher's own traceback (ending in ChildFailedError) is not the worker's.
    complete = [block for block in complete if _CHILD_FAILED not in block[-1]]
    if not complete:
        return None
    # Chained exceptions of one worker print several blocks; the first failing worker is first.
    return "\n".join(complete[0])


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


# --- the report ---------------------------------------------------------------------------------


def failure_event(returncode: int, tail: str, command: Sequence[str],
                  received_signal: str | None = None, pid: int | None = None) -> dict[str, Any]:
    """The interruption event for a command that ended with ``returncode`` (as subprocess gives
    it: negative when a signal killed it)."""
    event: dict[str, Any] = {"kind": "interruption", "ts": time.time(), "source": "launcher",
                             "exit_code": returncode, "stderr_tail": tail,
                             "command": shlex.join(command)[:4000]}
    if pid is not None:
        event["pid"] = pid
    if returncode < 0:
        name = _signal_name(-returncode) or f"signal {-returncode}"
        event["signal"] = name
        event["reason"] = f"killed by {name}"
    else:
        event["reason"] = f"exit code {returncode}"
    if received_signal:
        # The launcher itself was told to stop (a scheduler's preemption, a Ctrl-C) and passed it on.
        event["received_signal"] = received_signal
    root_cause = parse_child_failed(tail)
    if root_cause is not None:
        event["root_cause"] = root_cause
        where = f"rank {root_cause['rank']}" if "rank" in root_cause else "a worker"
        how = (root_cause.get("signal") or f"exit code {root_cause['exitcode']}"
               if "exitcode" in root_cause else "failed")
        event["reason"] = f"ChildFailedError: {where} {how}"
    return event


def send_report(event: dict[str, Any], env: environment.Environment, run_name: str) -> bool:
    """Delivers the event in a batch of its own; retries what is worth retrying. Never raises."""
    try:
        batch = make_batch(
            run={"project": env.project, "name": run_name, "attempt": env.attempt, "config": {}},
            source={"host": env.host, "rank": env.rank, "local_rank": env.local_rank,
                    "world_size": env.world_size},
            events=[event],
        )
        validate_batch(batch)
        transport = transport_for(env.url or "", env.token)
    except (ProtocolError, ValueError) as error:
        _say(f"not reporting the failure to Runwatch: {error}")
        return False
    except Exception as error:
        _say(f"not reporting the failure to Runwatch: {type(error).__name__}: {error}")
        return False
    try:
        delay = 0.5
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                transport.send(batch, timeout_s=SEND_TIMEOUT_S)
                return True
            except TransientSendError as error:
                if attempt == SEND_ATTEMPTS:
                    _say(f"could not report the failure to Runwatch at {env.url}: {error}")
                    _spool(batch, env, run_name)
                    return False
                time.sleep(min(error.retry_after or delay, 10.0))
                delay *= 2
            except PermanentSendError as error:
                _say(f"Runwatch refused the failure report: {error}")
                return False
    except Exception as error:
        _say(f"could not report the failure to Runwatch: {type(error).__name__}: {error}")
    finally:
        try:
            transport.close()
        except Exception:
            pass
    return False


def _spool(batch: dict[str, Any], env: environment.Environment, run_name: str) -> None:
    """Keeps an undelivered report in this rank's spool directory, which the next Monitor of the
    same run and rank (a restart, a requeued job) sends before anything else."""
    try:
        spool = Spool(directory_for(default_root(), env.project or "", run_name, env.rank))
        if spool.write(batch):
            _say(f"the report waits in {spool.directory}; the next start of this run sends it")
    except Exception as error:
        _say(f"could not keep the report in the spool either: {type(error).__name__}: {error}")


# --- running the command ------------------------------------------------------------------------


def default_run_name(command: Sequence[str]) -> str:
    """The run name the command's own Monitor would choose: its script's name. For
    ``torchrun ... train.py`` and ``python train.py`` that is "train"; for ``python -m pkg.train``
    also "train"; otherwise the program's name."""
    args = iter(command)
    for arg in args:
        if arg == "-m":
            module = next(args, "")
            if module not in LAUNCHER_MODULES:
                return module.rsplit(".", 1)[-1] or "run"
        elif arg.endswith(".py") and not arg.startswith("-"):
            return Path(arg).stem or "run"
    return Path(command[0]).name or "run"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runwatch-run",
        description="Run a training command; when it fails, report its exit code or signal and "
                    "the end of its stderr to Runwatch as an interruption.",
        usage="runwatch-run [--project P] [--run R] [--url U] [--token T] [--tail-lines N] "
              "-- command [args...]",
    )
    parser.add_argument("--project", help="project slug (default: RUNWATCH_PROJECT)")
    parser.add_argument("--run", help="run name (default: RUNWATCH_RUN, else the script's name)")
    parser.add_argument("--url", help="collector URL (default: RUNWATCH_URL)")
    parser.add_argument("--token", help="ingest token (default: RUNWATCH_TOKEN)")
    parser.add_argument("--tail-lines", type=int, default=DEFAULT_TAIL_LINES,
                        help=f"stderr lines to keep and report (default {DEFAULT_TAIL_LINES})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("give the command to run after --, e.g. runwatch-run -- torchrun train.py")
    if args.tail_lines < 1:
        parser.error("--tail-lines must be at least 1")

    env = environment.detect(project=args.project, run=args.run, url=args.url, token=args.token)
    run_name = env.run or default_run_name(command)
    child_env = dict(os.environ)
    # The command's Monitor reads these: it reports to the same project and run as the launcher.
    for name, value in (("RUNWATCH_PROJECT", env.project), ("RUNWATCH_RUN", run_name),
                        ("RUNWATCH_URL", env.url), ("RUNWATCH_TOKEN", env.token)):
        if value:
            child_env[name] = value
    reporting = bool(env.url and env.project)
    if not reporting:
        _say("Runwatch is not configured (set RUNWATCH_URL and RUNWATCH_PROJECT, or pass --url and "
             "--project); running the command without reporting how it ends")

    child: subprocess.Popen | None = None
    received: list[str] = []
    pending: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        if child is None:
            pending.append(signum)
            return
        try:
            # The whole group: torchrun and its workers, as a terminal's Ctrl-C would reach them.
            os.killpg(child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    tail = StderrTail(args.tail_lines)
    try:
        try:
            child = subprocess.Popen(command, env=child_env, stderr=subprocess.PIPE,
                                     process_group=0)
        except OSError as error:
            code = EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_NOT_EXECUTABLE
            message = f"cannot run {command[0]!r}: {error.strerror or error}"
            _say(message)
            if reporting:
                tail.feed(message.encode())
                send_report(failure_event(code, tail.text(), command), env, run_name)
            return code
        for signum in pending:
            forward(signum, None)
        assert child.stderr is not None
        pump = threading.Thread(target=_pump, args=(os.dup(child.stderr.fileno()), tail),
                                name="runwatch-stderr", daemon=True)
        child.stderr.close()
        pump.start()
        returncode = child.wait()
        pump.join(DRAIN_TIMEOUT_S)
    finally:
        for signum, handler in previous.items():
            try:
                signal.signal(signum, handler)
            except (TypeError, ValueError):
                pass

    if returncode != 0 and reporting:
        event = failure_event(returncode, tail.text(), command,
                              received_signal=received[0] if received else None, pid=child.pid)
        if send_report(event, env, run_name):
            _say(f"reported to Runwatch: {event['reason']} "
                 f"(project {env.project}, run {run_name})")
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
