"""What logging 8 scalars per step costs a tiny CPU training loop: Runwatch against its peers.

    python bench/plugin_overhead.py [--steps N] [--rounds R] [--only NAME] [--json PATH]

Configurations, run in the same process and alternated round by round (the order rotates each
round, so no logger always runs right after the same neighbour):

    none         the training loop alone, the baseline every other figure is compared with
    runwatch     a real Monitor sending to a loopback collector stand-in (its own process, so
                 its CPU is not billed to the trainer); its sender thread really runs, batches,
                 gzips and competes for the GIL, as in production
    wandb        wandb.init(mode="offline") and run.log(...) once per step
    mlflow       a local file store (mlruns/ in a temporary folder), mlflow.log_metrics(...)
    tensorboard  torch.utils.tensorboard.SummaryWriter, add_scalar x8, default queue and flush

Per configuration and round it measures:
  (a) the logging code itself, per step: perf_counter_ns (p50, p99, mean) and the training
      thread's CPU (thread_time_ns) around exactly what a user writes to log (for the peers that
      includes ``loss.item()``, which they need to get a Python float; Runwatch takes
      ``loss.detach()`` and converts it on its sender thread), minus the same around nothing;
  (b) whole-step wall time, training-thread CPU time and process CPU time per step over the
      segment, minus the baseline's in the same round, and the CPU of helper processes (wandb's);
  (c) all of it again each round; figures are the median over rounds with [min..max].

On a shared 2-core machine, whole-step differences of a few microseconds are below the noise
(a logger that does nothing can measure -300 µs/step); that is what (a) is for. The headline
"Runwatch adds X µs/step on the training thread" is the training thread's CPU inside the call,
which preemption by other processes does not inflate; the mean wall time inside the call (slow
calls and GIL waits included) is printed beside it, and both verdicts are given on both.

Nothing here reaches outside hosts: wandb is offline, MLflow writes files, the Runwatch collector
listens on 127.0.0.1, and every peer's telemetry switch is off (see bench/README.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PEERS = ("wandb", "mlflow", "tensorboard")
LOGGERS = ("runwatch", *PEERS)
METRIC_NAMES = ("loss", "lr", "grad_norm", "accuracy", "tokens_per_s", "data_wait_s",
                "momentum", "epoch")

# --- the loopback collector stand-in --------------------------------------------------------------


class _CollectorHandler(BaseHTTPRequestHandler):
    """Reads the batch, counts its rows, answers 202 like the ingest API."""

    batches = 0
    rows = 0
    body_bytes = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            batch = json.loads(gzip.decompress(body))
            rows = len(batch.get("steps", {}).get("step", [])) if batch.get("steps") else 0
        except (OSError, ValueError):
            self.send_response(400)
            self.end_headers()
            return
        cls = type(self)
        cls.batches += 1
        cls.rows += rows
        cls.body_bytes += len(body)
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:  # noqa: N802
        cls = type(self)
        answer = json.dumps({"batches": cls.batches, "rows": cls.rows,
                             "bytes": cls.body_bytes}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def serve_collector() -> None:
    """Runs in a child process: prints its port, serves until stdin closes."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CollectorHandler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # the parent closing our stdin is the signal to stop
    server.shutdown()


class CollectorProcess:
    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--serve-collector"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def counts(self) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/stats", timeout=5) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


# --- helper-process CPU (wandb does its work in a separate wandb-core process) --------------------


def helper_cpu_s(exclude: frozenset[int] = frozenset()) -> float:
    """CPU seconds used so far by this process's live descendants but ``exclude`` (the collector
    stand-in, which plays a remote server), from /proc; 0.0 where there is no /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces; the fields after its closing parenthesis do not.
        fields = stat[stat.rindex(")") + 2:].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    me = os.getpid()
    total = 0.0
    for pid in cpu:
        ancestor = parents.get(pid)
        while ancestor and ancestor != me:
            ancestor = parents.get(ancestor)
        if ancestor == me and pid not in exclude:
            total += cpu[pid]
    return total


# --- the loggers ---------------------------------------------------------------------------------
# Each logger is a setup() returning (log, close). ``log(step, loss, floats)`` is the code a user
# writes in the loop, and everything in it is timed; ``close()`` is not part of the per-step cost.

LogFn = Callable[[int, Any, tuple], None]


@dataclass
class Workdir:
    root: Path
    collector: CollectorProcess | None = None
    segment: int = 0

    def fresh(self, name: str) -> Path:
        self.segment += 1
        path = self.root / f"{name}-{self.segment}"
        path.mkdir(parents=True)
        return path


def setup_none(work: Workdir) -> tuple[LogFn | None, Callable[[], dict]]:
    return None, dict


def setup_runwatch(work: Workdir) -> tuple[LogFn, Callable[[], dict]]:
    from trainer_plugin import Monitor

    if work.collector is None:
        work.collector = CollectorProcess()
    before = work.collector.counts()["rows"]
    monitor = Monitor("bench", f"plugin-overhead-{work.segment}", url=work.collector.url,
                      token="bench-token")
    assert monitor.enabled, "the Monitor did not start; see the runwatch warning above"

    def log(step: int, loss: Any, f: tuple) -> None:
        monitor.step(step, loss=loss.detach(), lr=f[0], grad_norm=f[1], accuracy=f[2],
                     tokens_per_s=f[3], data_wait_s=f[4], momentum=f[5], epoch=f[6])

    def close() -> dict:
        delivered = monitor.close(timeout_s=30)
        stats = monitor.stats
        rows = work.collector.counts()["rows"] - before
        return {"delivered": delivered, "rows_at_collector": rows, **stats}

    return log, close


def setup_wandb(work: Workdir) -> tuple[LogFn, Callable[[], dict]]:
    import wandb

    run = wandb.init(project="bench", name=f"plugin-overhead-{work.segment}", mode="offline",
                     dir=str(work.fresh("wandb")), reinit="create_new")
    names = METRIC_NAMES

    def log(step: int, loss: Any, f: tuple) -> None:
        run.log({names[0]: loss.item(), names[1]: f[0], names[2]: f[1], names[3]: f[2],
                 names[4]: f[3], names[5]: f[4], names[6]: f[5], names[7]: f[6]}, step=step)

    def close() -> dict:
        run.finish()
        return {}

    return log, close


def setup_mlflow(work: Workdir) -> tuple[LogFn, Callable[[], dict]]:
    import mlflow

    mlflow.set_tracking_uri((work.fresh("mlruns")).as_uri())
    mlflow.set_experiment("bench")
    mlflow.start_run(run_name=f"plugin-overhead-{work.segment}")
    names = METRIC_NAMES
    log_metrics = mlflow.log_metrics

    def log(step: int, loss: Any, f: tuple) -> None:
        log_metrics({names[0]: loss.item(), names[1]: f[0], names[2]: f[1], names[3]: f[2],
                     names[4]: f[3], names[5]: f[4], names[6]: f[5], names[7]: f[6]}, step=step)

    def close() -> dict:
        mlflow.end_run()
        return {}

    return log, close


def setup_tensorboard(work: Workdir) -> tuple[LogFn, Callable[[], dict]]:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(work.fresh("tensorboard")))
    add = writer.add_scalar
    n = METRIC_NAMES

    def log(step: int, loss: Any, f: tuple) -> None:
        add(n[0], loss.item(), step)
        add(n[1], f[0], step)
        add(n[2], f[1], step)
        add(n[3], f[2], step)
        add(n[4], f[3], step)
        add(n[5], f[4], step)
        add(n[6], f[5], step)
        add(n[7], f[6], step)

    def close() -> dict:
        writer.close()
        return {}

    return log, close


SETUPS = {"none": setup_none, "runwatch": setup_runwatch, "wandb": setup_wandb,
          "mlflow": setup_mlflow, "tensorboard": setup_tensorboard}

# --- the training loop ---------------------------------------------------------------------------


@dataclass
class Segment:
    """One configuration's run of steps within one round."""

    name: str
    round: int
    steps: int
    wall_us: float  # per step
    thread_cpu_us: float  # training thread's CPU per step
    process_cpu_us: float  # whole process's CPU per step (the sender thread and the like)
    helper_cpu_us: float  # descendant processes' CPU per step (wandb-core)
    call_mean_us: float
    call_cpu_mean_us: float  # training thread's CPU inside the call, mean per step
    call_p50_us: float
    call_p99_us: float
    call_max_us: float
    setup_s: float
    close_s: float
    close_info: dict = field(default_factory=dict)


def percentile(sorted_values: list[int], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[index])


def make_model() -> tuple[Any, Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    # About 1 ms of CPU per step on one thread of a quiet EPYC core: the short steps where a
    # logger's per-step cost shows the most.
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs = torch.randn(32, 64)
    targets = torch.randint(0, 10, (32,))
    return model, optimizer, inputs, targets


def run_segment(name: str, round_index: int, steps: int, warmup: int, work: Workdir,
                model_parts: tuple) -> Segment:
    import torch

    model, optimizer, inputs, targets = model_parts
    loss_fn = torch.nn.functional.cross_entropy
    started = time.perf_counter()
    log, close = SETUPS[name](work)
    setup_s = time.perf_counter() - started
    calls = [0] * steps
    call_cpu = [0] * steps
    perf_ns = time.perf_counter_ns
    cpu_ns = time.thread_time_ns
    empty = log is None

    def one_step(step: int) -> tuple[int, int]:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        # The 7 Python-float metrics a loop would have at hand (lr, counters, timings).
        floats = (0.01, 1.0 + step * 1e-6, 0.5, 65536.0 + step, 0.001, 0.9, step / 1000.0)
        # Wall time inside the call, and the training thread's CPU inside it: on a loaded machine
        # the first is inflated by preemption (time other processes ran), the second is not.
        c0 = cpu_ns()
        t0 = perf_ns()
        if not empty:
            log(step, loss, floats)
        t1 = perf_ns()
        return t1 - t0, cpu_ns() - c0

    for step in range(warmup):
        one_step(step)
    not_ours = frozenset([work.collector.process.pid] if work.collector else [])
    helper0 = helper_cpu_s(not_ours)
    thread0 = time.thread_time_ns()
    process0 = time.process_time_ns()
    wall0 = perf_ns()
    for index in range(steps):
        calls[index], call_cpu[index] = one_step(warmup + index)
    wall = perf_ns() - wall0
    process_cpu = time.process_time_ns() - process0
    thread_cpu = time.thread_time_ns() - thread0
    helper = helper_cpu_s(not_ours) - helper0
    started = time.perf_counter()
    close_info = close()
    close_s = time.perf_counter() - started
    ordered = sorted(calls)
    return Segment(
        name=name, round=round_index, steps=steps,
        wall_us=wall / steps / 1e3, thread_cpu_us=thread_cpu / steps / 1e3,
        process_cpu_us=process_cpu / steps / 1e3, helper_cpu_us=helper / steps * 1e6,
        call_mean_us=sum(calls) / steps / 1e3, call_cpu_mean_us=sum(call_cpu) / steps / 1e3,
        call_p50_us=percentile(ordered, 0.50) / 1e3,
        call_p99_us=percentile(ordered, 0.99) / 1e3, call_max_us=ordered[-1] / 1e3,
        setup_s=setup_s, close_s=close_s, close_info=close_info,
    )


# --- reporting -----------------------------------------------------------------------------------


@dataclass
class Summary:
    """One logger's figures, one value per round, each against the baseline of the same round."""

    name: str
    extra_wall: list[float]  # whole-step wall time minus the baseline's
    adds: list[float]  # training-thread CPU inside the log call, minus the baseline's empty region
    call_wall: list[float]  # mean wall time inside the log call, minus the baseline's
    call_p50: list[float]
    call_p99: list[float]
    extra_thread_cpu: list[float]  # training thread's CPU minus the baseline's
    extra_other_cpu: list[float]  # the process's other threads (Runwatch's sender, wandb's ...)
    helper_cpu: list[float]  # helper processes (wandb-core)


def summarise(segments: list[Segment], names: list[str]) -> dict[str, Summary]:
    base = {s.round: s for s in segments if s.name == "none"}

    def other(s: Segment) -> float:
        return s.process_cpu_us - s.thread_cpu_us

    out: dict[str, Summary] = {}
    for name in names:
        mine = [s for s in segments if s.name == name]
        out[name] = Summary(
            name=name,
            extra_wall=[s.wall_us - base[s.round].wall_us for s in mine],
            adds=[s.call_cpu_mean_us - base[s.round].call_cpu_mean_us for s in mine],
            call_wall=[s.call_mean_us - base[s.round].call_mean_us for s in mine],
            call_p50=[s.call_p50_us for s in mine],
            call_p99=[s.call_p99_us for s in mine],
            extra_thread_cpu=[s.thread_cpu_us - base[s.round].thread_cpu_us for s in mine],
            extra_other_cpu=[other(s) - other(base[s.round]) for s in mine],
            helper_cpu=[s.helper_cpu_us - base[s.round].helper_cpu_us for s in mine],
        )
    return out


def spread(values: list[float], digits: int = 0) -> str:
    def fmt(v: float) -> str:
        return f"{v:,.{digits}f}"

    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}..{fmt(max(values))}]"


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine_line() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}"


def warm_runwatch_call(work: Workdir, calls: int = 20_000) -> tuple[float, float]:
    """p50 and p99 µs of the same Runwatch call in a tight loop with nothing between calls: what
    it costs with warm caches, for comparison with its cost inside the training loop."""
    import torch

    log, close = setup_runwatch(work)
    loss = torch.tensor(0.5, requires_grad=True) * 2
    floats = (0.01, 1.0, 0.5, 65536.0, 0.001, 0.9, 0.0)
    perf_ns = time.perf_counter_ns
    times = [0] * calls
    for index in range(calls):
        t0 = perf_ns()
        log(index, loss, floats)
        times[index] = perf_ns() - t0
    close()
    times.sort()
    return percentile(times, 0.5) / 1e3, percentile(times, 0.99) / 1e3


def print_report(summaries: dict[str, Summary], segments: list[Segment], args: argparse.Namespace,
                 versions: dict[str, str], warm: tuple[float, float] | None) -> dict[str, Any]:
    base = [s for s in segments if s.name == "none"]
    print()
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')} | {machine_line()} | " +
          ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"{args.rounds} rounds x {args.steps} steps per logger, 8 scalars per step; "
          f"baseline step {spread([s.wall_us for s in base])} µs wall, "
          f"{spread([s.thread_cpu_us for s in base])} µs CPU; "
          f"empty timed region: CPU {spread([s.call_cpu_mean_us for s in base], 2)} µs, "
          f"wall mean {spread([s.call_mean_us for s in base], 2)} µs, "
          f"p50 {spread([s.call_p50_us for s in base], 2)} µs")
    print("median over rounds [min..max]; 'extra' = this logger's round minus the no-logger "
          "round it ran with")
    print()
    runwatch = summaries.get("runwatch")
    rw_cost = median(runwatch.adds) if runwatch else None
    rw_wall = median(runwatch.call_wall) if runwatch else None
    print("| logger | extra µs/step, whole step, wall | in the log call: CPU µs/step "
          "| wall µs/step, mean | p50 µs | p99 µs | extra CPU µs/step: training thread "
          "| other threads | helper processes | ratio to Runwatch: CPU / wall in the call |")
    print("|" + "---|" * 10)

    def ratio(value: float, reference: float | None) -> str:
        return f"{value / reference:,.0f}x" if reference and reference > 0 else "–"

    for name, summary in summaries.items():
        ratios = "1" if name == "runwatch" else (
            f"{ratio(median(summary.adds), rw_cost)} / {ratio(median(summary.call_wall), rw_wall)}")
        print(f"| {name} | {spread(summary.extra_wall)} | {spread(summary.adds, 1)} "
              f"| {spread(summary.call_wall, 1)} | {spread(summary.call_p50, 1)} "
              f"| {spread(summary.call_p99, 0)} | {spread(summary.extra_thread_cpu)} "
              f"| {spread(summary.extra_other_cpu)} | {spread(summary.helper_cpu)} | {ratios} |")
    print()
    print("In the log call = around exactly the logging code, minus the baseline's empty timed "
          "region: the training thread's CPU (not inflated by preemption on a loaded machine) and "
          "wall time (slow calls, preemption and GIL waits included).")
    print("Peers' log calls include loss.item() (they need a Python float); Runwatch is given "
          "loss.detach() and converts it on its sender thread ('other threads').")
    verdict: dict[str, Any] = {}
    if runwatch is not None:
        x = rw_cost
        print()
        print(f"Runwatch adds {x:.2f} µs/step on the training thread (target < 5): "
              f"{'met' if x < 5 else 'NOT met'}  [training-thread CPU inside the call; wall "
              f"time inside it: mean {rw_wall:.1f} µs ({'met' if rw_wall < 5 else 'NOT met'}), "
              f"p50 {median(runwatch.call_p50):.1f} µs, p99 {median(runwatch.call_p99):.0f} µs]")
        print(f"its sender thread: {median(runwatch.extra_other_cpu):,.0f} µs of CPU per step, "
              "off the training thread but holding the GIL for most of it")
        if warm is not None:
            print(f"the same call in a tight loop (warm caches, nothing between calls): p50 "
                  f"{warm[0]:.2f} µs, p99 {warm[1]:.1f} µs")
        closes = [s.close_info for s in segments if s.name == "runwatch"]
        lost = [c for c in closes if c.get("rows_at_collector") != args.steps + args.warmup]
        print(f"Runwatch delivered {'every step' if not lost else 'NOT every step'} to the "
              f"collector in each round ({args.steps + args.warmup} rows per round)")
        verdict = {"runwatch_us": x, "runwatch_wall_in_call_us": rw_wall,
                   "runwatch_target_met": x < 5, "all_delivered": not lost}
        peers = {n: median(s.adds) for n, s in summaries.items() if n in PEERS}
        if peers and x > 0:
            cheapest = min(peers, key=peers.__getitem__)
            y = peers[cheapest]
            y_wall = median(summaries[cheapest].call_wall)
            print(f"cheapest peer: {cheapest} {y:,.0f} µs → Runwatch is {y / x:,.0f} times "
                  f"cheaper (target > 10x): {'met' if y / x > 10 else 'NOT met'}  [same "
                  f"measure; by wall time in the call {y_wall:,.0f} / {rw_wall:,.1f} µs = "
                  f"{y_wall / rw_wall:,.0f}x ({'met' if y_wall / rw_wall > 10 else 'NOT met'})]")
            verdict.update(cheapest_peer=cheapest, cheapest_peer_us=y, times_cheaper=y / x,
                           ratio_target_met=y / x > 10, times_cheaper_by_wall=y_wall / rw_wall)
    return verdict


# --- main ----------------------------------------------------------------------------------------


def offline_environment(root: Path) -> None:
    """Every peer offline, writing only under ``root``, with telemetry off; before any import."""
    os.environ.update({
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(root / "wandb-dir"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
        "WANDB_ERROR_REPORTING": "false",
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "MLFLOW_TRACKING_URI": (root / "mlruns").as_uri(),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        # Runwatch's disk spool (for batches it cannot deliver) goes with the rest, not to ~/.cache.
        "RUNWATCH_SPOOL_DIR": str(root / "runwatch-spool"),
    })
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        Path(os.environ[name]).mkdir(parents=True, exist_ok=True)
    # Runwatch must use only the collector we start, never one from the caller's environment.
    for name in ("RUNWATCH_URL", "RUNWATCH_PROJECT", "RUNWATCH_RUN", "RUNWATCH_TOKEN",
                 "RUNWATCH_ATTEMPT", "RUNWATCH_MODE", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(name, None)


def versions_of(names: list[str]) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ["torch", *[n for n in names if n in PEERS]]:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500,
                        help="measured steps per logger per round (default 1500)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="unmeasured steps before each measurement (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--only", choices=LOGGERS, action="append",
                        help="run only this logger against the baseline (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--serve-collector", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_collector:
        serve_collector()
        return 0

    names = list(args.only or LOGGERS)
    root = Path(tempfile.mkdtemp(prefix="runwatch-bench-"))
    offline_environment(root)
    missing = [n for n in names if n in PEERS and not _importable(n)]
    if missing:
        print(f"{', '.join(missing)} not installed in this Python ({sys.executable}); run "
              "`make bench-plugin`, which installs them into .venv-bench", file=sys.stderr)
        return 2

    import torch

    torch.set_num_threads(1)
    work = Workdir(root)
    configs = ["none", *names]
    segments: list[Segment] = []
    try:
        model_parts = make_model()
        for name in configs:  # imports, first-run caches and the like, not measured
            run_segment(name, -1, 50, 50, work, model_parts)
        for round_index in range(args.rounds):
            shift = round_index % len(configs)
            for name in configs[shift:] + configs[:shift]:
                segment = run_segment(name, round_index, args.steps, args.warmup, work,
                                      model_parts)
                segments.append(segment)
                print(f"round {round_index + 1}/{args.rounds} {name:<11} "
                      f"{segment.wall_us:8,.0f} µs/step wall  "
                      f"log call CPU {segment.call_cpu_mean_us:8.2f} µs, "
                      f"wall mean {segment.call_mean_us:8.2f} µs  "
                      f"p99 {segment.call_p99_us:8.1f} µs  "
                      f"(setup {segment.setup_s:.1f} s, close {segment.close_s:.1f} s)",
                      flush=True)
        summaries = summarise(segments, names)
        versions = versions_of(names)
        warm = warm_runwatch_call(work) if "runwatch" in names else None
        verdict = print_report(summaries, segments, args, versions, warm)
        if args.json:
            args.json.write_text(json.dumps({
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_line(),
                "argv": sys.argv, "steps": args.steps, "warmup": args.warmup,
                "rounds": args.rounds, "versions": versions, "verdict": verdict,
                "runwatch_warm_call_us": {"p50": warm[0], "p99": warm[1]} if warm else None,
                "summary": {n: vars(s) for n, s in summaries.items()},
                "segments": [vars(s) for s in segments],
            }, indent=2))
    finally:
        if work.collector is not None:
            work.collector.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    return find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
