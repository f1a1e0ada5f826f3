"""How fast one collector process stores batches: the ingest task's write path (validate,
authorize, claim the batch id, COPY) against the database named by DATABASE_URL, beside a bare
psycopg binary COPY of the same GPU-sample rows into a scratch table, measured in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runwatch_bench python bench/ingest_write.py
    DATABASE_URL=sqlite:///var/bench.sqlite3 python bench/ingest_write.py   # the embedded mode

It migrates the database it is given and leaves its rows there: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")


def gpu_batch(project: str, run: str, rows: int, t0: float) -> dict:
    from trainer_plugin import protocol

    gpus = {"ts": [t0 + i // 8 for i in range(rows)], "gpu": [i % 8 for i in range(rows)],
            "temp_c": [65.0] * rows, "power_w": [650.0] * rows, "util_pct": [99.0] * rows,
            "mem_used_mb": [70000.0] * rows, "sm_clock_mhz": [1980.0] * rows,
            "throttle": [0] * rows, "simulated": True}
    return protocol.make_batch(run={"project": project, "name": run, "attempt": 0},
                               source={"host": "node000", "rank": 0, "local_rank": 0,
                                       "world_size": 8}, gpus=gpus)


def step_batch(project: str, run: str, rows: int, first: int, t0: float) -> dict:
    from trainer_plugin import protocol

    steps = {"step": list(range(first, first + rows)), "ts": [t0 + i for i in range(rows)],
             "duration_s": [0.9] * rows, "tokens": [4096] * rows,
             "metrics": {"loss": [2.0] * rows, "lr": [3e-4] * rows, "grad_norm": [1.0] * rows}}
    return protocol.make_batch(run={"project": project, "name": run, "attempt": 0},
                               source={"host": "node000", "rank": 0, "local_rank": 0,
                                       "world_size": 8}, steps=steps)


def bare_copy_rate(rows: int, repeats: int) -> float | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    from datetime import UTC, datetime

    t0 = time.time()
    data = [(1, 1, "node000", i % 8, datetime.fromtimestamp(t0 + i // 8, tz=UTC), 65.0, 650.0,
             99.0, 70000.0, 1980.0, 0, True) for i in range(rows)]
    rates = []
    with connection.cursor() as cursor:
        raw = cursor.cursor
        raw.execute("CREATE TEMP TABLE IF NOT EXISTS bench_gpu (LIKE collectors_gpusample "
                    "INCLUDING DEFAULTS)")
        raw.execute("ALTER TABLE bench_gpu DROP COLUMN IF EXISTS id")
        for _ in range(repeats):
            start = time.perf_counter()
            with raw.copy("COPY bench_gpu (run_id, attempt_id, host, gpu, ts, temp_c, power_w, "
                          "util_pct, mem_used_mb, sm_clock_mhz, throttle, simulated) FROM STDIN "
                          "(FORMAT BINARY)") as copy:
                copy.set_types(["int8", "int8", "varchar", "int2", "timestamptz", "float8",
                                "float8", "float8", "float8", "float8", "int8", "bool"])
                for row in data:
                    copy.write_row(row)
            rates.append(rows / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from collectors.models import IngestToken, Project
    from collectors.tasks import ingest_batch

    call_command("migrate", verbosity=0)
    project, _ = Project.objects.get_or_create(slug="bench")
    token = IngestToken.issue(project)[1]
    run = f"bench-{int(time.time())}"
    t0 = time.time() - 86_400

    results = {}
    for table, build in (("gpu samples", lambda i: gpu_batch("bench", run, args.rows, t0 + i * 3600)),
                         ("step rows", lambda i: step_batch("bench", run, args.rows,
                                                            i * args.rows, t0 + i * args.rows))):
        rates = []
        for i in range(args.batches):
            batch = build(i)
            start = time.perf_counter()
            result = ingest_batch(batch, token=token)
            rates.append(args.rows / (time.perf_counter() - start))
            assert result.get("stored"), result
        results[table] = rates

    print(f"database: {connection.vendor}; {args.batches} batches of {args.rows:,} rows, "
          "one process, the ingest task called directly")
    for table, rates in results.items():
        print(f"  {table:12s} {statistics.median(rates):>10,.0f} rows/s  "
              f"[{min(rates):,.0f}..{max(rates):,.0f}]")
    bare = bare_copy_rate(args.rows, args.batches)
    if bare:
        ratio = statistics.median(results["gpu samples"]) / bare
        print(f"  bare binary COPY of the same GPU rows: {bare:,.0f} rows/s; "
              f"the ingest task reaches {ratio:.0%} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
