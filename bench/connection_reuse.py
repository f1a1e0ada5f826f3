"""What a new PostgreSQL connection per batch costs the ingest task (Celery's default, which
CELERY_DB_REUSE_MAX turns off): the task is called directly, batch after batch, alternating
between a fresh connection and the kept one, and each call is timed.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/runwatch_bench_reuse \
        .venv/bin/python bench/connection_reuse.py --batches 200

It migrates the database it is given and leaves its rows there: point it at a scratch database.
Alternating call by call keeps the comparison fair on a machine shared with other work.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="calls of each kind")
    parser.add_argument("--seconds-per-batch", type=int, default=60)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench.ingest_e2e import BatchFactory, Shape
    from collectors.models import IngestToken, Project
    from collectors.tasks import ingest_batch

    if connection.vendor != "postgresql":
        print("this measures PostgreSQL connections: point DATABASE_URL at PostgreSQL")
        return 2
    call_command("migrate", verbosity=0)
    project, _ = Project.objects.get_or_create(slug="bench")
    token = IngestToken.issue(project)[1]
    factory = BatchFactory(Shape(2048, 8, args.seconds_per_batch, 1.0), "bench",
                           f"reuse-{int(time.time())}", time.time() - 30 * 86_400)
    timings: dict[str, list[float]] = {"new connection per batch": [], "connection kept": []}
    for sequence in range(2 * args.batches + 10):
        fresh = sequence % 2 == 0
        if fresh:
            connection.close()  # what Celery's fixup does around every task by default
        batch = factory.batch(sequence)
        began = time.perf_counter()
        result = ingest_batch(batch, token=token)
        elapsed = time.perf_counter() - began
        assert result.get("stored"), result
        if sequence >= 10:  # the first calls warm caches on both sides
            timings["new connection per batch" if fresh else "connection kept"].append(elapsed)
    print(f"ingest task called directly, {args.batches} batches of each kind, alternating; "
          f"{factory.shape.describe()}")
    medians = {}
    for kind, values in timings.items():
        values.sort()
        medians[kind] = statistics.median(values)
        print(f"  {kind:26s} median {medians[kind] * 1000:7.1f} ms, p90 "
              f"{values[int(0.9 * len(values))] * 1000:7.1f} ms per batch")
    extra = medians["new connection per batch"] - medians["connection kept"]
    print(f"  a new connection costs {extra * 1000:.1f} ms per batch "
          f"({extra / medians['connection kept']:.0%} of the task with a kept connection)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
