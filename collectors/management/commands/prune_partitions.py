"""Drops the raw step and GPU-sample partitions of days older than a retention period.

    python manage.py prune_partitions --keep-days 90 [--dry-run]

Only raw rows go: the per-minute rollups (what long-range pages and whole-run analyses read) are
kept, so a run's history stays on the dashboard at minute resolution after its raw rows are gone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError

from collectors import partitions


class Command(BaseCommand):
    help = "Drop raw step/GPU-sample partitions whose whole day is older than --keep-days."

    def add_arguments(self, parser):
        parser.add_argument("--keep-days", type=int, required=True,
                            help="days of raw rows to keep, counted back from now (at least 1)")
        parser.add_argument("--dry-run", action="store_true",
                            help="list what would be dropped, drop nothing")

    def handle(self, *args, keep_days: int, dry_run: bool, **options):
        if keep_days < 1:
            raise CommandError("--keep-days must be at least 1: today's partition is being written.")
        if not partitions.enabled():
            raise CommandError("partitions exist only on PostgreSQL; this database has none.")
        cutoff = datetime.now(UTC) - timedelta(days=keep_days)
        dropped = partitions.drop_older_than(cutoff, dry_run=dry_run)
        verb = "would drop" if dry_run else "dropped"
        for partition in dropped:
            self.stdout.write(f"{verb} {partition.name} ({partition.start:%Y-%m-%d})")
        self.stdout.write(f"{verb} {len(dropped)} partitions older than {cutoff:%Y-%m-%d %H:%M} UTC")
