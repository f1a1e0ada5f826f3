"""Day partitions of the step and GPU-sample tables (PostgreSQL; see migration 0006): made before
the rows that need them arrive, and dropped when their data is older than the retention.

Where a row goes: the partition of its UTC day, else the DEFAULT partition. Nothing is ever
refused for lack of a partition, and nothing is lost; but rows in DEFAULT are read without
pruning and would block the creation of their day's partition, so:

- ``ensure_for_batch`` runs before each batch is stored and creates the days the batch touches
  (a backfill from last week, a clock in the future). It remembers per process which days exist,
  so for the usual batch it is two min/max over the batch's timestamps and a set lookup.
- the beat task ``collectors.ensure_partitions`` creates today and the next days ahead, so the
  hot path creates nothing in normal operation.
- creating a day whose rows already sit in DEFAULT moves them into the new partition in the same
  transaction.

A partition is created as a plain table and then attached: ATTACH PARTITION takes only a SHARE
UPDATE EXCLUSIVE lock on the parent, where CREATE TABLE ... PARTITION OF would take ACCESS
EXCLUSIVE and queue every dashboard read and ingest write behind any long query. Concurrent
workers serialise on an advisory lock and re-check under it, so two workers creating the same day
both succeed; a lock wait longer than LOCK_TIMEOUT gives up quietly (the rows go to DEFAULT and the
next call or the beat task tries again): a partition is never a reason to fail a batch.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction

log = logging.getLogger(__name__)

TABLES = ("collectors_stepmetric", "collectors_gpusample")
DAY_S = 86400
# Days created ahead of now by the beat task: a worker never has to create today's partition at
# midnight, and a beat outage of this long still costs nothing.
DAYS_AHEAD = 3
# At most this many days are created for one batch; a batch spanning more (a clock gone wrong)
# leaves the rest in DEFAULT rather than creating thousands of tables.
MAX_DAYS_PER_BATCH = 31
LOCK_TIMEOUT = "5s"
_ADVISORY_KEY = zlib.crc32(b"runwatch.partitions")

# Days (numbers since 1970-01-01 UTC) known to have a partition in every table, per process.
_known_days: set[int] = set()


@dataclass(frozen=True)
class Partition:
    table: str  # the parent
    name: str
    start: datetime
    end: datetime  # exclusive


def enabled() -> bool:
    return connection.vendor == "postgresql"


def day_of(ts: datetime | float) -> int:
    seconds = ts.timestamp() if isinstance(ts, datetime) else float(ts)
    return math.floor(seconds / DAY_S)


def day_start(day: int) -> datetime:
    return datetime.fromtimestamp(day * DAY_S, tz=UTC)


def partition_name(table: str, day: int) -> str:
    return f"{table}_p{day_start(day):%Y%m%d}"


def ensure_for_batch(batch: dict[str, Any]) -> None:
    """Makes sure the days of a validated wire batch's step and GPU timestamps (Unix seconds)
    have partitions. Never raises: rows without a partition still land in DEFAULT."""
    if not enabled():
        return
    bounds = []
    for table in ("steps", "gpus"):
        times = batch.get(table, {}).get("ts")
        if times is not None and len(times):
            bounds += [_min(times), _max(times)]
    if not bounds:
        return
    first, last = day_of(min(bounds)), day_of(max(bounds))
    if first == last and first in _known_days:
        return
    days = range(first, min(last, first + MAX_DAYS_PER_BATCH - 1) + 1)
    if all(day in _known_days for day in days):
        return
    try:
        ensure_days(days)
    except DatabaseError:
        log.warning("could not create partitions for days %s..%s; rows go to the default "
                    "partition until the next try", day_start(first), day_start(last),
                    exc_info=True)


def _min(values) -> float:
    return float(values.min()) if hasattr(values, "min") else float(min(values))


def _max(values) -> float:
    return float(values.max()) if hasattr(values, "max") else float(max(values))


def ensure_range(start: datetime, end: datetime) -> list[str]:
    """Partitions for every day from ``start`` to ``end`` inclusive; returns the names created."""
    return ensure_days(range(day_of(start), day_of(end) + 1))


def ensure_ahead(now: datetime | None = None, days_ahead: int = DAYS_AHEAD) -> list[str]:
    """Today's partitions and the next ``days_ahead`` days' (the beat task)."""
    now = now or datetime.now(UTC)
    return ensure_range(now, now + timedelta(days=days_ahead))


def ensure_days(days: Iterable[int]) -> list[str]:
    """Creates the missing partitions of the given days in every table. Idempotent and safe to
    call from many processes at once. Returns the names created."""
    wanted = sorted(set(days) - _known_days)
    if not wanted or not enabled():
        return []
    created: list[str] = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            # Serialises creators; the check below runs under the lock, so the second of two
            # workers finds the first one's partitions and creates nothing.
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
            for table in TABLES:
                existing = {day_of(p.start) for p in partitions(table)}
                for day in wanted:
                    if day not in existing:
                        _create(cursor, table, day)
                        created.append(partition_name(table, day))
    # Remembered only once committed: a partition made inside a transaction that is later rolled
    # back (a test, a failed outer block) must be looked up again, not trusted.
    transaction.on_commit(lambda: _known_days.update(wanted))
    if created:
        log.info("created partitions %s", ", ".join(created))
    return created


def _create(cursor, table: str, day: int) -> None:
    name, default = partition_name(table, day), f"{table}_default"
    start, end = day_start(day), day_start(day + 1)
    cursor.execute(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS '
                   f"INCLUDING CONSTRAINTS)")
    # Rows of this day that arrived before the partition did: ATTACH refuses while DEFAULT holds
    # any, and they belong here.
    cursor.execute(
        f'WITH moved AS (DELETE FROM "{default}" WHERE ts >= %(start)s AND ts < %(end)s '
        f'RETURNING *) INSERT INTO "{name}" SELECT * FROM moved', {"start": start, "end": end})
    cursor.execute(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" '
                   f"FOR VALUES FROM (%(start)s) TO (%(end)s)", {"start": start, "end": end})


_PARTITIONS_SQL = """
SELECT child.relname,
       (regexp_match(pg_get_expr(child.relpartbound, child.oid), 'FROM \\(''([^'']+)''\\)'))[1]
           ::timestamptz,
       (regexp_match(pg_get_expr(child.relpartbound, child.oid), 'TO \\(''([^'']+)''\\)'))[1]
           ::timestamptz
FROM pg_inherits i
JOIN pg_class child ON child.oid = i.inhrelid
WHERE i.inhparent = %s::regclass
  AND pg_get_expr(child.relpartbound, child.oid) <> 'DEFAULT'
ORDER BY 2
"""


def partitions(table: str) -> list[Partition]:
    """The day partitions of ``table`` (DEFAULT left out), oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(_PARTITIONS_SQL, [table])
        return [Partition(table, name, start, end) for name, start, end in cursor.fetchall()]


def drop_older_than(cutoff: datetime, *, dry_run: bool = False) -> list[Partition]:
    """Drops every day partition whose whole day ends at or before ``cutoff`` (raw rows only: the
    minute rollups, which long-range pages read, are kept). DEFAULT is never dropped. Returns the
    partitions dropped (or that would be, with ``dry_run``)."""
    if not enabled():
        return []
    old = [p for table in TABLES for p in partitions(table) if p.end <= cutoff]
    if dry_run or not old:
        return old
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
            # Deferred foreign-key checks of rows written earlier in this transaction would
            # forbid the DROP; checking them now changes nothing else.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for partition in old:
                # Detach first: it needs only SHARE UPDATE EXCLUSIVE on the parent.
                cursor.execute(f'ALTER TABLE "{partition.table}" DETACH PARTITION '
                               f'"{partition.name}"')
                cursor.execute(f'DROP TABLE "{partition.name}"')
    forget()
    return old


def forget() -> None:
    """Forgets which days are known to exist (after partitions were dropped, and in tests)."""
    _known_days.clear()
