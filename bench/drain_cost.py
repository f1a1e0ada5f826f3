"""CPU of one pool process and of its PostgreSQL backend per stored batch, for drains of real-shaped
batches (what a worker's pool process does with the messages its main process drained together:
collectors.drain.run_drained), in this one process, with no broker. For comparing changes to the
write path: the end-to-end figure is bench/ingest_e2e.py's.

    .venv/bin/python bench/drain_cost.py                    # 60 drains of 32 batches
    .venv/bin/python bench/drain_cost.py --drains 30 --per-drain 64 --profile

Drops and creates the database --db-name (default runwatch_bench_drain) on --pg-url, migrates it,
stores --warm-up drains, then times --drains drains: this process's CPU (time.process_time) and
its backend's (/proc/<pid>/stat), each divided by the batches stored, and the wall time of each
SQL statement (Django's execute wrapper; the COPYs go through psycopg directly and are not listed).
Drops the database at the end unless --keep-db.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drains", type=int, default=60)
    parser.add_argument("--per-drain", type=int, default=32)
    parser.add_argument("--warm-up", type=int, default=5, help="drains before timing (5)")
    parser.add_argument("--profile", action="store_true", help="and cProfile's top functions")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL",
                                                           "postgres://postgres@127.0.0.1:5432"))
    parser.add_argument("--db-name", default="runwatch_bench_drain")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()

    import psycopg

    admin = f"{args.pg_url}/postgres"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{args.db_name}"')
    os.environ["DATABASE_URL"] = f"{args.pg_url}/{args.db_name}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    try:
        return run(args)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            with psycopg.connect(admin, autocommit=True) as db:
                db.execute(f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)')


def run(args: argparse.Namespace) -> int:
    import logging

    import django

    django.setup()
    logging.getLogger("collectors").setLevel(logging.WARNING)
    import orjson
    from django.core.management import call_command
    from django.db import connection
    from ingest_e2e import BatchFactory, Shape

    import collectors.tasks  # noqa: F401  (registers the ingest task)
    from collectors import drain
    from collectors.models import IngestToken, Project, RejectedBatch

    call_command("migrate", verbosity=0)
    project = Project.objects.create(slug="bench", name="bench")
    token = IngestToken.issue(project, "drain-cost")[1]
    factory = BatchFactory(Shape(2048, 8, 60, 1.0), "bench", "drain-cost", time.time() - 3600)
    sequence = 0

    def messages() -> list:
        nonlocal sequence
        out = []
        for _ in range(args.per_drain):
            body = orjson.dumps([[factory.batch(sequence)], {"token": token},
                                 {"callbacks": None, "errbacks": None, "chain": None,
                                  "chord": None}])
            sequence += 1
            out.append((str(uuid.uuid4()), body, "application/json", "utf-8", False))
        return out

    for _ in range(args.warm_up):
        drain.run_drained("collectors.ingest_batch", messages())
    drains = [messages() for _ in range(args.drains)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]

    timings: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()

    def timed(execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            key = " ".join(sql.split())[:60]
            timings[key] += time.perf_counter() - began
            counts[key] += 1

    profile = cProfile.Profile() if args.profile else None
    with connection.execute_wrapper(timed):
        server0, client0, wall0 = backend_cpu(pid), time.process_time(), time.perf_counter()
        if profile:
            profile.enable()
        for one in drains:
            drain.run_drained("collectors.ingest_batch", one)
        if profile:
            profile.disable()
        server1, client1, wall1 = backend_cpu(pid), time.process_time(), time.perf_counter()
    batches = args.drains * args.per_drain
    if RejectedBatch.objects.exists():
        print(f"{RejectedBatch.objects.count()} batches were rejected", file=sys.stderr)
        return 1
    print(f"{batches:,} batches in drains of {args.per_drain}: per batch, pool process CPU "
          f"{1000 * (client1 - client0) / batches:.3f} ms, its PostgreSQL backend "
          f"{1000 * (server1 - server0) / batches:.3f} ms, wall {1000 * (wall1 - wall0) / batches:.3f} ms")
    print("statements (wall per batch, calls):")
    for key, seconds in sorted(timings.items(), key=lambda item: -item[1]):
        print(f"  {1000 * seconds / batches:7.3f} ms  {counts[key]:5d}  {key}")
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
