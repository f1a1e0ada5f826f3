"""Per-minute rollups (collectors.models.StepMinute, GpuMinute), kept current by ingest.

Ingest calls ``add`` in the transaction that writes a batch's raw rows, so a batch is counted
exactly once: a redelivered batch is refused before either is written, and a batch that fails
leaves neither. The batch is aggregated by minute in numpy and merged with one upsert per table
(sums and counts add up, minima and maxima compare; on PostgreSQL both in one statement), so
batches can arrive in any order and from any number of workers. ``rebuild`` recomputes the same rows from
the raw tables, for data loaded without ingest (a COPY, an old database).

Two coarser rollups are derived from GpuMinute for the whole-run cluster pages (a 512-GPU run has
512 GpuMinute rows a minute): HostMinute (a host's GPUs summed per minute) and GpuHour (a GPU's
minutes merged per hour). After its GpuMinute upsert a batch recomputes, from GpuMinute, the
HostMinute rows of its host's minutes and the GpuHour rows of its (GPU, hour)s: replaced, not
merged, so they are exact however batches split minutes and hours. A batch carries one host's
samples, so two workers storing different hosts never write the same row; two batches of the
same host's GPUs stored at once in separate transactions could each miss the other's minute
(the sampler sends a host's GPUs together, from one rank), and ``rebuild`` repairs that.
ClusterMinute (every host of a run-minute summed) is recomputed from HostMinute last, under row
locks, as every worker storing the current minute writes the same row (see
_derive_cluster_minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import connection, transaction

from collectors import step_quarters
from collectors.columns import MICROS_PER_MINUTE

# What merges how when a minute already has a row: ADD sums and counts, MAX/MIN compare (a null
# on either side keeps the other), OR combines bits.
ADD, MAX, MIN, OR = "add", "max", "min", "or"

STEP_TABLE = "collectors_stepminute"
STEP_KEY = ("run_id", "rank", "minute")
STEP_VALUES = (("steps", ADD), ("last_step", MAX), ("duration_n", ADD), ("duration_sum", ADD),
               ("duration_max", MAX), ("tokens", ADD), ("loss_n", ADD), ("loss_sum", ADD))

# NVML's reasons that mean the GPU was held back (power cap, thermal, HW slowdown); idle, app
# clocks, sync boost and display clock are normal operation. The same mask as
# collectors.analysis.gpu_health.THROTTLING_MASK (imported there would be a cycle of layers).
THROTTLING_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

GPU_TABLE = "collectors_gpuminute"
HOST_TABLE = "collectors_hostminute"
CLUSTER_TABLE = "collectors_clusterminute"
HOUR_TABLE = "collectors_gpuhour"
GPU_KEY = ("run_id", "host", "gpu", "minute")
HOUR_KEY = ("run_id", "host", "gpu", "hour")
GPU_VALUES = (("samples", ADD), ("temp_n", ADD), ("temp_sum", ADD), ("temp_max", MAX),
              ("power_n", ADD), ("power_sum", ADD), ("power_min", MIN), ("power_max", MAX),
              ("util_n", ADD), ("util_sum", ADD), ("clock_n", ADD), ("clock_sum", ADD),
              ("clock_min", MIN), ("throttled", ADD), ("throttle_bits", OR))

# PostgreSQL array types of the per-group columns, for the unnest() upsert.
_PG_TYPES = {"host": "text", "rank": "int8", "gpu": "int8", "minute": "int8", "hour": "int8",
             "last_step": "int8",
             "tokens": "int8", "throttle_bits": "int8", "duration_max": "float8",
             "duration_sum": "float8", "loss_sum": "float8", "temp_sum": "float8",
             "temp_max": "float8", "power_sum": "float8", "power_min": "float8",
             "power_max": "float8", "util_sum": "float8", "clock_sum": "float8",
             "clock_min": "float8"}


@dataclass(frozen=True)
class Groups:
    """Aggregates with their keys: per column, one value per group (a rank's minute, a GPU's
    minute or hour), in key order."""

    columns: dict[str, list]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()), []))


@dataclass(frozen=True)
class StepRows:
    """A rank's steps (one batch's, or all of them on a rebuild). Floats are NaN where null;
    tokens masked; timestamps int64 microseconds since the Unix epoch."""

    run_id: int
    rank: int
    ts: np.ndarray
    step: np.ndarray
    duration: np.ndarray
    tokens: np.ma.MaskedArray
    loss: np.ndarray


@dataclass(frozen=True)
class GpuRows:
    """A host's GPU samples (one batch's, or all of them on a rebuild), as StepRows."""

    run_id: int
    host: str
    ts: np.ndarray
    gpu: np.ndarray
    temp: np.ndarray
    power: np.ndarray
    util: np.ndarray
    clock: np.ndarray
    throttle: np.ma.MaskedArray


# --- aggregation -------------------------------------------------------------------------------


class _Grouping:
    """Rows sorted by their group's key once, so that each column's per-group counts, sums and
    extremes are one ``reduceat`` over contiguous runs (several times faster than ``ufunc.at`` on
    the unsorted rows). The key is one or more columns, compared in order. A sum may differ from
    a sequential one in the last bits (numpy sums pairwise)."""

    def __init__(self, *keys: np.ndarray):
        n = len(keys[0])
        self.order = np.lexsort(keys[::-1])  # the last key given to lexsort sorts first; stable
        ordered = [key[self.order] for key in keys]
        new = np.zeros(n, dtype=bool)
        if n:
            new[0] = True
            for key in ordered:
                new[1:] |= key[1:] != key[:-1]
        self.starts = np.flatnonzero(new)
        self.keys = tuple(key[self.starts] for key in ordered)
        self.sizes = np.diff(np.append(self.starts, n))

    def reduce(self, ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        if not len(self.starts):  # reduceat cannot reduce nothing
            return np.empty(0, dtype=np.asarray(values).dtype)
        return ufunc.reduceat(values[self.order], self.starts)

    def count_and_sum(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group, the values that are not null (NaN) and their sum."""
        present = ~np.isnan(values)
        return (self.reduce(np.add, present.astype(np.int64)),
                self.reduce(np.add, np.where(present, values, 0.0)))

    def extreme(self, values: np.ndarray, which: str) -> np.ndarray:
        # fmax/fmin skip NaN (a null); a group of nulls only stays NaN, stored as NULL.
        return self.reduce(np.fmax if which == MAX else np.fmin, values)


def _owners(keys: list[tuple]) -> tuple[list[tuple], np.ndarray]:
    """The distinct keys sorted (so that groups come out in key order, and concurrent workers
    lock rows in one order) and each given key's index among them."""
    owners = sorted(set(keys))
    index = {owner: i for i, owner in enumerate(owners)}
    return owners, np.asarray([index[key] for key in keys], dtype=np.int64)


def _nullable(values: np.ndarray) -> list:
    return [None if v != v else v for v in values.tolist()]


def step_groups(rows: list[StepRows]) -> Groups:
    """StepMinute's rows for the given steps: per run, rank and minute the step ended in, all
    ranks at once (one sort for a whole drain rather than one per batch)."""
    rows = [r for r in rows if len(r.ts)]
    if not rows:
        return Groups({})
    owners, which = _owners([(r.run_id, r.rank) for r in rows])
    owner = np.repeat(which, [len(r.ts) for r in rows])
    ts = np.concatenate([r.ts for r in rows])
    by = _Grouping(owner, ts // MICROS_PER_MINUTE)
    duration = np.concatenate([r.duration for r in rows])
    loss = np.concatenate([r.loss for r in rows])
    tokens = np.concatenate([np.ma.filled(r.tokens, 0) for r in rows])
    duration_n, duration_sum = by.count_and_sum(duration)
    loss_n, loss_sum = by.count_and_sum(loss)
    keys = [owners[i] for i in by.keys[0].tolist()]
    return Groups({
        "run_id": [run for run, _ in keys], "rank": [rank for _, rank in keys],
        "minute": (by.keys[1] * 60).tolist(),
        "steps": by.sizes.tolist(),
        "last_step": by.reduce(np.maximum, np.concatenate([r.step for r in rows])).tolist(),
        "duration_n": duration_n.tolist(), "duration_sum": duration_sum.tolist(),
        "duration_max": _nullable(by.extreme(duration, MAX)),
        "tokens": by.reduce(np.add, tokens).tolist(),
        "loss_n": loss_n.tolist(), "loss_sum": loss_sum.tolist(),
    })


def gpu_groups(rows: list[GpuRows]) -> tuple[Groups, Groups]:
    """GpuMinute's and GpuHour's rows for the given samples: per run, host, GPU and minute (and
    hour), all hosts at once."""
    rows = [r for r in rows if len(r.ts)]
    if not rows:
        return Groups({}), Groups({})
    owners, which = _owners([(r.run_id, r.host) for r in rows])
    owner = np.repeat(which, [len(r.ts) for r in rows])
    ts = np.concatenate([r.ts for r in rows])
    by = _Grouping(owner, np.concatenate([r.gpu for r in rows]), ts // MICROS_PER_MINUTE)
    bits = np.concatenate([np.ma.filled(r.throttle, 0) for r in rows]).astype(np.int64)
    measured = {"temp": np.concatenate([r.temp for r in rows]),
                "power": np.concatenate([r.power for r in rows]),
                "util": np.concatenate([r.util for r in rows]),
                "clock": np.concatenate([r.clock for r in rows])}
    minutes: dict[str, np.ndarray] = {"samples": by.sizes}
    for name, values in measured.items():
        minutes[f"{name}_n"], minutes[f"{name}_sum"] = by.count_and_sum(values)
    for name, how in GPU_VALUES:  # temp_max, power_min, ...: of the measure the name starts with
        if how in (MAX, MIN):
            minutes[name] = by.extreme(measured[name.rsplit("_", 1)[0]], how)
    minutes["throttled"] = by.reduce(np.add, ((bits & THROTTLING_MASK) != 0).astype(np.int64))
    minutes["throttle_bits"] = by.reduce(np.bitwise_or, bits)
    owner_of, gpu, minute = by.keys
    minute = minute * 60
    # A GPU's minutes of one hour are contiguous (sorted by owner, GPU, minute): merged as
    # GPU_VALUES say into one row each.
    hour = minute - minute % 3600
    by_hour = _Grouping(owner_of, gpu, hour)
    ufuncs = {ADD: np.add, MAX: np.fmax, MIN: np.fmin, OR: np.bitwise_or}
    hours = {name: by_hour.reduce(ufuncs[how], minutes[name]) for name, how in GPU_VALUES}
    return (_gpu_rows(owners, owner_of, gpu, "minute", minute, minutes),
            _gpu_rows(owners, *by_hour.keys[:2], "hour", by_hour.keys[2], hours))


def _gpu_rows(owners: list[tuple], owner_of: np.ndarray, gpu: np.ndarray, when: str,
              at: np.ndarray, values: dict[str, np.ndarray]) -> Groups:
    keys = [owners[i] for i in owner_of.tolist()]
    columns = {"run_id": [run for run, _ in keys], "host": [host for _, host in keys],
               "gpu": gpu.tolist(), when: at.tolist()}
    for name, how in GPU_VALUES:
        columns[name] = _nullable(values[name]) if how in (MAX, MIN) else values[name].tolist()
    return Groups(columns)


# --- merging into the tables -------------------------------------------------------------------


def add(steps: list[StepRows], gpus: list[GpuRows]) -> None:
    """Merges the given rows' aggregates into StepMinute, GpuMinute and GpuHour, in the
    transaction that writes the rows, then recomputes the HostMinute, StepQuarter and
    ClusterMinute rows they touched. On PostgreSQL the upserts travel as one statement
    (data-modifying CTEs): one round trip however many batches and minutes."""
    step_minutes = step_groups(steps)
    gpu_minutes, gpu_hours = gpu_groups(gpus)
    upserts = [(STEP_TABLE, STEP_KEY, STEP_VALUES, {}, step_minutes),
               (GPU_TABLE, GPU_KEY, GPU_VALUES, {}, gpu_minutes),
               (HOUR_TABLE, HOUR_KEY, GPU_VALUES, {}, gpu_hours)]
    upserts = [upsert for upsert in upserts if len(upsert[-1])]
    if not upserts:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            statements = [_pg_upsert(*upsert) for upsert in upserts]
            sql = (statements[0][0] if len(statements) == 1 else
                   "WITH " + ", ".join(f"merged_{i} AS ({statement})"
                                       for i, (statement, _) in enumerate(statements))
                   + " SELECT 1")
            cursor.execute(sql, [param for _, params in statements for param in params])
        else:
            for upsert in upserts:
                _sqlite_upsert(cursor, *upsert)
    columns = gpu_minutes.columns
    if len(gpu_minutes):
        _derive_host_minutes(columns["run_id"], columns["host"], columns["minute"])
    if len(step_minutes):
        step = step_minutes.columns
        step_quarters.derive((run_id, rank, (minute,)) for run_id, rank, minute in
                             zip(step["run_id"], step["rank"], step["minute"], strict=True))
    if len(gpu_minutes):
        # Last: its row locks are the ones every worker storing the run's current minute waits
        # for, held from here to the commit.
        _derive_cluster_minutes(columns["run_id"], columns["minute"])


def _merge(table: str, column: str, how: str, postgres: bool) -> str:
    old, new = f"{table}.{column}", f"EXCLUDED.{column}"
    if how == ADD:
        return f"{column} = {old} + {new}"
    if how == OR:
        return f"{column} = {old} | {new}"
    # PostgreSQL's GREATEST/LEAST skip nulls; SQLite's scalar MAX()/MIN() return null on one.
    if postgres:
        return f"{column} = {'GREATEST' if how == MAX else 'LEAST'}({old}, {new})"
    return (f"{column} = {'MAX' if how == MAX else 'MIN'}(COALESCE({old}, {new}), "
            f"COALESCE({new}, {old}))")


def _conflict(table: str, key: tuple[str, ...], values: tuple[tuple[str, str], ...],
              postgres: bool) -> str:
    updates = ", ".join(_merge(table, name, how, postgres) for name, how in values)
    return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"


def _pg_upsert(table: str, key: tuple[str, ...], values: tuple[tuple[str, str], ...],
               constants: dict, groups: Groups) -> tuple[str, list]:
    """One INSERT ... SELECT FROM unnest(...) ON CONFLICT: the groups travel as one array per
    column, so the statement is the same whatever the batch's size. Keys arrive sorted
    (np.unique), so concurrent workers lock rows in the same order."""
    per_group = [name for name in key if name not in constants] + [name for name, _ in values]
    selected = ", ".join(["%s"] * len(constants) + [
        f"to_timestamp(u.{name})" if name in ("minute", "hour") else f"u.{name}"
        for name in per_group])
    arrays = ", ".join(f"%s::{_PG_TYPES.get(name, 'int8')}[]" for name in per_group)
    sql = (f"INSERT INTO {table} ({', '.join([*constants, *per_group])}) SELECT {selected} "
           f"FROM unnest({arrays}) AS u({', '.join(per_group)}) "
           f"{_conflict(table, key, values, postgres=True)}")
    return sql, [*constants.values(), *(_array_literal(groups.columns[name]) for name in per_group)]


def _array_literal(values: list) -> str:
    """A column of numbers (or strings) as PostgreSQL's array text ('{1,2.5,NULL}'), cast by the
    statement: one string to quote instead of a list adapted value by value (a sixth of a batch's
    CPU). A float's repr reads back as the same float8."""
    if values and None not in values and not isinstance(values[0], str):
        return "{" + ",".join(map(repr, values)) + "}"  # numbers without nulls: most columns
    return "{" + ",".join("NULL" if v is None else _quoted(v) if isinstance(v, str) else repr(v)
                          for v in values) + "}"


def _quoted(text: str) -> str:
    """An array element of text: double-quoted, with backslash and double quote escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sqlite_upsert(cursor, table: str, key: tuple[str, ...], values: tuple[tuple[str, str], ...],
                   constants: dict, groups: Groups) -> None:
    per_group = [name for name in key if name not in constants] + [name for name, _ in values]
    columns = [*constants, *per_group]
    rows = _sqlite_rows(constants, per_group, groups)
    conflict = _conflict(table, key, values, postgres=False)
    # Well under SQLite's 32,766 bound parameters per statement.
    chunk = max(1, 30_000 // len(columns))
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        placeholders = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(part))
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES {placeholders} {conflict}",
            [value for row in part for value in row],
        )


def _sqlite_rows(constants: dict, per_group: list[str], groups: Groups) -> list[tuple]:
    # Stored as Django stores a DateTimeField there, so the unique key matches the same minute.
    adapt = connection.ops.adapt_datetimefield_value
    columns = [
        [adapt(datetime.fromtimestamp(m, tz=UTC)) for m in groups.columns[name]]
        if name in ("minute", "hour") else groups.columns[name]
        for name in per_group
    ]
    return [(*constants.values(), *row) for row in zip(*columns, strict=True)]


# --- HostMinute, derived from GpuMinute; both rebuilt from it -------------------------------------
#
# HostMinute sums each GPU's mean, lowest and highest power of a minute: a GPU's minute split over
# two batches changes its mean, so the rows a batch touched are recomputed from GpuMinute (replace,
# not merge), exact however batches split minutes. GpuHour holds only sums, counts, extremes and
# bits, which merge exactly: ingest upserts it like GpuMinute (add). Rebuilds recompute both
# from GpuMinute (derive_coarse).

_HOST_SELECT = f"""
SELECT run_id, host, minute, count(*) FILTER (WHERE power_n > 0),
       coalesce(sum(samples) FILTER (WHERE power_n > 0), 0),
       coalesce(sum(power_sum / power_n) FILTER (WHERE power_n > 0), 0),
       coalesce(sum(power_min) FILTER (WHERE power_n > 0), 0),
       coalesce(sum(power_max) FILTER (WHERE power_n > 0), 0),
       sum(temp_n), sum(temp_sum)
FROM {GPU_TABLE} {{where}}
GROUP BY run_id, host, minute
"""
_HOST_COLUMNS = ("run_id", "host", "minute", "gpus", "power_samples", "power_mean_sum",
                 "power_min_sum", "power_max_sum", "temp_n", "temp_sum")
_HOUR_SELECT = f"""
SELECT run_id, host, gpu, date_trunc('hour', minute), sum(samples), sum(temp_n), sum(temp_sum),
       max(temp_max), sum(power_n), sum(power_sum), min(power_min), max(power_max), sum(util_n),
       sum(util_sum), sum(clock_n), sum(clock_sum), min(clock_min),
       coalesce(sum(throttled) FILTER (WHERE throttle_bits & {THROTTLING_MASK} <> 0), 0),
       bit_or(throttle_bits)
FROM {GPU_TABLE} {{where}}
GROUP BY run_id, host, gpu, date_trunc('hour', minute)
"""
_HOUR_COLUMNS = ("run_id", "host", "gpu", "hour", "samples", "temp_n", "temp_sum", "temp_max",
                 "power_n", "power_sum", "power_min", "power_max", "util_n", "util_sum",
                 "clock_n", "clock_sum", "clock_min", "throttled", "throttle_bits")


def _replace(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key)
    return (f"INSERT INTO {table} ({', '.join(columns)}) {{select}} "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}")


_HOST_UPSERT = _replace(HOST_TABLE, _HOST_COLUMNS, ("run_id", "host", "minute"))
_HOUR_UPSERT = _replace(HOUR_TABLE, _HOUR_COLUMNS, ("run_id", "host", "gpu", "hour"))

# HostMinute rows of the (run, host, minute)s given, recomputed from GpuMinute as the upsert (an
# earlier statement of the same transaction) left it: a lookup by the unique index's (run, minute,
# host) prefix per touched minute. Rows are written in key order, so concurrent workers lock them
# in one order.
_PG_HOST_DERIVE = _HOST_UPSERT.format(select=_HOST_SELECT.format(where=
    "g JOIN unnest(%(runs)s::int8[], %(hosts)s::text[], %(minutes)s::int8[]) AS t(r, h, m) "
    "ON g.run_id = t.r AND g.minute = to_timestamp(t.m) AND g.host = t.h").replace(
    "SELECT run_id, host, minute,", "SELECT g.run_id, g.host, g.minute,").replace(
    "GROUP BY run_id, host, minute", "GROUP BY g.run_id, g.host, g.minute "
    "ORDER BY g.run_id, g.host, g.minute"))


def _derive_host_minutes(runs: list[int], hosts: list[str], minutes: list[int]) -> None:
    """Recomputes the HostMinute rows of the (run, host, minute Unix seconds) given, from
    GpuMinute."""
    touched = sorted(set(zip(runs, hosts, minutes, strict=True)))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_PG_HOST_DERIVE, {
                "runs": _array_literal([r for r, _, _ in touched]),
                "hosts": _array_literal([h for _, h, _ in touched]),
                "minutes": _array_literal([m for _, _, m in touched])})
        return
    by_host: dict[tuple[int, str], list[int]] = {}
    for run_id, host, minute in touched:
        by_host.setdefault((run_id, host), []).append(minute)
    for (run_id, host), host_minutes in by_host.items():
        _derive_portably(run_id, host, host_minutes)


def _derive_portably(run_id: int, host: str, minutes: list[int]) -> None:
    """SQLite (the embedded mode): the same aggregates computed in Python from the touched
    GpuMinute rows, written with update_or_create (a few rows per batch)."""
    from collectors.models import GpuMinute, HostMinute

    rows = GpuMinute.objects.filter(
        run_id=run_id, host=host, minute__in=[datetime.fromtimestamp(m, tz=UTC) for m in minutes])
    for minute, values in _host_totals(rows).items():
        HostMinute.objects.update_or_create(run_id=run_id, host=host, minute=minute,
                                            defaults=values)


# --- ClusterMinute, derived from HostMinute ---------------------------------------------------------
#
# A run-minute's row sums every host's HostMinute row of that minute, so unlike HostMinute (one
# host's batches, normally one worker) it is written by every worker storing that minute at once.
# Recomputing it from HostMinute within the batch's statement snapshot would miss hosts stored by
# transactions still open, and the last to commit would overwrite the row without them. So the
# touched rows are first created if missing and locked (one statement, in key order, so workers
# cannot deadlock over them), and only then summed, in a later statement: under READ COMMITTED
# its snapshot is taken after the lock was granted, so it sees every transaction that held the
# lock before, and every transaction that writes a host's minute later takes the lock after
# this one commits and sums again. Whoever sums last has seen every host.

_CLUSTER_COLUMNS = ("run_id", "minute", "gpus", "power_samples", "power_mean_sum",
                    "power_min_sum", "power_max_sum", "temp_n", "temp_sum")
_CLUSTER_SELECT = f"""
SELECT run_id, minute, sum(gpus), sum(power_samples), sum(power_mean_sum), sum(power_min_sum),
       sum(power_max_sum), sum(temp_n), sum(temp_sum)
FROM {HOST_TABLE} {{where}}
GROUP BY run_id, minute
"""
_CLUSTER_UPSERT = _replace(CLUSTER_TABLE, _CLUSTER_COLUMNS, ("run_id", "minute"))
# Inserts the rows that are missing and locks them all: DO UPDATE (of nothing that changes) takes
# the row lock whether the row was there, or inserted meanwhile by a transaction that committed.
_PG_CLUSTER_LOCK = f"""
INSERT INTO {CLUSTER_TABLE} ({", ".join(_CLUSTER_COLUMNS)})
SELECT r, to_timestamp(m), 0, 0, 0, 0, 0, 0, 0
FROM unnest(%(runs)s::int8[], %(minutes)s::int8[]) AS t(r, m)
ORDER BY r, m
ON CONFLICT (run_id, minute) DO UPDATE SET gpus = {CLUSTER_TABLE}.gpus
"""
# The locked rows' sums, from HostMinute as committed now (and this transaction's own rows): a
# lookup by the unique index's (run, minute) prefix per touched minute.
_PG_CLUSTER_SUM = f"""
UPDATE {CLUSTER_TABLE} c
SET gpus = s.gpus, power_samples = s.power_samples, power_mean_sum = s.power_mean_sum,
    power_min_sum = s.power_min_sum, power_max_sum = s.power_max_sum, temp_n = s.temp_n,
    temp_sum = s.temp_sum
FROM (SELECT h.run_id, h.minute, sum(h.gpus) AS gpus, sum(h.power_samples) AS power_samples,
             sum(h.power_mean_sum) AS power_mean_sum, sum(h.power_min_sum) AS power_min_sum,
             sum(h.power_max_sum) AS power_max_sum, sum(h.temp_n) AS temp_n,
             sum(h.temp_sum) AS temp_sum
      FROM {HOST_TABLE} h
      JOIN unnest(%(runs)s::int8[], %(minutes)s::int8[]) AS t(r, m)
        ON h.run_id = t.r AND h.minute = to_timestamp(t.m)
      GROUP BY h.run_id, h.minute) s
WHERE c.run_id = s.run_id AND c.minute = s.minute
"""


def _derive_cluster_minutes(runs: list[int], minutes: list[int]) -> None:
    """Recomputes the ClusterMinute rows of the (run, minute Unix seconds) given, from
    HostMinute, after locking them (see above)."""
    touched = sorted(set(zip(runs, minutes, strict=True)))
    if connection.vendor == "postgresql":
        params = {"runs": _array_literal([r for r, _ in touched]),
                  "minutes": _array_literal([m for _, m in touched])}
        with connection.cursor() as cursor:
            cursor.execute(_PG_CLUSTER_LOCK, params)
            cursor.execute(_PG_CLUSTER_SUM, params)
        return
    # SQLite (the embedded mode) has one writer at a time: no lock to take.
    from collectors.models import ClusterMinute, HostMinute

    for run_id, minute in touched:
        when = datetime.fromtimestamp(minute, tz=UTC)
        ClusterMinute.objects.update_or_create(
            run_id=run_id, minute=when,
            defaults=_cluster_totals(HostMinute.objects.filter(run_id=run_id, minute=when)))


def _cluster_totals(rows) -> dict:
    names = ("gpus", "power_samples", "power_mean_sum", "power_min_sum", "power_max_sum",
             "temp_n", "temp_sum")
    totals = dict.fromkeys(names, 0)
    for h in rows:
        for name in names:
            totals[name] += getattr(h, name)
    return totals


def _host_totals(rows) -> dict:
    totals: dict = {}
    for m in rows:
        t = totals.setdefault(m.minute, {"gpus": 0, "power_samples": 0, "power_mean_sum": 0.0,
                                         "power_min_sum": 0.0, "power_max_sum": 0.0,
                                         "temp_n": 0, "temp_sum": 0.0})
        if m.power_n > 0:
            t["gpus"] += 1
            t["power_samples"] += m.samples
            t["power_mean_sum"] += m.power_sum / m.power_n
            t["power_min_sum"] += m.power_min
            t["power_max_sum"] += m.power_max
        t["temp_n"] += m.temp_n
        t["temp_sum"] += m.temp_sum
    return totals


def _hour_totals(rows) -> dict:
    totals: dict = {}
    for m in rows:
        hour = m.minute.replace(minute=0, second=0, microsecond=0)
        t = totals.setdefault((m.gpu, hour), {
            "samples": 0, "temp_n": 0, "temp_sum": 0.0, "temp_max": None, "power_n": 0,
            "power_sum": 0.0, "power_min": None, "power_max": None, "util_n": 0,
            "util_sum": 0.0, "clock_n": 0, "clock_sum": 0.0, "clock_min": None,
            "throttled": 0, "throttle_bits": 0})
        for name in ("samples", "temp_n", "temp_sum", "power_n", "power_sum", "util_n",
                     "util_sum", "clock_n", "clock_sum"):
            t[name] += getattr(m, name)
        for name, pick in (("temp_max", max), ("power_min", min), ("power_max", max),
                           ("clock_min", min)):
            value = getattr(m, name)
            if value is not None:
                t[name] = value if t[name] is None else pick(t[name], value)
        if m.throttle_bits & THROTTLING_MASK:
            t["throttled"] += m.throttled
        t["throttle_bits"] |= m.throttle_bits
    return totals


@transaction.atomic
def derive_coarse(run_id: int | None = None) -> None:
    """Rebuilds HostMinute and GpuHour of one run (or of every run) from GpuMinute as it stands,
    then ClusterMinute from HostMinute: for rollups filled without ingest (a rebuild, GpuMinute
    rows written directly)."""
    from collectors.models import ClusterMinute, GpuHour, GpuMinute, HostMinute

    for coarse in (HostMinute, GpuHour, ClusterMinute):
        stale = coarse.objects.all()
        (stale if run_id is None else stale.filter(run_id=run_id)).delete()
    if connection.vendor == "postgresql":
        where, params = ("WHERE run_id = %s", [run_id]) if run_id is not None else ("", [])
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL TimeZone = 'UTC'")
            for upsert, select in ((_HOST_UPSERT, _HOST_SELECT), (_HOUR_UPSERT, _HOUR_SELECT),
                                   (_CLUSTER_UPSERT, _CLUSTER_SELECT)):
                cursor.execute(upsert.format(select=select.format(where=where)), params)
        return
    minutes = GpuMinute.objects.all() if run_id is None else GpuMinute.objects.filter(run_id=run_id)
    for run, host in minutes.values_list("run_id", "host").distinct():
        rows = list(minutes.filter(run_id=run, host=host))
        HostMinute.objects.bulk_create(
            HostMinute(run_id=run, host=host, minute=minute, **values)
            for minute, values in _host_totals(rows).items())
        GpuHour.objects.bulk_create(
            GpuHour(run_id=run, host=host, gpu=gpu, hour=hour, **values)
            for (gpu, hour), values in _hour_totals(rows).items())
    hosts = HostMinute.objects.all() if run_id is None else HostMinute.objects.filter(run_id=run_id)
    for run, minute in hosts.values_list("run_id", "minute").distinct():
        ClusterMinute.objects.create(run_id=run, minute=minute, **_cluster_totals(
            hosts.filter(run_id=run, minute=minute)))


# --- rebuilding from the raw tables ------------------------------------------------------------

_STEP_REBUILD = f"""
INSERT INTO {STEP_TABLE} (run_id, rank, minute, steps, last_step, duration_n, duration_sum,
                          duration_max, tokens, loss_n, loss_sum)
SELECT run_id, rank, date_trunc('minute', ts), count(*), max(step), count(duration_s),
       coalesce(sum(duration_s), 0), max(duration_s), coalesce(sum(tokens), 0)::bigint,
       count(loss), coalesce(sum(loss), 0)
FROM collectors_stepmetric {{where}}
GROUP BY run_id, rank, date_trunc('minute', ts)
"""
_GPU_REBUILD = f"""
INSERT INTO {GPU_TABLE} (run_id, host, gpu, minute, samples, temp_n, temp_sum, temp_max, power_n,
                         power_sum, power_min, power_max, util_n, util_sum, clock_n, clock_sum,
                         clock_min, throttled, throttle_bits)
SELECT run_id, host, gpu, date_trunc('minute', ts), count(*), count(temp_c),
       coalesce(sum(temp_c), 0), max(temp_c), count(power_w), coalesce(sum(power_w), 0),
       min(power_w), max(power_w), count(util_pct), coalesce(sum(util_pct), 0),
       count(sm_clock_mhz), coalesce(sum(sm_clock_mhz), 0), min(sm_clock_mhz),
       count(*) FILTER (WHERE throttle & {THROTTLING_MASK} <> 0), coalesce(bit_or(throttle), 0)
FROM collectors_gpusample {{where}}
GROUP BY run_id, host, gpu, date_trunc('minute', ts)
"""


@transaction.atomic
def rebuild(run_id: int | None = None) -> dict[str, int]:
    """Recomputes the rollups of one run (or of every run) from the raw rows; returns how many
    rollup rows each table now holds for it."""
    from collectors.models import (
        ClusterMinute,
        GpuHour,
        GpuMinute,
        HostMinute,
        StepMinute,
        StepQuarter,
    )

    if connection.vendor == "postgresql":
        where, params = ("WHERE run_id = %s", [run_id]) if run_id is not None else ("", [])
        with connection.cursor() as cursor:
            # Waits for ingest transactions that already merged into the rollups to commit (their
            # raw rows are then in the SELECT below) and holds later ones back until this commits
            # (their raw rows are not): every batch is counted once.
            cursor.execute(f"LOCK TABLE {STEP_TABLE}, {GPU_TABLE} IN SHARE ROW EXCLUSIVE MODE")
            # Minutes of UTC whatever the session says (date_trunc of a timestamptz follows the
            # session's zone; the three-argument form costs ~40% more per row), and room for the
            # hash aggregation of many minutes in memory rather than in batches on disk.
            cursor.execute("SET LOCAL TimeZone = 'UTC'")
            cursor.execute("SET LOCAL work_mem = '256MB'")
            cursor.execute(f"LOCK TABLE {HOST_TABLE}, {HOUR_TABLE}, {CLUSTER_TABLE}, "
                           f"{step_quarters.TABLE} IN SHARE ROW EXCLUSIVE MODE")
            for table, insert in ((STEP_TABLE, _STEP_REBUILD), (GPU_TABLE, _GPU_REBUILD)):
                cursor.execute(f"DELETE FROM {table} {where}", params)
                cursor.execute(insert.format(where=where), params)
    else:
        _rebuild_portably(run_id)
    derive_coarse(run_id)
    step_quarters.rebuild(run_id)
    counts = {}
    for name, model in (("step_minutes", StepMinute), ("gpu_minutes", GpuMinute),
                        ("host_minutes", HostMinute), ("gpu_hours", GpuHour),
                        ("cluster_minutes", ClusterMinute), ("step_quarters", StepQuarter)):
        rows = model.objects.all()
        counts[name] = (rows if run_id is None else rows.filter(run_id=run_id)).count()
    return counts


def _rebuild_portably(run_id: int | None) -> None:
    """The embedded mode's rebuild (SQLite has no date_trunc or bit_or): the raw rows through the
    same aggregation and upsert as ingest, one run and rank (or host) at a time."""
    from collectors.columns import ints
    from collectors.models import (
        ClusterMinute,
        GpuHour,
        GpuMinute,
        GpuSample,
        HostMinute,
        StepMetric,
        StepMinute,
    )

    steps, gpus = StepMetric.objects.all(), GpuSample.objects.all()
    if run_id is not None:
        steps, gpus = steps.filter(run_id=run_id), gpus.filter(run_id=run_id)
    for rollup in (StepMinute, GpuMinute, HostMinute, GpuHour, ClusterMinute):
        stale = rollup.objects.all()
        (stale if run_id is None else stale.filter(run_id=run_id)).delete()

    for run, rank in steps.values_list("run_id", "rank").distinct():
        rows = list(steps.filter(run_id=run, rank=rank).values_list(
            "ts", "step", "duration_s", "tokens", "loss"))
        ts, step, duration, tokens, loss = zip(*rows, strict=True)
        add([StepRows(run, rank, _micros(ts), np.asarray(step, dtype=np.int64), _floats(duration),
                      ints(list(tokens), len(rows)), _floats(loss))], [])
    for run, host in gpus.values_list("run_id", "host").distinct():
        rows = list(gpus.filter(run_id=run, host=host).values_list(
            "ts", "gpu", "temp_c", "power_w", "util_pct", "sm_clock_mhz", "throttle"))
        ts, gpu, temp, power, util, clock, throttle = zip(*rows, strict=True)
        add([], [GpuRows(run, host, _micros(ts), np.asarray(gpu, dtype=np.int64), _floats(temp),
                         _floats(power), _floats(util), _floats(clock),
                         ints(list(throttle), len(rows)))])


def _micros(stamps) -> np.ndarray:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return np.asarray([(t - epoch) // timedelta(microseconds=1) for t in stamps], dtype=np.int64)


def _floats(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)
