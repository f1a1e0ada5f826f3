"""python manage.py rebuild_rollups [--run ID]: recomputes the per-minute rollups from the raw rows.

Ingest keeps the rollups current by itself; this is for rows that arrived another way (a bulk load
by COPY, a database from before the rollups existed) or after raw rows were deleted by hand. On
PostgreSQL it is two set-based INSERT ... SELECT ... GROUP BY statements per table; ingest into
the rollup tables waits while it runs (collectors.rollups.rebuild says why).
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from collectors import rollups
from collectors.models import Run


class Command(BaseCommand):
    help = ("Recomputes the step and GPU rollups (per minute; per host-minute, run-minute and "
            "GPU-hour) of one run (or all) from the raw rows.")

    def add_arguments(self, parser):
        parser.add_argument("--run", type=int, metavar="ID",
                            help="only this run (its id, as in the run page's address)")

    def handle(self, *args, run: int | None, **options):
        if run is not None and not Run.objects.filter(pk=run).exists():
            raise CommandError(f"there is no run with id {run}")
        started = time.perf_counter()
        counts = rollups.rebuild(run)
        self.stdout.write(
            f"rebuilt {'run ' + str(run) if run is not None else 'every run'}: "
            f"{counts['step_minutes']:,} step minutes, {counts['gpu_minutes']:,} GPU minutes, "
            f"{counts['host_minutes']:,} host minutes, {counts['cluster_minutes']:,} cluster "
            f"minutes, {counts['gpu_hours']:,} GPU hours "
            f"in {time.perf_counter() - started:.1f} s"
        )
