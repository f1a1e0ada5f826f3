"""How fast one collector process stores batches: the ingest task's whole per-batch work
(validate, authorize, claim the batch id, binary COPY, rollups, run/attempt updates, commit)
against the database named by DATABASE_URL, beside a bare psycopg binary COPY of the same GPU rows
into a scratch table, measured in the same run, alternating.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runwatch_bench python bench/ingest_write.py
    DATABASE_URL=... python bench/ingest_write.py --quick        # ~20 s, for development
    DATABASE_URL=... python bench/ingest_write.py --profile      # and where the time goes
    DATABASE_URL=sqlite:///var/bench.sqlite3 python bench/ingest_write.py   # the embedded mode

Two shapes of batch: large ones (--rows GPU rows, or step rows, per batch: the per-row cost) and
the shape bench/ingest_e2e.py sends (one host's 8 GPUs for 60 s = 480 GPU samples plus 60 step
rows: the per-batch cost counts too). The task is called directly in this process: no broker, no
Celery, so this is the ceiling of one worker process, not the end-to-end figure.

It migrates the database it is given and leaves its rows there: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

GPU_TYPES = ["int8", "int8", "varchar", "int2", "timestamptz", "float8", "float8", "float8",
             "float8", "float8", "int8", "bool"]


def gpu_batch(project: str, run: str, rows: int, t0: float, host: str = "node000") -> dict:
    from trainer_plugin import protocol

    gpus = {"ts": [t0 + i // 8 for i in range(rows)], "gpu": [i % 8 for i in range(rows)],
            "temp_c": [60.0 + (i * 7 % 23) * 0.5 for i in range(rows)],
            "power_w": [550.0 + (i * 13 % 31) * 5.0 for i in range(rows)],
            "util_pct": [99.0] * rows, "mem_used_mb": [70000.0] * rows,
            "sm_clock_mhz": [1980.0 - (i % 4) * 15.0 for i in range(rows)],
            "throttle": [0 if i % 50 else 4 for i in range(rows)], "simulated": True}
    return protocol.make_batch(run={"project": project, "name": run, "attempt": 0},
                               source={"host": host, "rank": 0, "local_rank": 0,
                                       "world_size": 8}, gpus=gpus)


def step_batch(project: str, run: str, rows: int, first: int, t0: float, rank: int = 0) -> dict:
    from trainer_plugin import protocol

    steps = {"step": list(range(first, first + rows)), "ts": [t0 + i for i in range(rows)],
             "duration_s": [0.9 + (i % 7) * 0.01 for i in range(rows)], "tokens": [4096] * rows,
             "metrics": {"loss": [2.0 + (i % 11) * 0.01 for i in range(rows)],
                         "lr": [3e-4] * rows, "grad_norm": [1.0] * rows}}
    return protocol.make_batch(run={"project": project, "name": run, "attempt": 0},
                               source={"host": f"node{rank // 8:05d}", "rank": rank,
                                       "local_rank": rank % 8, "world_size": 16_384},
                               steps=steps)


def host_minute_batch(project: str, run: str, sequence: int, t0: float, hosts: int = 2048) -> dict:
    """bench/ingest_e2e.py's shape: host ``sequence % hosts``'s next minute, 8 GPUs at 1 Hz and
    one step per second, carrying the run's config as the plugin does."""
    host, window = sequence % hosts, sequence // hosts
    start = t0 + window * 60
    batch = step_batch(project, run, 60, window * 60, start, rank=host * 8)
    gpus = gpu_batch(project, run, 480, start)["gpus"]
    batch["gpus"] = gpus
    batch["source"]["host"] = f"node{host:05d}"
    batch["run"]["config"] = {"model": "llama-405b", "bench": True}
    return batch


class Meter:
    """Wall time, this process's CPU time and the CPU time of this connection's PostgreSQL backend
    (read from /proc: the database must run on this machine) over a measured call. CPU time is
    the steadier measure on a shared machine: waiting for a core does not count in it."""

    def __init__(self) -> None:
        from django.db import connection

        self.backend_stat = None
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                stat = Path(f"/proc/{cursor.fetchone()[0]}/stat")
            self.backend_stat = stat if stat.exists() else None
        self.tick = os.sysconf("SC_CLK_TCK")

    def backend_cpu(self) -> float:
        if self.backend_stat is None:
            return float("nan")
        fields = self.backend_stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def measure(self, call) -> tuple[float, float, float]:
        wall, cpu, backend = time.perf_counter(), time.process_time(), self.backend_cpu()
        call()
        return (time.perf_counter() - wall, time.process_time() - cpu,
                self.backend_cpu() - backend)


def gpu_rows(rows: int, t0: float, run_id: int, attempt_id: int) -> list[tuple]:
    from datetime import UTC, datetime

    return [(run_id, attempt_id, "node000", i % 8, datetime.fromtimestamp(t0 + i // 8, tz=UTC),
             65.0, 650.0, 99.0, 70000.0, 1980.0, 0, True) for i in range(rows)]


def bare_copy(table: str, data: list[tuple]) -> None:
    """psycopg's own binary COPY (write_row per row) of ready-made rows, committed."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} (run_id, attempt_id, host, gpu, ts, temp_c, "
                                "power_w, util_pct, mem_used_mb, sm_clock_mhz, throttle, "
                                "simulated) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(GPU_TYPES)
            for row in data:
                copy.write_row(row)


def scratch_table() -> str:
    """A table with the GPU samples' columns and nothing else: no index, no constraint, no
    partitions, no WAL. The ceiling of the database side."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_gpu_bare")
        cursor.execute("CREATE UNLOGGED TABLE bench_gpu_bare (LIKE collectors_gpusample "
                       "INCLUDING DEFAULTS)")
        cursor.execute("ALTER TABLE bench_gpu_bare DROP COLUMN id")
    return "bench_gpu_bare"


def prepared(batch: dict) -> dict:
    """The batch, once the partitions of its days exist, as the beat task makes them ahead of
    time in a deployment (collectors.partitions): creating one is not the per-batch cost."""
    from django.db import connection

    if connection.vendor == "postgresql":
        from collectors import partitions

        partitions.ensure_for_batch(batch)
    return batch


def task_call(batch: dict, token: str):
    from collectors.tasks import ingest_batch

    def call():
        result = ingest_batch(batch, token=token)
        assert result.get("stored"), result

    return call


def fmt(rates: list[float]) -> str:
    return f"{statistics.median(rates):>10,.0f} [{min(rates):,.0f}..{max(rates):,.0f}]"


def report(label: str, rows: int, samples: list[tuple[float, float, float]]) -> float:
    """Prints rows/s by wall time and the CPU per 10,000 rows; returns the median rows/s."""
    rates = [rows / wall for wall, _, _ in samples]
    worker = statistics.median(cpu for _, cpu, _ in samples) / rows * 1e4 * 1000
    backend = statistics.median(db for _, _, db in samples) / rows * 1e4 * 1000
    database = "" if math.isnan(backend) else f" + PostgreSQL backend {backend:5.0f} ms"
    print(f"    {label:34s} {fmt(rates)} rows/s; CPU per 10k rows: this process {worker:5.0f} ms"
          f"{database}")
    return statistics.median(rates)


# Where a batch's time goes: the functions whose cumulative time makes up each phase.
PHASES = (
    ("validate (protocol.validate_batch)", ("protocol.py", "validate_batch")),
    ("authorize (token check)", ("ingest.py", "authorize")),
    ("run/attempt check + claim the batch id", ("ingest.py", "_place_and_claim")),
    ("numpy columns and rollup aggregates", ("ingest.py", "_gpu_table"), ("ingest.py", "_step_table"),
     ("ingest.py", "_event_table")),
    ("binary COPY (payload + server)", ("bulk_write.py", "write")),
    ("  of which building the payload", ("bulk_write.py", "copy_payload")),
    ("rollup upserts", ("rollups.py", "add")),
    ("run/attempt UPDATEs", ("ingest.py", "_update_run_and_attempt")),
    ("commit", ("transaction.py", "__exit__")),
)


def profile(batches: list[dict], token: str) -> None:
    from collectors.tasks import ingest_batch

    # CPU time, not wall time: what this process spends, whatever the machine's load.
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for batch in batches:
        ingest_batch(batch, token=token)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    total = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                if file.endswith("tasks.py") and name == "ingest_batch")

    def cumulative(file_suffix: str, function: str) -> float:
        return sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items()
                   if file.endswith(file_suffix) and name == function)

    print(f"  CPU profile of this process over {len(batches)} batches (cProfile inflates "
          "Python-heavy phases; the database's own CPU is not in it):")
    accounted = 0.0
    for label, *functions in PHASES:
        spent = sum(cumulative(*function) for function in functions)
        accounted += 0 if label.startswith(" ") else spent
        print(f"    {label:40s} {spent / total:6.1%}  {spent / len(batches) * 1000:7.2f} ms/batch")
    other = total - accounted
    print(f"    {'other (Celery call, transaction, ...)':40s} {other / total:6.1%}  "
          f"{other / len(batches) * 1000:7.2f} ms/batch")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows per large batch (10,000)")
    parser.add_argument("--batches", type=int, default=10, help="large batches per table (10)")
    parser.add_argument("--host-batches", type=int, default=300,
                        help="batches of bench/ingest_e2e.py's shape (300)")
    parser.add_argument("--quick", action="store_true", help="3 large batches, 100 host batches")
    parser.add_argument("--profile", action="store_true",
                        help="then profile 100 host batches and 5 large GPU batches by phase")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.host_batches = 3, 100

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from collectors.models import Attempt, IngestToken, Project

    call_command("migrate", verbosity=0)
    project, _ = Project.objects.get_or_create(slug="bench")
    token = IngestToken.issue(project)[1]
    run = f"bench-{uuid.uuid4().hex[:8]}"
    t0 = time.time() - 30 * 86_400
    postgres = connection.vendor == "postgresql"
    load = os.getloadavg()[0]
    meter = Meter()
    # The run and attempt the task creates; the bare COPY into the real table uses their ids.
    task_call(gpu_batch("bench", run, 8, t0 - 86_400), token)()
    attempt = Attempt.objects.get(run__project=project, run__name=run)

    measured: dict[str, list] = {"task": [], "steps": [], "copy_real": [], "copy_bare": []}
    bare = scratch_table() if postgres else ""
    # Task and bare COPYs alternate within each round, so load from other processes on the
    # machine hits them alike.
    for i in range(args.batches):
        day = t0 + i * 86_400
        measured["task"].append(meter.measure(
            task_call(prepared(gpu_batch("bench", run, args.rows, day)), token)))
        if postgres:
            data = gpu_rows(args.rows, day, attempt.run_id, attempt.pk)
            measured["copy_real"].append(meter.measure(
                lambda data=data: bare_copy("collectors_gpusample", data)))
            measured["copy_bare"].append(meter.measure(lambda data=data: bare_copy(bare, data)))
        measured["steps"].append(meter.measure(task_call(
            prepared(step_batch("bench", run, args.rows, i * args.rows, t0 + i * args.rows)),
            token)))

    host_run = f"{run}-hosts"
    host_batches = [prepared(host_minute_batch("bench", host_run, s, t0))
                    for s in range(args.host_batches)]
    # The first batch creates the run and attempt; time the steady state.
    task_call(host_batches[0], token)()
    per_batch = [meter.measure(task_call(batch, token)) for batch in host_batches[1:]]

    print(f"database: {connection.vendor}; one process calling the ingest task directly (no "
          f"broker); median [min..max]; 1-min load average at the start {load:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"  large batches: {args.batches} × {args.rows:,} rows, each committed on its own")
    task_rate = report("ingest task, GPU samples", args.rows, measured["task"])
    report("ingest task, step rows", args.rows, measured["steps"])
    if postgres:
        real = report("bare COPY into collectors_gpusample", args.rows, measured["copy_real"])
        ceiling = report("bare COPY into a bare table", args.rows, measured["copy_bare"])
        print(f"    => the task stores GPU samples at {task_rate / real:.0%} of the rate of a bare "
              f"COPY into the same table (its indexes, partitions, foreign keys) and "
              f"{task_rate / ceiling:.0%} of one into an unlogged table with nothing on it")
    n = len(per_batch)
    spent = sum(wall for wall, _, _ in per_batch)
    print(f"  e2e-shaped batches: {n} × (480 GPU samples + 60 step rows), one per host and minute")
    print(f"    {n / spent:,.0f} batches/s = {n * 480 / spent:,.0f} GPU samples/s + "
          f"{n * 60 / spent:,.0f} step rows/s; per batch: median "
          f"{statistics.median(w for w, _, _ in per_batch) * 1000:.1f} ms wall; CPU "
          f"{sum(c for _, c, _ in per_batch) / n * 1000:.1f} ms this process"
          + ("" if not postgres else
             f" + {sum(d for _, _, d in per_batch) / n * 1000:.1f} ms PostgreSQL backend"))

    if args.profile:
        profile([prepared(host_minute_batch("bench", host_run, s, t0))
                 for s in range(args.host_batches, args.host_batches + 100)], token)
        profile([prepared(gpu_batch("bench", run, args.rows, t0 + (args.batches + i) * 86_400))
                 for i in range(5)], token)
    if postgres:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {bare}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
