"""The reads behind a run's Power and GPU health pages: per-minute rollups for whole runs, raw GPU
samples only for bounded windows, and the happenings (checkpoints, interruptions, restarts, step
gaps) that explain a power swing. Rows in, arrays and facts out; collectors.analysis.power and
.gpu_health say what they mean.

Raw GPU samples are the largest table (a 512-GPU run at 1 Hz writes 44 M rows a day), so nothing
here reads them for more than the window it is given, along the (run, ts) index. On PostgreSQL the
reads are plain SQL returning epoch floats (no datetime objects per row); elsewhere (the embedded
mode's SQLite) they go through the ORM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import psycopg
from django.db import connection, transaction
from django.db.models import Max, Min

from collectors.analysis import gpu_health, power
from collectors.analysis.power import Happening
from collectors.models import (
    Attempt,
    Checkpoint,
    ClusterMinute,
    Event,
    GpuHour,
    GpuMinute,
    GpuSample,
    HostMinute,
    Interruption,
    Run,
    StepMetric,
)
from collectors.timestamps import from_epoch


@dataclass(frozen=True)
class RawPower:
    """Raw power samples of a window: Unix seconds, an integer id per (host, gpu), watts."""

    ts: np.ndarray
    gpu: np.ndarray
    power_w: np.ndarray


def raw_power(run: Run, start: float, end: float) -> RawPower:
    """Every power sample of the run with start <= ts <= end."""
    return raw_power_windows(run, [(start, end)])[0]


def raw_power_windows(run: Run, windows: Sequence[tuple[float, float]]) -> list[RawPower]:
    """For each (start, end) of ``windows``, every power sample of the run with
    start <= ts <= end (a sample in two windows is in both)."""
    if not windows:
        return []
    if connection.vendor == "postgresql":
        packed = _raw_power_packed(run, windows)
        if packed is not None:
            return packed
    return [_raw_power_portable(run, start, end) for start, end in windows]


def _raw_power_portable(run: Run, start: float, end: float) -> RawPower:
    rows = list(GpuSample.objects.filter(run=run, ts__gte=from_epoch(start), ts__lte=from_epoch(end),
                                         power_w__isnull=False)
                .values_list("ts", "host", "gpu", "power_w"))
    hosts: dict[str, int] = {}
    return RawPower(
        np.array([r[0].timestamp() for r in rows], dtype=np.float64),
        np.array([hosts.setdefault(r[1], len(hosts)) * 65_536 + r[2] for r in rows],
                 dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.float64))


# Each window's samples come back as one row of three bytea values of packed big-endian numbers
# (one aggregate pass, so the three are in the same row order), read straight into numpy: a row
# at a time through the driver costs seconds for a few hundred thousand rows. All windows in one
# statement, each an index range scan of (run, ts) aggregated on its own (LATERAL: no hashing of
# rows into windows): a statement per window planned over the day partitions each time. A (host,
# gpu) pair becomes hashtext(host) * 65536 + gpu: numbering hosts with a window function or a join
# costs several times the scan itself (and grouping by host instead of by window, 1.6x the
# statement); two hosts with one hash (odds ~ hosts² / 2^33) are detected on the windows'
# HostMinute rows and read the slow, exact way instead. Times travel in PostgreSQL's own binary
# form (int8 microseconds since 2000-01-01): extract(epoch) computes a numeric per row and took
# half of the query.
_RAW_SQL = """
SELECT w.i, packed.*
FROM unnest(%(starts)s::timestamptz[], %(ends)s::timestamptz[]) WITH ORDINALITY AS w(s, e, i),
     LATERAL (SELECT string_agg(timestamptz_send(g.ts), ''::bytea),
                     string_agg(int8send(hashtext(g.host)::int8 * 65536 + g.gpu), ''::bytea),
                     string_agg(float8send(g.power_w), ''::bytea)
              FROM {table} g
              WHERE g.run_id = %(run)s AND g.ts >= w.s AND g.ts <= w.e
                AND g.power_w IS NOT NULL) packed
ORDER BY w.i
"""
_HASHES_SQL = """
SELECT count(DISTINCT h.host), count(DISTINCT hashtext(h.host))
FROM unnest(%(starts)s::timestamptz[], %(ends)s::timestamptz[]) AS w(s, e)
JOIN {table} h ON h.run_id = %(run)s AND h.minute >= date_trunc('minute', w.s) AND h.minute <= w.e
"""


_PG_EPOCH_MICROS = 946_684_800 * 1_000_000  # 2000-01-01 in Unix microseconds


def _binary_rows(sql: str, params: dict) -> list[tuple]:
    """The rows of ``sql`` with results in PostgreSQL's binary format, on Django's connection:
    a bytea arrives as its bytes instead of hex text twice its size, encoded by the server and
    decoded here (Django's cursors bind parameters client-side, which allows text results only).
    The Power page's raw windows are ~7 MB: 179 -> 153 ms median on the 20M-sample bench run.
    Not in Django's query log."""
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, binary=True)
        return cursor.fetchall()


def _raw_power_packed(run: Run, windows: Sequence[tuple[float, float]]) -> list[RawPower] | None:
    params = {"run": run.pk, "starts": [from_epoch(start) for start, _ in windows],
              "ends": [from_epoch(end) for _, end in windows]}
    with connection.cursor() as cursor:
        cursor.execute(_HASHES_SQL.format(table=HostMinute._meta.db_table), params)
        hosts, hashes = cursor.fetchone()
        if hosts != hashes:
            return None
    rows = _binary_rows(_RAW_SQL.format(table=GpuSample._meta.db_table), params)
    read = []
    for _, ts, key, watts in rows:
        if ts is None:  # no sample in the window
            read.append(RawPower(np.empty(0), np.empty(0, dtype=np.int64), np.empty(0)))
            continue
        micros = np.frombuffer(bytes(ts), ">i8").astype(np.int64) + _PG_EPOCH_MICROS
        read.append(RawPower(micros / 1e6,
                             np.frombuffer(bytes(key), ">i8").astype(np.int64),
                             np.frombuffer(bytes(watts), ">f8").astype(np.float64)))
    return read


@dataclass(frozen=True)
class MinuteRows:
    minutes: power.MinutePower
    samples: np.ndarray  # raw samples per minute (all GPUs)


# ClusterMinute already sums every host's GPUs (Σ of each GPU's mean, min, max power; GPUs with a
# power sample and their samples): one row per minute, read along its (run, minute) index. Summing
# HostMinute per minute instead read 417k rows for 64 hosts over 4.6 days (150-200 ms).
_MINUTES_SQL = """
SELECT string_agg(float8send(extract(epoch FROM minute)::float8) || float8send(power_mean_sum)
                  || float8send(power_max_sum) || float8send(power_min_sum)
                  || float8send(gpus::float8) || float8send(power_samples::float8),
                  ''::bytea ORDER BY minute)
FROM {table}
WHERE run_id = %(run)s AND gpus > 0
"""


def minute_power(run: Run) -> MinuteRows:
    """The run's cluster power per minute from ClusterMinute (mean, upper and lower bound,
    GPUs)."""
    if connection.vendor == "postgresql":
        # Packed as six float8 per minute, read by numpy (a tuple per row: ~6.5k of them cost
        # 15-30 ms on the 20M-sample bench run).
        ((packed,),) = _binary_rows(_MINUTES_SQL.format(table=ClusterMinute._meta.db_table),
                                    {"run": run.pk})
        rows = np.frombuffer(packed or b"", ">f8").astype(np.float64).reshape(-1, 6)
    else:
        rows = [(m.timestamp(), *rest) for m, *rest in
                ClusterMinute.objects.filter(run=run, gpus__gt=0).order_by("minute")
                .values_list("minute", "power_mean_sum", "power_max_sum", "power_min_sum",
                             "gpus", "power_samples")]
    if not len(rows):
        return MinuteRows(power.minute_power([], [], [], [], []), np.empty(0, dtype=np.int64))
    minute, mean, upper, lower, gpus, samples = np.asarray(rows, dtype=np.float64).T
    minutes = power.minute_power(minute, mean / 1000, upper / 1000, lower / 1000,
                                 gpus.astype(np.int64))
    per_minute = np.zeros(len(minutes.series), dtype=np.int64)
    per_minute[np.round((minute - minutes.series.start) / 60).astype(np.int64)] = samples
    return MinuteRows(minutes, per_minute)


def happenings(run: Run, start: float, end: float) -> list[Happening]:
    """Checkpoints (saves and loads merged over ranks, their blocking span), interruptions (from
    the attempt's last step to the report), attempt starts (to the attempt's first step) within
    [start, end]."""
    lo, hi = from_epoch(start), from_epoch(end)
    found: list[Happening] = []
    saves = (Checkpoint.objects.filter(run=run, ts__gte=lo, ts__lte=hi).order_by()
             .values("attempt__number", "kind", "step")
             .annotate(first=Min("ts"), last=Max("ts"), longest=Max("duration_s")))
    for c in saves:
        began = c["first"].timestamp() - (c["longest"] or 0.0)
        what = "save" if c["kind"] == Checkpoint.Kind.SAVE else "load"
        step = f" of step {c['step']}" if c["step"] is not None else ""
        found.append(Happening("checkpoint", began, c["last"].timestamp(), f"checkpoint {what}{step}"))
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    # Each step lookup below is bounded by its attempt's time span (from its start to the next
    # attempt's): the steps table is partitioned by day, and an unbounded "first step of attempt
    # N after t" reads every later partition to its end for rows of N that are not there
    # (0.4 s a lookup on a 512-GPU, 3-day run).
    until_next = {a.pk: (b.started_at if b is not None else None)
                  for a, b in zip(attempts, [*attempts[1:], None], strict=True)}
    interruptions = list(Interruption.objects.filter(run=run, ts__gte=lo, ts__lte=hi)
                         .select_related("attempt"))
    restarts = [a for a in attempts if a.started_at is not None and lo <= a.started_at <= hi]
    # The GPUs stopped computing at the attempt's last step, not at the report (a watchdog may
    # take minutes to notice): an interruption's happening spans both. A restart's lasts until
    # the attempt's first step.
    lookups = [StepLookup(i.attempt_id, i.attempt.started_at
                          if i.attempt.started_at is not None and i.attempt.started_at <= i.ts
                          else None, i.ts, newest=True) for i in interruptions]
    lookups += [StepLookup(a.pk, a.started_at, until_next[a.pk]
                           if until_next[a.pk] is not None and until_next[a.pk] >= a.started_at
                           else None, newest=False) for a in restarts]
    steps = step_times(run, lookups)
    for i, last_step in zip(interruptions, steps[:len(interruptions)], strict=True):
        began = min(last_step, i.ts).timestamp() if last_step else i.ts.timestamp()
        found.append(Happening("interruption", began, i.ts.timestamp(),
                               f"{i.effective_category} ({i.source}), attempt {i.attempt.number}"))
    for a, first_step in zip(restarts, steps[len(interruptions):], strict=True):
        until = first_step.timestamp() if first_step else a.started_at.timestamp()
        found.append(Happening("restart", a.started_at.timestamp(), until,
                               f"attempt {a.number} started"))
    return found


@dataclass(frozen=True)
class StepLookup:
    """The newest (or oldest) step row of an attempt with lo <= ts <= hi (None: unbounded)."""

    attempt_id: int
    lo: datetime | None
    hi: datetime | None
    newest: bool


# Every lookup in one statement, each two index probes of (run, ts) at most: as an ORM query
# each, the Power page's 11 (5 interruptions, 6 restarts on the bench run) cost ~2 ms apiece in
# compilation and round trips.
_STEP_TIMES_SQL = """
SELECT CASE WHEN p.newest
    THEN (SELECT s.ts FROM {table} s
          WHERE s.run_id = %(run)s AND s.attempt_id = p.a
            AND s.ts >= coalesce(p.lo, '-infinity') AND s.ts <= coalesce(p.hi, 'infinity')
          ORDER BY s.ts DESC LIMIT 1)
    ELSE (SELECT s.ts FROM {table} s
          WHERE s.run_id = %(run)s AND s.attempt_id = p.a
            AND s.ts >= coalesce(p.lo, '-infinity') AND s.ts <= coalesce(p.hi, 'infinity')
          ORDER BY s.ts LIMIT 1) END
FROM unnest(%(attempts)s::int8[], %(lows)s::timestamptz[], %(highs)s::timestamptz[],
            %(newest)s::bool[]) WITH ORDINALITY AS p(a, lo, hi, newest, i)
ORDER BY p.i
"""


def step_times(run: Run, lookups: Sequence[StepLookup]) -> list[datetime | None]:
    """For each lookup, the time of the newest (or oldest) step row it asks for, or None."""
    if not lookups:
        return []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_STEP_TIMES_SQL.format(table=StepMetric._meta.db_table), {
                "run": run.pk, "attempts": [q.attempt_id for q in lookups],
                "lows": [q.lo for q in lookups], "highs": [q.hi for q in lookups],
                "newest": [q.newest for q in lookups]})
            return [ts for (ts,) in cursor.fetchall()]
    found = []
    for q in lookups:
        steps = StepMetric.objects.filter(run=run, attempt_id=q.attempt_id)
        if q.lo is not None:
            steps = steps.filter(ts__gte=q.lo)
        if q.hi is not None:
            steps = steps.filter(ts__lte=q.hi)
        found.append(steps.order_by("-ts" if q.newest else "ts").values_list("ts", flat=True)
                     .first())
    return found


def stalls(run: Run, probes: Sequence[float], min_gap_s: float,
           explained_by: Sequence[Happening]) -> list[Happening]:
    """For each time in ``probes`` (a swing's ends), the gap between the last step any rank
    completed before it and the first after, less what ``explained_by`` covers, when at least
    ``min_gap_s`` remains. Two index lookups per probe: no range of steps is read."""
    gaps = set()
    for before, after in _steps_around(run, probes):
        if before is not None and after is not None:
            gaps.add((before.timestamp(), after.timestamp()))
    return power.stall_happenings([g for g in sorted(gaps) if g[1] - g[0] > min_gap_s],
                                  explained_by, min_gap_s)


# The same two lookups per probe in one statement: as a query each, the round trips and the ORM
# were ~140 ms of the 512-GPU Power page (48 probes).
_AROUND_SQL = """
SELECT (SELECT ts FROM {table} WHERE run_id = %(run)s AND ts <= p.t ORDER BY ts DESC LIMIT 1),
       (SELECT ts FROM {table} WHERE run_id = %(run)s AND ts >= p.t ORDER BY ts LIMIT 1)
FROM unnest(%(probes)s::timestamptz[]) WITH ORDINALITY AS p(t, i)
ORDER BY p.i
"""


def _steps_around(run: Run, probes: Sequence[float]) -> list[tuple]:
    """For each probe, the newest step row's time at or before it and the oldest at or after."""
    whens = [from_epoch(probe) for probe in probes]
    if connection.vendor == "postgresql":
        if not whens:
            return []
        with connection.cursor() as cursor:
            cursor.execute(_AROUND_SQL.format(table=StepMetric._meta.db_table),
                           {"run": run.pk, "probes": whens})
            return cursor.fetchall()
    steps = StepMetric.objects.filter(run=run)
    return [(steps.filter(ts__lte=when).order_by("-ts").values_list("ts", flat=True).first(),
             steps.filter(ts__gte=when).order_by("ts").values_list("ts", flat=True).first())
            for when in whens]


def median_step_s(run: Run) -> float | None:
    """The run's median step duration over its newest 2,000 step rows (cheap, along the index)."""
    durations = sorted(
        d for d in StepMetric.objects.filter(run=run, duration_s__isnull=False)
        .order_by("-ts").values_list("duration_s", flat=True)[:2000])
    return durations[len(durations) // 2] if durations else None


# --- GPU health ---------------------------------------------------------------------------------

_CELLS_SQL = """
SELECT host, gpu, extract(epoch FROM date_bin(%(bucket)s * interval '1 second', minute,
                                             timestamptz 'epoch'))::float8 AS bucket,
       sum(samples), sum(temp_n), sum(temp_sum), max(temp_max), sum(power_n), sum(power_sum),
       max(power_max), sum(throttled) FILTER (WHERE throttle_bits & %(mask)s != 0),
       bit_or(throttle_bits)
FROM {table}
WHERE run_id = %(run)s
GROUP BY host, gpu, 3
"""
#: The whole-run aggregations group a few million rollup rows into tens of thousands of groups:
#: with the default 4 MB they sort on disk (measured: 8 s instead of 3 s for 512 GPUs x 3 days).
_WORK_MEM = "SET LOCAL work_mem = '64MB'"


def gpu_span(run: Run) -> tuple[float, float] | None:
    # HostMinute has a row wherever GpuMinute has one, an eighth as many.
    found = HostMinute.objects.filter(run=run).aggregate(first=Min("minute"), last=Max("minute"))
    if found["first"] is None:
        return None
    return found["first"].timestamp(), found["last"].timestamp() + 60.0


def _hourly(bucket_s: int) -> bool:
    """Whether buckets of ``bucket_s`` are whole hours (date_bin from the epoch: each one is a
    union of UTC hours), so GpuHour, a sixtieth of GpuMinute's rows, answers them exactly."""
    return bucket_s >= 3600 and bucket_s % 3600 == 0


def gpu_cells(run: Run, bucket_s: int) -> list[gpu_health.GpuCell]:
    """GpuMinute (or GpuHour, for buckets of whole hours) re-aggregated per (host, gpu, bucket of
    ``bucket_s`` seconds); ``throttled`` counts only minutes whose bits include a throttling
    reason (analysis.gpu_health)."""
    if connection.vendor == "postgresql":
        if _hourly(bucket_s):
            sql = _CELLS_SQL.replace("minute", "hour").format(table=GpuHour._meta.db_table)
        else:
            sql = _CELLS_SQL.format(table=GpuMinute._meta.db_table)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_WORK_MEM)
            cursor.execute(sql,
                           {"run": run.pk, "bucket": bucket_s, "mask": gpu_health.THROTTLING_MASK})
            return _cells(cursor.fetchall())
    return _gpu_cells_portable(run, bucket_s)


# One pass over the rollup for GPU health: per GPU, its buckets' mean temperature and power packed
# as float8 triples (NaN where the bucket has no sample of it), and its totals over the run
# summed from the same buckets. The heatmap's 30k cells come back as 512 rows instead of 30k
# Python objects.
_HEALTH_SQL = """
SELECT host, gpu, string_agg(float8send(bucket) || float8send(coalesce(temp_sum / nullif(temp_n, 0),
                                                                       'NaN'))
                             || float8send(coalesce(power_sum / nullif(power_n, 0), 'NaN')),
                             ''::bytea),
       sum(samples), sum(temp_n), sum(temp_sum), max(temp_max), sum(power_n), sum(power_sum),
       max(power_max), sum(throttled), bit_or(bits)
FROM (SELECT host, gpu, extract(epoch FROM date_bin(%(bucket)s * interval '1 second', minute,
                                                    timestamptz 'epoch'))::float8 AS bucket,
             sum(samples) AS samples, sum(temp_n) AS temp_n, sum(temp_sum) AS temp_sum,
             max(temp_max) AS temp_max, sum(power_n) AS power_n, sum(power_sum) AS power_sum,
             max(power_max) AS power_max,
             sum(throttled) FILTER (WHERE throttle_bits & %(mask)s != 0) AS throttled,
             bit_or(throttle_bits) AS bits
      FROM {table}
      WHERE run_id = %(run)s
      GROUP BY host, gpu, 3) cells
GROUP BY host, gpu
"""


def gpu_health_rows(run: Run, bucket_s: int
                    ) -> tuple[dict[tuple[str, int], gpu_health.GpuMeans], list[gpu_health.GpuCell]]:
    """Each GPU's mean temperature and power per bucket of ``bucket_s`` seconds (the heatmap),
    and one cell per GPU of its totals over the run (bucket 0: what its summary is made of);
    from GpuHour for buckets of whole hours."""
    if connection.vendor != "postgresql":
        cells = _gpu_cells_portable(run, bucket_s)
        return gpu_health.means_of_cells(cells), _gpu_cells_portable(run, None)
    sql = _HEALTH_SQL.format(table=GpuMinute._meta.db_table)
    if _hourly(bucket_s):
        sql = _HEALTH_SQL.replace("minute", "hour").format(table=GpuHour._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_WORK_MEM)
        cursor.execute(sql, {"run": run.pk, "bucket": bucket_s,
                             "mask": gpu_health.THROTTLING_MASK})
        rows = cursor.fetchall()
    means = {}
    for host, gpu, packed, *_ in rows:
        bucket, temp, watts = np.frombuffer(bytes(packed), ">f8").astype(np.float64).reshape(
            -1, 3).T
        means[(host, gpu)] = gpu_health.GpuMeans(bucket, temp, watts)
    return means, _cells((host, gpu, 0.0, *totals) for host, gpu, _, *totals in rows)


def _cells(rows) -> list[gpu_health.GpuCell]:
    return [gpu_health.GpuCell(host=host, gpu=gpu, bucket=float(bucket), samples=int(samples),
                               temp_n=int(temp_n or 0), temp_sum=temp_sum or 0.0,
                               temp_max=temp_max, power_n=int(power_n or 0),
                               power_sum=power_sum or 0.0, power_max=power_max,
                               throttled=int(throttled or 0), throttle_bits=int(bits or 0))
            for host, gpu, bucket, samples, temp_n, temp_sum, temp_max, power_n, power_sum,
            power_max, throttled, bits in rows]


def _gpu_cells_portable(run: Run, bucket_s: int | None) -> list[gpu_health.GpuCell]:
    """The cells computed in Python (SQLite); ``bucket_s`` None: one per GPU, the whole run."""
    totals: dict[tuple, dict] = {}
    rows = (GpuHour.objects.filter(run=run) if bucket_s is None or _hourly(bucket_s)
            else GpuMinute.objects.filter(run=run))
    for m in rows.iterator():
        start = m.hour if isinstance(m, GpuHour) else m.minute
        bucket = 0.0 if bucket_s is None else (start.timestamp() // bucket_s) * bucket_s
        t = totals.setdefault((m.host, m.gpu, bucket), {
            "samples": 0, "temp_n": 0, "temp_sum": 0.0, "temp_max": None, "power_n": 0,
            "power_sum": 0.0, "power_max": None, "throttled": 0, "bits": 0})
        t["samples"] += m.samples
        t["temp_n"] += m.temp_n
        t["temp_sum"] += m.temp_sum
        t["temp_max"] = m.temp_max if t["temp_max"] is None else max(t["temp_max"], m.temp_max or 0)
        t["power_n"] += m.power_n
        t["power_sum"] += m.power_sum
        t["power_max"] = m.power_max if t["power_max"] is None else max(t["power_max"],
                                                                         m.power_max or 0)
        if m.throttle_bits & gpu_health.THROTTLING_MASK:
            t["throttled"] += m.throttled
        t["bits"] |= m.throttle_bits
    return [gpu_health.GpuCell(host=host, gpu=gpu, bucket=bucket, samples=t["samples"],
                               temp_n=t["temp_n"], temp_sum=t["temp_sum"], temp_max=t["temp_max"],
                               power_n=t["power_n"], power_sum=t["power_sum"],
                               power_max=t["power_max"], throttled=t["throttled"],
                               throttle_bits=t["bits"])
            for (host, gpu, bucket), t in totals.items()]


def gpu_events(run: Run, limit: int = 1000) -> list[gpu_health.GpuEvent]:
    """The run's newest ``limit`` XID and ECC events."""
    rows = (Event.objects.filter(run=run, kind__in=("xid", "ecc")).order_by("-ts")
            .values_list("ts", "host", "kind", "payload")[:limit])
    return [gpu_health.gpu_event(ts.timestamp(), host, kind, payload)
            for ts, host, kind, payload in rows]

