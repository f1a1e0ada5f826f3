"""End-to-end ingest: plugin batches → Redis → Celery workers → PostgreSQL, beside a raw psycopg
binary COPY of the same rows and an MLflow tracking server fed the same metrics, in one run.

    make bench-ingest                                  # 5 minutes of ingest, then the peers
    make bench-ingest BENCH_ARGS="--quick"             # 30 s, for development (≤ 2 min in all)
    .venv/bin/python bench/ingest_e2e.py --duration 60 --no-mlflow --json /tmp/e2e.json

What it does, in order (details and the latest table: bench/README.md):
1. drops and creates a dedicated database on the shared PostgreSQL (default runwatch_bench_ingest),
   migrates it and creates a project with an ingest token; starts a private redis-server on a free
   port (append-only, as in docker-compose.yml) and N Celery workers started as in production
   (``celery -A dashboard worker -Q ingest,runwatch``); starts the MLflow server (idle until 5);
2. producer processes send pre-shaped wire-format v1 batches through the plugin's own broker
   transport (trainer_plugin.transports.broker.BrokerTransport), as fast as the system takes them
   while the ingest queue holds fewer than --max-depth batches (back-pressure), for --duration s;
3. meanwhile it reads, every half second, the batches that became visible in the database (a
   batch's row in collectors_ingestedbatch commits with its samples), the queue depth, the
   workers' memory and CPU, and the database's size;
4. waits for the queue to drain and checks that every sample sent is in the database;
5. peers, one after the other on the then idle machine: a psycopg binary COPY of the same GPU rows
   (copy.write_row, one connection, 10,000 rows per COPY) into a scratch table with the same
   columns and indexes, and an MLflow server (own database, same PostgreSQL) fed through
   MlflowClient.log_batch;
6. prints the table (and --json), stops everything it started and drops its databases.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU_SAMPLES_TARGET = 50_000
COPY_RATIO_TARGET = 0.5
COPY_ROWS_PER_STATEMENT = 10_000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class BenchError(RuntimeError):
    """A component failed; the message says which and where its log is."""


# --- the batches ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What one batch holds: the batch of a host's local rank 0, which carries the host's GPU
    samples at 1 Hz for one flush interval beside that rank's own steps."""

    hosts: int
    gpus_per_host: int
    seconds_per_batch: int
    step_s: float

    @property
    def gpu_rows(self) -> int:
        return self.gpus_per_host * self.seconds_per_batch

    @property
    def step_rows(self) -> int:
        return max(1, int(self.seconds_per_batch / self.step_s))

    def describe(self) -> str:
        return (f"{self.hosts:,} hosts × {self.gpus_per_host} GPUs × {self.seconds_per_batch} s at 1 Hz "
                f"= {self.gpu_rows} GPU samples + {self.step_rows} step rows (5 metrics) per batch")


class BatchFactory:
    """Wire-format v1 batches whose value columns are built once (several variants) so that
    making a batch costs a list of timestamps and a uuid, not the producer's time.

    The values look like what the plugin sends from real hardware, digits included, because the
    digits are what JSON parsing and compression pay for: one read time per second shared by a
    host's GPUs (``time.time()`` with a few ms of jitter), whole degrees, NVML's milliwatts as
    watts with three decimals, whole percents, MiB used as NVML's bytes / 2**20, SM clocks in
    15 MHz steps; steps with full-precision durations, losses and gradient norms."""

    VARIANTS = 16

    def __init__(self, shape: Shape, project: str, run: str, t0: float):
        import numpy as np

        self.shape, self.project, self.run, self.t0 = shape, project, run, t0
        seconds, gpus = shape.seconds_per_batch, shape.gpus_per_host
        rng = np.random.default_rng(20261203)
        self.gpu_index = [g for _ in range(seconds) for g in range(gpus)]
        self.gpu_offsets, self.step_offsets = [], []
        self.gpu_variants, self.step_variants = [], []
        for _ in range(self.VARIANTS):
            read_at = np.arange(seconds) + rng.uniform(0.0, 0.005, seconds)
            self.gpu_offsets.append(np.repeat(read_at, gpus).tolist())
            n = shape.gpu_rows
            self.gpu_variants.append({
                "temp_c": rng.integers(55, 83, n).astype(float).tolist(),
                "power_w": (rng.integers(380_000, 700_001, n) / 1000.0).tolist(),
                "util_pct": rng.choice([100.0, 100.0, 99.0, 98.0, 97.0, 0.0], n).tolist(),
                "mem_used_mb": (rng.integers(30_000, 38_000, n) * 2 * 2**20 / 2**20).tolist(),
                "sm_clock_mhz": (1980.0 - 15.0 * rng.integers(0, 8, n)).tolist(),
                "throttle": rng.choice([0, 0, 0, 0, 0, 0, 0, 4], n).tolist(),
            })
            m = shape.step_rows
            self.step_offsets.append((np.arange(m) * shape.step_s
                                      + rng.uniform(0.0, 0.02, m)).tolist())
            self.step_variants.append({
                "duration_s": (shape.step_s * rng.uniform(0.97, 1.08, m)).tolist(),
                "tokens": [4_194_304] * m,
                "metrics": {"loss": rng.uniform(1.8, 2.2, m).tolist(),
                            "lr": (3e-4 * rng.uniform(0.9, 1.0, m)).tolist(),
                            "grad_norm": rng.uniform(0.8, 1.6, m).tolist()},
            })

    def batch(self, sequence: int) -> dict[str, Any]:
        """Batch number ``sequence``: host ``sequence % hosts``, the next window of that host."""
        shape = self.shape
        host = sequence % shape.hosts
        window = sequence // shape.hosts
        start = self.t0 + window * shape.seconds_per_batch
        variant = sequence % self.VARIANTS
        gpus = {"ts": [start + o for o in self.gpu_offsets[variant]], "gpu": self.gpu_index,
                **self.gpu_variants[variant], "simulated": False}
        first_step = window * shape.step_rows
        steps = {"step": list(range(first_step, first_step + shape.step_rows)),
                 "ts": [start + o for o in self.step_offsets[variant]],
                 **self.step_variants[variant]}
        return {
            "v": 1, "batch_id": str(uuid.uuid4()),
            "run": {"project": self.project, "name": self.run, "attempt": 0,
                    "config": {"model": "llama-405b", "bench": True}},
            "source": {"host": f"node{host:05d}", "rank": host * shape.gpus_per_host,
                       "local_rank": 0, "world_size": shape.hosts * shape.gpus_per_host},
            "steps": steps, "gpus": gpus, "events": [],
        }


def produce(args: argparse.Namespace) -> int:
    """Producer process: sends batches through the plugin's broker transport until the deadline,
    holding back while the queue is at --max-depth. Writes 'batch_id enqueue_time' per batch to
    --probe-file and a JSON summary to stdout."""
    import redis

    from trainer_plugin.transports.broker import QUEUE, ZSTD_QUEUE, BrokerTransport

    shape = Shape(args.hosts, args.gpus_per_host, args.seconds_per_batch, args.step_s)
    factory = BatchFactory(shape, args.project, args.run, args.t0)
    transport = BrokerTransport(args.broker_url, args.token)
    depth = redis.Redis.from_url(args.broker_url)
    sent, held_s = 0, 0.0
    # Every producer owns the sequence numbers ≡ its index (mod producers): disjoint hosts.
    sequence = args.producer_index
    deadline = time.monotonic() + args.duration
    began = time.monotonic()
    with open(args.probe_file, "w") as probes:
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            # The queue cannot pass --max-depth while this producer sends no more than the room
            # it saw, so the depth is read once per that many batches, not once per batch (the
            # round trip was a fifth of the producer's time, which the workers share the CPU with).
            room = args.max_depth - depth.llen(QUEUE) - depth.llen(ZSTD_QUEUE)
            if room <= 0:
                time.sleep(0.005)
                held_s += time.monotonic() - now
                continue
            for _ in range(room if args.producers == 1 else 1):
                batch = factory.batch(sequence)
                transport.send(batch)
                probes.write(f"{batch['batch_id']} {time.time():.6f}\n")
                sequence += args.producers
                sent += 1
    transport.close()
    elapsed = time.monotonic() - began
    print(json.dumps({"batches": sent, "gpu_samples": sent * shape.gpu_rows,
                      "steps": sent * shape.step_rows, "elapsed_s": elapsed, "held_s": held_s}))
    return 0


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (no psutil needed)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return found


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE_BYTES
        except OSError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


@dataclass
class Started:
    name: str
    process: subprocess.Popen
    log_path: Path
    group: bool = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            if self.group:
                os.killpg(self.process.pid, signal.SIGTERM)
            else:
                self.process.terminate()
            self.process.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                if self.group:
                    os.killpg(self.process.pid, signal.SIGKILL)
                else:
                    self.process.kill()
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)


# --- measurements -------------------------------------------------------------------------------


@dataclass
class Observations:
    """What the monitor saw, with time.monotonic() stamps."""

    counts: list[tuple[float, int, int]] = field(default_factory=list)  # t, gpu samples, steps
    depth: list[tuple[float, int, int]] = field(default_factory=list)   # t, queued, unacked
    rss: list[tuple[float, list[int]]] = field(default_factory=list)    # t, per worker bytes
    sizes: list[dict[str, float]] = field(default_factory=list)
    visible_at: dict[str, float] = field(default_factory=dict)          # batch id → time.time()
    cpu: dict[str, dict[int, float]] = field(default_factory=lambda: {"workers": {}, "postgres": {},
                                                                       "producers": {}, "redis": {}})
    rejected: int = 0
    error: str | None = None


SIZE_SQL = """
SELECT pg_total_relation_size(%(t)s::regclass)
     + coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%(t)s::regclass)
                 WHERE relid <> %(t)s::regclass), 0)
"""


# How far back each poll looks for batches that committed after newer ones (see _poll_batches).
POLL_LOOKBACK = timedelta(seconds=10)


class Monitor(threading.Thread):
    def __init__(self, bench: Bench, poll_s: float, size_every_s: float):
        super().__init__(name="bench-monitor", daemon=True)
        self.bench, self.poll_s, self.size_every_s = bench, poll_s, size_every_s
        self.seen = Observations()
        self.stop_event = threading.Event()
        self._newest = datetime(2000, 1, 1, tzinfo=UTC)
        self._gpu = self._steps = 0

    def run(self) -> None:
        import psycopg
        import redis

        from trainer_plugin.transports.broker import QUEUE, ZSTD_QUEUE

        try:
            with psycopg.connect(self.bench.database_url, autocommit=True) as db:
                broker = redis.Redis.from_url(self.bench.broker_url)
                next_slow = next_size = 0.0
                while not self.stop_event.is_set():
                    now = time.monotonic()
                    self._poll_batches(db)
                    queued = broker.llen(QUEUE) + broker.llen(ZSTD_QUEUE)
                    self.seen.depth.append((now, queued, broker.hlen("unacked")))
                    if now >= next_slow:
                        self._poll_processes(db)
                        next_slow = now + 2.0
                    if now >= next_size:
                        self.size_now(db)
                        next_size = now + self.size_every_s
                    self.stop_event.wait(self.poll_s)
                self._poll_batches(db, lookback=None)
                self._poll_processes(db)
        except Exception as error:  # reported by the main thread, which stops the run
            self.seen.error = f"the monitor failed: {error!r}"

    def _poll_batches(self, db, lookback: timedelta | None = POLL_LOOKBACK) -> None:
        # Batches commit out of order (several workers) and received_at is stamped before the
        # commit, so each poll looks back a little; the set keeps each batch counted once. Not
        # further: the monitor shares the cores it measures, and a two-minute look-back fetched
        # ~24k rows twice a second (6% of a core in the bench process alone). A batch that took
        # longer than the look-back to commit is still found by the last poll, which looks back
        # to the start, and counts as visible only then.
        since = datetime(2000, 1, 1, tzinfo=UTC) if lookback is None else self._newest - lookback
        rows = db.execute(
            "SELECT batch_id, gpu_samples, steps, received_at FROM collectors_ingestedbatch "
            "WHERE received_at > %s", (since,)).fetchall()
        wall, mono = time.time(), time.monotonic()
        for batch_id, gpu_samples, steps, received_at in rows:
            key = str(batch_id)
            if key in self.seen.visible_at:
                continue
            self.seen.visible_at[key] = wall
            self._newest = max(self._newest, received_at)
            self._gpu += gpu_samples
            self._steps += steps
        self.seen.counts.append((mono, self._gpu, self._steps))

    def _poll_processes(self, db) -> None:
        bench = self.bench
        per_worker = []
        for worker in bench.workers:
            pids = process_tree(worker.process.pid)
            per_worker.append(rss_bytes(pids))
            for pid in pids:
                self._note_cpu("workers", pid)
        self.seen.rss.append((time.monotonic(), per_worker))
        for producer in bench.producers:
            self._note_cpu("producers", producer.process.pid)
        if bench.redis is not None:
            self._note_cpu("redis", bench.redis.process.pid)
        backends = db.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> "
                              "pg_backend_pid()", (bench.db_name,)).fetchall()
        for (pid,) in backends:
            self._note_cpu("postgres", pid)
        self.seen.rejected = db.execute("SELECT count(*) FROM collectors_rejectedbatch").fetchone()[0]

    def _note_cpu(self, group: str, pid: int) -> None:
        # A process that has exited reads as 0: keep the last figure it had.
        seen = self.seen.cpu[group]
        seen[pid] = max(seen.get(pid, 0.0), cpu_seconds(pid))

    def size_now(self, db) -> None:
        gpu_bytes = db.execute(SIZE_SQL, {"t": "collectors_gpusample"}).fetchone()[0]
        step_bytes = db.execute(SIZE_SQL, {"t": "collectors_stepmetric"}).fetchone()[0]
        database = db.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        self.seen.sizes.append({"t": time.monotonic(), "gpu_samples": self._gpu,
                                "steps": self._steps, "gpu_table_bytes": int(gpu_bytes),
                                "step_table_bytes": int(step_bytes), "database_bytes": int(database)})


# --- the benchmark ------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.shape = Shape(args.hosts, args.gpus_per_host, args.seconds_per_batch, args.step_s)
        self.tmp = Path(tempfile.mkdtemp(prefix="runwatch-bench-ingest-"))
        self.db_name = args.db_name
        self.mlflow_db = f"{args.db_name}_mlflow"
        base = args.pg_url.rstrip("/")
        self.admin_url = f"{base}/postgres"
        self.database_url = f"{base}/{self.db_name}"
        self.broker_url = ""
        self.redis: Started | None = None
        self.workers: list[Started] = []
        self.producers: list[Started] = []
        self.mlflow: Started | None = None
        self.mlflow_url = ""
        self.created_dbs: list[str] = []
        self.results: dict[str, Any] = {}

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    # setup -----------------------------------------------------------------------------------

    def recreate_database(self, name: str) -> None:
        import psycopg

        try:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as error:
            raise BenchError(f"cannot create database {name} at {self.admin_url}: {error}") from None
        self.created_dbs.append(name)

    def apply_db_settings(self) -> None:
        """--db-setting NAME=VALUE: ALTER DATABASE on the bench database only (new sessions)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            for assignment in self.args.db_setting:
                name, _, value = assignment.partition("=")
                try:
                    admin.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        sql.Identifier(self.db_name), sql.Identifier(name), sql.Literal(value)))
                except psycopg.Error as error:
                    raise BenchError(f"cannot set {assignment} on {self.db_name}: {error}") from None

    def worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "RUNWATCH_"))}
        env.update(DATABASE_URL=self.database_url, CELERY_BROKER_URL=self.broker_url,
                   PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="dashboard.settings")
        if self.args.prefetch is not None:
            env["CELERY_WORKER_PREFETCH_MULTIPLIER"] = str(self.args.prefetch)
        if self.args.conn_max_age is not None:
            env["CONN_MAX_AGE"] = str(self.args.conn_max_age)
        for assignment in self.args.worker_env:
            name, _, value = assignment.partition("=")
            env[name] = value
        return env

    def manage(self, *command: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT,
                              env=self.worker_env(), capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise BenchError(f"manage.py {' '.join(command)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start_redis(self) -> None:
        port = free_port()
        log_path = self.tmp / "redis.log"
        # Append-only, as docker-compose.yml runs it: queued batches survive a Redis restart.
        process = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--dir", str(self.tmp)],
            stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
        self.redis = Started("redis-server", process, log_path)
        self.broker_url = f"redis://127.0.0.1:{port}/0"
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)

        def ready() -> bool:
            if not self.redis.alive():
                raise BenchError(f"redis-server exited at start:\n{self.redis.tail()}")
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(ready, 20, "redis-server")

    def start_workers(self) -> None:
        args = self.args
        for i in range(args.workers):
            log_path = self.tmp / f"worker-{i}.log"
            # As in docker-compose.yml: one worker per box consuming both queues.
            worker_args = ["-Q", "ingest,runwatch", "--concurrency", str(args.concurrency),
                           "--pool", args.pool, "--loglevel", "INFO",
                           "-n", f"bench{i}-{os.getpid()}@%h"]
            if args.profile:
                command = [sys.executable, str(ROOT / "bench" / "profiled_worker.py"),
                           str(self.tmp), *worker_args]
            else:
                command = [sys.executable, "-m", "celery", "-A", "dashboard", "worker", *worker_args]
            process = subprocess.Popen(command, cwd=ROOT, env=self.worker_env(),
                                       stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
            self.workers.append(Started(f"celery worker {i}", process, log_path))
        for worker in self.workers:
            def ready(worker=worker) -> bool:
                if not worker.alive():
                    raise BenchError(f"{worker.name} exited at start:\n{worker.tail()}")
                return b" ready." in worker.log_path.read_bytes()

            wait_for(ready, 90, f"{worker.name} to start (log: {worker.log_path})")

    def start_mlflow(self) -> None:
        python = Path(self.args.mlflow_python)
        if not python.exists():
            raise BenchError(f"no MLflow environment at {python}: run `make bench-ingest` (it builds "
                             ".venv-bench) or pass --no-mlflow")
        self.recreate_database(self.mlflow_db)
        port = free_port()
        log_path = self.tmp / "mlflow.log"
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
        uri = self.args.pg_url.replace("postgres://", "postgresql+psycopg://", 1).rstrip("/")
        process = subprocess.Popen(
            [str(python), "-m", "mlflow", "server", "--backend-store-uri", f"{uri}/{self.mlflow_db}",
             "--host", "127.0.0.1", "--port", str(port), "--workers", str(self.mlflow_workers()),
             "--no-serve-artifacts", "--default-artifact-root", f"file://{self.tmp}/mlartifacts"],
            cwd=self.tmp, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self.mlflow = Started("mlflow server", process, log_path, group=True)
        self.mlflow_url = f"http://127.0.0.1:{port}"

    def mlflow_workers(self) -> int:
        # The same number of server processes as Runwatch has worker processes.
        return self.args.workers * self.args.concurrency

    def wait_for_mlflow(self) -> None:
        import urllib.request

        def ready() -> bool:
            if not self.mlflow.alive():
                raise BenchError(f"mlflow server exited at start:\n{self.mlflow.tail()}")
            try:
                with urllib.request.urlopen(f"{self.mlflow_url}/health", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(ready, 180, f"the MLflow server (log: {self.mlflow.log_path})", interval=0.5)

    def setup(self) -> str:
        args = self.args
        self.log(f"database {self.db_name}: drop, create, migrate")
        self.recreate_database(self.db_name)
        self.start_redis()
        if not args.no_mlflow:
            self.start_mlflow()  # starts (and migrates its schema) while ours migrates
        self.manage("migrate", "--noinput", "-v", "0")
        self.apply_db_settings()
        token = self.manage("createtoken", "bench", "--name", "ingest-e2e").strip().splitlines()[-1]
        self.log(f"redis-server at {self.broker_url}; starting {args.workers} worker(s) × "
                 f"concurrency {args.concurrency}")
        self.start_workers()
        if self.mlflow is not None:
            self.wait_for_mlflow()
            self.log(f"MLflow server ready at {self.mlflow_url} ({self.mlflow_workers()} workers)")
        return token

    # our ingest ------------------------------------------------------------------------------

    def start_producers(self, token: str, t0: float) -> None:
        args = self.args
        for i in range(args.producers):
            log_path = self.tmp / f"producer-{i}.log"
            command = [sys.executable, __file__, "--role", "producer", "--producer-index", str(i),
                       "--producers", str(args.producers), "--broker-url", self.broker_url,
                       "--token", token, "--project", "bench", "--run", "llama-405b-bench",
                       "--t0", repr(t0), "--duration", str(args.duration),
                       "--max-depth", str(args.max_depth), "--hosts", str(args.hosts),
                       "--gpus-per-host", str(args.gpus_per_host),
                       "--seconds-per-batch", str(args.seconds_per_batch), "--step-s", str(args.step_s),
                       "--probe-file", str(self.tmp / f"probes-{i}.txt")]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "RUNWATCH_"))}
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=log_path.open("wb"), text=True)
            self.producers.append(Started(f"producer {i}", process, log_path))

    def check_components(self, monitor: Monitor) -> None:
        for part in [*self.workers, *([self.redis] if self.redis else [])]:
            if not part.alive():
                raise BenchError(f"{part.name} died during the run; its log ends with:\n{part.tail()}")
        if monitor.seen.error:
            raise BenchError(monitor.seen.error)
        if monitor.seen.rejected:
            raise BenchError(f"{monitor.seen.rejected} batch(es) were rejected (collectors_rejectedbatch)"
                             f"; worker log: {self.workers[0].log_path}")

    def run_ours(self, token: str) -> Monitor:
        args = self.args
        monitor = Monitor(self, poll_s=0.5, size_every_s=max(5.0, args.duration / 10))
        monitor.start()
        busy0, total0 = machine_cpu()
        # Live ingest: the run started an hour ago. Simulated time runs ahead of the clock (each
        # batch is 60 s of one host), but below ~200k samples/s five minutes cover under an hour.
        t0 = time.time() - 3600
        self.log(f"ingesting for {args.duration:.0f} s: {self.shape.describe()}; "
                 f"{args.producers} producer(s), queue depth ≤ {args.max_depth} batches")
        started = time.monotonic()
        self.start_producers(token, t0)
        produced = []
        while any(p.alive() for p in self.producers):
            self.check_components(monitor)
            time.sleep(1.0)
            if time.monotonic() - started > args.duration + 120:
                raise BenchError("the producers did not stop on time")
        stopped = time.monotonic()
        for producer in self.producers:
            out = producer.process.stdout.read()
            if producer.process.returncode:
                raise BenchError(f"{producer.name} failed:\n{producer.tail()}")
            produced.append(json.loads(out.strip().splitlines()[-1]))
        self.log("producers done; waiting for the queue to drain")
        sent_gpu = sum(p["gpu_samples"] for p in produced)
        sent_steps = sum(p["steps"] for p in produced)

        def drained() -> bool:
            self.check_components(monitor)
            counts = monitor.seen.counts
            return bool(counts) and counts[-1][1] >= sent_gpu and counts[-1][2] >= sent_steps

        try:
            wait_for(drained, max(60.0, args.duration / 2), "the workers to store every batch sent",
                     interval=0.5)
        except BenchError:
            last = monitor.seen.counts[-1] if monitor.seen.counts else (0, 0, 0)
            raise BenchError(f"only {last[1]:,} of {sent_gpu:,} GPU samples sent reached the "
                             f"database; worker log: {self.workers[0].log_path}") from None
        drained_at = time.monotonic()
        time.sleep(2.5)  # one more process sample with the workers idle
        monitor.stop_event.set()
        monitor.join(timeout=30)
        busy1, total1 = machine_cpu()
        self.check_components(monitor)
        self.results["ours"] = self.summarise(monitor, started, stopped, drained_at, produced,
                                              busy1 - busy0, total1 - total0)
        self.verify_rows(sent_gpu, sent_steps)
        return monitor

    def verify_rows(self, sent_gpu: int, sent_steps: int) -> None:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as db:
            gpu = db.execute("SELECT count(*) FROM collectors_gpusample").fetchone()[0]
            steps = db.execute("SELECT count(*) FROM collectors_stepmetric").fetchone()[0]
        if gpu != sent_gpu or steps != sent_steps:
            raise BenchError(f"the database holds {gpu:,} GPU samples and {steps:,} step rows; "
                             f"{sent_gpu:,} and {sent_steps:,} were sent")
        self.results["ours"]["verified_rows"] = {"gpu_samples": gpu, "steps": steps}

    def summarise(self, monitor: Monitor, started: float, stopped: float, drained_at: float,
                  produced: list[dict], machine_busy: float, machine_total: float) -> dict[str, Any]:
        args, seen = self.args, monitor.seen
        warmup = min(15.0, args.duration * 0.1)
        window = [c for c in seen.counts if started + warmup <= c[0] <= stopped]
        if len(window) < 2:
            raise BenchError("too few observations to compute a rate (is --duration too short?)")
        span = window[-1][0] - window[0][0]
        gpu_rate = (window[-1][1] - window[0][1]) / span
        step_rate = (window[-1][2] - window[0][2]) / span
        # 10-second windows within the measured span: the lowest shows whether the rate held.
        slices = []
        t = window[0][0]
        while t + 10 <= window[-1][0]:
            a = next(c for c in window if c[0] >= t)
            b = next(c for c in window if c[0] >= t + 10)
            slices.append((b[1] - a[1]) / (b[0] - a[0]))
            t += 10
        latencies = []
        for i in range(len(self.producers)):
            for line in (self.tmp / f"probes-{i}.txt").read_text().splitlines():
                batch_id, enqueued = line.split()
                if batch_id in seen.visible_at:
                    latencies.append(seen.visible_at[batch_id] - float(enqueued))
        latencies.sort()
        depth = [d for d in seen.depth if started <= d[0] <= stopped]
        rss = [(t - started, sum(per)) for t, per in seen.rss if t >= started]
        rss_warm = [r for t, r in rss if t >= warmup] or [r for _, r in rss]
        worker_cpu = sum(seen.cpu["workers"].values())
        pg_cpu = sum(seen.cpu["postgres"].values())
        total_gpu = sum(p["gpu_samples"] for p in produced)
        sizes = [s for s in seen.sizes if s["gpu_samples"] > 0]
        return {
            "shape": self.shape.describe(),
            "batches": sum(p["batches"] for p in produced),
            "gpu_samples": total_gpu,
            "steps": sum(p["steps"] for p in produced),
            "measured_s": span,
            "warmup_s": warmup,
            "gpu_samples_per_s": gpu_rate,
            "steps_per_s": step_rate,
            "batches_per_s": gpu_rate / self.shape.gpu_rows,
            "gpu_samples_per_s_10s_windows": {
                "min": min(slices) if slices else math.nan,
                "median": statistics.median(slices) if slices else math.nan,
                "max": max(slices) if slices else math.nan, "count": len(slices)},
            "latency_s": {"p50": _pct(latencies, 0.5), "p95": _pct(latencies, 0.95),
                          "max": latencies[-1] if latencies else math.nan, "batches": len(latencies)},
            "queue_depth": {"median": statistics.median([d[1] for d in depth]) if depth else 0,
                            "max": max((d[1] for d in depth), default=0),
                            "share_of_polls_empty": (sum(1 for d in depth if d[1] == 0) / len(depth)
                                                     if depth else 1.0),
                            "series": [(round(t - started, 1), q, u) for t, q, u in depth[::10]]},
            "producer_held_s": sum(p["held_s"] for p in produced),
            "drain_s": drained_at - stopped,
            "worker_rss_mb": {"start": rss_warm[0] / 2**20, "end": rss_warm[-1] / 2**20,
                              "max": max(rss_warm) / 2**20,
                              "series": [(round(t, 1), round(r / 2**20, 1)) for t, r in rss[::5]]},
            "cpu_s": {"workers": worker_cpu, "postgres_backends": pg_cpu,
                      "producers": sum(seen.cpu["producers"].values()),
                      "redis": sum(seen.cpu["redis"].values()),
                      "machine_busy": machine_busy, "machine_total": machine_total},
            "gpu_samples_per_cpu_s": {
                "workers": total_gpu / worker_cpu if worker_cpu else math.nan,
                "workers_and_postgres": total_gpu / (worker_cpu + pg_cpu) if worker_cpu else math.nan},
            "sizes": [{"gpu_samples": s["gpu_samples"], "steps": s["steps"],
                       "gpu_bytes_per_sample": s["gpu_table_bytes"] / s["gpu_samples"],
                       "step_bytes_per_row": s["step_table_bytes"] / max(1, s["steps"]),
                       "database_bytes_per_sample": s["database_bytes"] / s["gpu_samples"],
                       "gpu_table_mb": s["gpu_table_bytes"] / 2**20} for s in sizes],
        }

    # peers -----------------------------------------------------------------------------------

    def run_copy(self) -> None:
        """The COPY peer, twice: into a scratch table with the real table's columns and indexes
        (the standard ceiling, used for the ratio), then the same with its foreign keys too."""
        import psycopg

        shape = self.shape
        factory = BatchFactory(shape, "bench", "copy", time.time() - 60 * 86_400)
        per_chunk = max(1, COPY_ROWS_PER_STATEMENT // shape.gpu_rows)
        with psycopg.connect(self.database_url, autocommit=True) as db:
            run_id, attempt_id = db.execute(
                "SELECT run_id, id FROM collectors_attempt ORDER BY id LIMIT 1").fetchone()
            foreign_keys = [row[0] for row in db.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'collectors_gpusample'::regclass AND contype = 'f'").fetchall()]
        chunks = []
        for c in range(8):
            rows = []
            for b in range(per_chunk):
                batch = factory.batch(c * per_chunk + b)
                g, host = batch["gpus"], batch["source"]["host"]
                rows.extend(
                    (run_id, attempt_id, host, gpu, datetime.fromtimestamp(ts, tz=UTC), temp, power,
                     util, mem, clock, throttle, False)
                    for ts, gpu, temp, power, util, mem, clock, throttle in zip(
                        g["ts"], g["gpu"], g["temp_c"], g["power_w"], g["util_pct"],
                        g["mem_used_mb"], g["sm_clock_mhz"], g["throttle"], strict=True))
            chunks.append(rows)
        seconds = self.args.copy_seconds
        self.log(f"peer: psycopg binary COPY of the same GPU rows, {seconds:.0f} s without and "
                 f"{seconds:.0f} s with the table's {len(foreign_keys)} foreign keys")
        self.results["copy"] = self._copy_for(chunks, seconds, [])
        if foreign_keys:
            self.results["copy_fk"] = self._copy_for(chunks, seconds, foreign_keys)

    def _copy_for(self, chunks: list[list[tuple]], seconds: float, foreign_keys: list[str]) -> dict:
        import psycopg

        columns = ("run_id, attempt_id, host, gpu, ts, temp_c, power_w, util_pct, mem_used_mb, "
                   "sm_clock_mhz, throttle, simulated")
        types = ["int8", "int8", "varchar", "int2", "timestamptz", "float8", "float8", "float8",
                 "float8", "float8", "int8", "bool"]
        written = 0
        with psycopg.connect(self.database_url) as db:
            # Same columns, defaults and indexes as the real table (LIKE copies no foreign keys;
            # they are added when asked). Not partitioned: one table, as a plain COPY would use.
            db.execute("DROP TABLE IF EXISTS bench_copy_gpusample")
            db.execute("CREATE TABLE bench_copy_gpusample (LIKE collectors_gpusample INCLUDING ALL)")
            for definition in foreign_keys:
                db.execute(f"ALTER TABLE bench_copy_gpusample ADD {definition}")
            db.commit()
            began = time.monotonic()
            deadline = began + seconds
            i = 0
            while time.monotonic() < deadline:
                rows = chunks[i % len(chunks)]
                with db.cursor() as cursor:
                    with cursor.copy(f"COPY bench_copy_gpusample ({columns}) FROM STDIN "
                                     "(FORMAT BINARY)") as copy:
                        copy.set_types(types)
                        for row in rows:
                            copy.write_row(row)
                db.commit()
                written += len(rows)
                i += 1
            elapsed = time.monotonic() - began
            size = db.execute("SELECT pg_total_relation_size('bench_copy_gpusample')").fetchone()[0]
            db.execute("DROP TABLE bench_copy_gpusample")
            db.commit()
        return {"rows": written, "elapsed_s": elapsed, "rows_per_s": written / elapsed,
                "rows_per_copy": len(chunks[0]), "foreign_keys": foreign_keys,
                "bytes_per_row": size / written if written else math.nan}

    def run_mlflow(self) -> None:
        seconds, threads = self.args.mlflow_seconds, self.args.mlflow_threads
        self.log(f"peer: MLflow log_batch for {seconds:.0f} s, {threads} client threads")
        done = subprocess.run(
            [self.args.mlflow_python, str(ROOT / "bench" / "mlflow_log_batch.py"),
             "--url", self.mlflow_url, "--threads", str(threads), "--duration", str(seconds),
             "--gpus-per-host", str(self.shape.gpus_per_host),
             "--seconds-per-batch", str(self.shape.seconds_per_batch), "--step-s", str(self.shape.step_s)],
            capture_output=True, text=True, timeout=seconds + 180,
            env=dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true"))
        if done.returncode:
            raise BenchError(f"the MLflow client failed:\n{done.stderr[-3000:]}\n"
                             f"server log: {self.mlflow.log_path}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["errors"]:
            self.log(f"MLflow: {result['errors']} log_batch calls failed, first: {result['first_error']}")
        result["server_workers"] = self.mlflow_workers()
        self.results["mlflow"] = result

    # profile ---------------------------------------------------------------------------------

    def profile_report(self) -> str:
        import io
        import pstats

        files = sorted(self.tmp.glob("pool-*.prof"))
        if not files:
            return "no profile was written (did the pool processes shut down cleanly?)"
        out = io.StringIO()
        stats = pstats.Stats(*map(str, files), stream=out)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats("collectors|trainer_plugin|kombu|celery/app/trace",
                                                   30)
        return out.getvalue()

    # cleanup ---------------------------------------------------------------------------------

    def cleanup(self) -> None:
        for part in [*self.producers, *self.workers]:
            part.stop()
        if self.mlflow is not None:
            self.mlflow.stop()
        if self.redis is not None:
            self.redis.stop()
        if not self.args.keep_db and self.created_dbs:
            import psycopg

            try:
                with psycopg.connect(self.admin_url, autocommit=True) as admin:
                    for name in self.created_dbs:
                        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except psycopg.Error as error:
                print(f"could not drop the bench databases: {error}", file=sys.stderr)
        if not self.args.keep_db and not self.args.profile:
            import shutil

            shutil.rmtree(self.tmp, ignore_errors=True)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, int(q * len(values)))]


# --- report -------------------------------------------------------------------------------------


def report(bench: Bench) -> str:
    r, args = bench.results, bench.args
    ours = r["ours"]
    lines = []
    add = lines.append
    load = os.getloadavg()
    add("")
    add(f"Runwatch end-to-end ingest, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    add(f"shape: {ours['shape']}")
    add(f"workers: {args.workers} × concurrency {args.concurrency}, prefetch "
        f"{args.prefetch if args.prefetch is not None else 'settings default'}"
        f"{''.join(', ' + e for e in args.worker_env + args.db_setting)}; {args.producers} "
        f"producer(s) through BrokerTransport; queue depth ≤ {args.max_depth}")
    add(f"measured {ours['measured_s']:.0f} s after {ours['warmup_s']:.0f} s of warm-up"
        + (" — UNDER cProfile: rates are not comparable" if args.profile else ""))
    add("")
    add("| path | GPU samples/s | step rows/s | ratio: Runwatch / path |")
    add("|---|---|---|---|")
    add(f"| Runwatch: BrokerTransport → Redis → Celery → PostgreSQL | {ours['gpu_samples_per_s']:,.0f} | "
        f"{ours['steps_per_s']:,.0f} | 1 |")
    if "copy" in r:
        c = r["copy"]
        add(f"| psycopg binary COPY, write_row, {c['rows_per_copy']:,} rows per COPY, same indexes | "
            f"{c['rows_per_s']:,.0f} | | {ours['gpu_samples_per_s'] / c['rows_per_s']:.2f} |")
    if "copy_fk" in r:
        c = r["copy_fk"]
        ratio = ours["gpu_samples_per_s"] / c["rows_per_s"]
        add(f"| the same COPY with the table's {len(c['foreign_keys'])} foreign keys (deferred, checked "
            f"per row at commit) | {c['rows_per_s']:,.0f} | | {ratio:.2f} |")
    if "mlflow" in r:
        m = r["mlflow"]
        add(f"| MLflow {m['mlflow_version']} server, log_batch ≤ 1,000 metrics, {m['threads']} clients, "
            f"{m['server_workers']} server workers, {m['elapsed_s']:.0f} s | {m['gpu_samples_per_s']:,.0f} "
            f"({m['metrics_per_s']:,.0f} metrics/s) | {m['steps_per_s']:,.1f} | "
            f"{ours['gpu_samples_per_s'] / max(m['gpu_samples_per_s'], 1e-9):,.0f} |")
    add("")
    w = ours["gpu_samples_per_s_10s_windows"]
    lat = ours["latency_s"]
    q = ours["queue_depth"]
    rss = ours["worker_rss_mb"]
    cpu = ours["cpu_s"]
    add(f"GPU samples/s in 10-s windows: min {w['min']:,.0f}, median {w['median']:,.0f}, "
        f"max {w['max']:,.0f} ({w['count']} windows); {ours['batches_per_s']:.0f} batches/s")
    add(f"latency, enqueue → rows visible: p50 {lat['p50']:.2f} s, p95 {lat['p95']:.2f} s, "
        f"max {lat['max']:.2f} s ({lat['batches']:,} batches)")
    add(f"queue depth: median {q['median']:.0f}, max {q['max']}, empty in "
        f"{q['share_of_polls_empty']:.0%} of polls (empty often = the producers, not the workers, "
        f"were the limit); producers held back {ours['producer_held_s']:.0f} s; drained in "
        f"{ours['drain_s']:.1f} s")
    growth = rss["end"] - rss["start"]
    add(f"worker RSS (all {args.workers} worker(s) with their pool processes): start {rss['start']:.0f} MB, "
        f"end {rss['end']:.0f} MB, max {rss['max']:.0f} MB → "
        f"{'flat' if abs(growth) <= max(0.1 * rss['start'], 20) else 'NOT flat'} ({growth:+.0f} MB)")
    add(f"CPU seconds: workers {cpu['workers']:.0f}, PostgreSQL backends {cpu['postgres_backends']:.0f}, "
        f"producers {cpu['producers']:.0f}, redis {cpu['redis']:.0f}; whole machine busy "
        f"{cpu['machine_busy'] / cpu['machine_total']:.0%} of {cpu['machine_total']:.0f} CPU-s "
        f"(includes other users of this machine)")
    per = ours["gpu_samples_per_cpu_s"]
    add(f"GPU samples per CPU-second: worker processes {per['workers']:,.0f}; workers + their "
        f"PostgreSQL backends {per['workers_and_postgres']:,.0f}")
    if ours["sizes"]:
        points = ", ".join(f"{s['gpu_samples'] / 1e6:.2f}M → {s['gpu_bytes_per_sample']:.0f} B"
                           for s in ours["sizes"])
        last = ours["sizes"][-1]
        add(f"GPU sample table incl. indexes, bytes per sample at: {points}; step rows "
            f"{last['step_bytes_per_row']:.0f} B/row; whole database {last['database_bytes_per_sample']:.0f} "
            f"B per GPU sample")
    if "copy" in r:
        add(f"COPY scratch table: {r['copy']['bytes_per_row']:.0f} B per row")
    add("")
    rate = ours["gpu_samples_per_s"]
    add(f"target ≥ {GPU_SAMPLES_TARGET:,} GPU samples/s sustained: "
        f"{'met' if rate >= GPU_SAMPLES_TARGET else 'NOT met'} ({rate:,.0f}; lowest 10-s window "
        f"{w['min']:,.0f})")
    if "copy" in r:
        ratio = rate / r["copy"]["rows_per_s"]
        verdict = "met" if ratio >= COPY_RATIO_TARGET else "NOT met"
        add(f"target ≥ {COPY_RATIO_TARGET:.0%} of raw COPY: {verdict} ({ratio:.0%})")
    if "mlflow" in r:
        add(f"Runwatch / MLflow: {rate / max(r['mlflow']['gpu_samples_per_s'], 1e-9):,.0f}× the GPU "
            f"samples per second")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of ingest (300)")
    parser.add_argument("--quick", action="store_true",
                        help="30 s of ingest, 2 × 6 s of COPY, 20 s of MLflow: for development")
    parser.add_argument("--workers", type=int, default=1, help="Celery worker processes (1)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool size per worker (2)")
    parser.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"],
                        help="the workers' pool (prefork, as in production)")
    parser.add_argument("--prefetch", type=int, default=None,
                        help="CELERY_WORKER_PREFETCH_MULTIPLIER for the workers (settings default)")
    parser.add_argument("--conn-max-age", type=int, default=None,
                        help="CONN_MAX_AGE for the workers (settings default)")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="another setting for the workers, e.g. CELERY_DB_REUSE_MAX=0 (repeatable)")
    parser.add_argument("--db-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a PostgreSQL setting for the bench database only, e.g. "
                             "synchronous_commit=off (repeatable)")
    parser.add_argument("--producers", type=int, default=1, help="producer processes (1)")
    parser.add_argument("--max-depth", type=int, default=32,
                        help="hold the producers while the ingest queue has this many batches (32)")
    parser.add_argument("--hosts", type=int, default=2048, help="simulated hosts (2048 = 16,384 GPUs)")
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--seconds-per-batch", type=int, default=60,
                        help="the plugin's flush interval the batch covers, seconds (60)")
    parser.add_argument("--step-s", type=float, default=1.0, help="training step time, seconds (1)")
    parser.add_argument("--copy-seconds", type=float, default=20.0,
                        help="seconds of each COPY variant (without, then with foreign keys)")
    parser.add_argument("--mlflow-seconds", type=float, default=60.0)
    parser.add_argument("--mlflow-threads", type=int, default=None,
                        help="MLflow client threads (default: twice the server's workers)")
    parser.add_argument("--no-mlflow", action="store_true", help="skip the MLflow peer")
    parser.add_argument("--no-copy", action="store_true", help="skip the COPY peer")
    parser.add_argument("--mlflow-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--profile", action="store_true",
                        help="run the workers' pool processes under cProfile and print where the "
                             "time goes (rates are then not comparable)")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL",
                                                           "postgres://postgres@127.0.0.1:5432"),
                        help="PostgreSQL server, without a database name")
    parser.add_argument("--db-name", default="runwatch_bench_ingest")
    parser.add_argument("--keep-db", action="store_true", help="keep the databases and logs")
    parser.add_argument("--json", help="write every figure to this file")
    # Producer processes (internal).
    parser.add_argument("--role", default="bench", choices=["bench", "producer"], help=argparse.SUPPRESS)
    for name in ("--producer-index", "--broker-url", "--token", "--project", "--run", "--t0",
                 "--probe-file"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "producer":
        args.producer_index, args.t0 = int(args.producer_index), float(args.t0)
        return args
    if args.quick:
        args.duration, args.copy_seconds, args.mlflow_seconds = 30.0, 6.0, 20.0
    if args.mlflow_threads is None:
        args.mlflow_threads = 2 * args.workers * args.concurrency
    for name in ("workers", "concurrency", "producers", "max_depth", "hosts", "gpus_per_host",
                 "seconds_per_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.duration < 10:
        parser.error("--duration must be at least 10 seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "producer":
        return produce(args)

    # SIGTERM (make, a CI timeout) unwinds through the finally below like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench = Bench(args)
    try:
        token = bench.setup()
        bench.run_ours(token)
        for worker in bench.workers:  # idle now; the peers get the machine to themselves
            worker.stop()
        if not args.no_copy:
            bench.run_copy()
        if not args.no_mlflow:
            bench.run_mlflow()
            bench.mlflow.stop()
        print(report(bench))
        if args.profile:
            print("\nwhere the worker pool processes spent their time (cProfile, all pool "
                  "processes together):")
            print(bench.profile_report())
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"args": {k: v for k, v in vars(args).items() if k != "token"}, **bench.results},
                indent=2, default=str))
        return 0
    except BenchError as error:
        print(f"\nbench/ingest_e2e.py: {error}", file=sys.stderr)
        return 1
    finally:
        bench.cleanup()


if __name__ == "__main__":
    sys.exit(main())
