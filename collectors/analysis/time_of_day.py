"""Throughput against the time of day at the cluster's site, beside the GPUs' temperature.

Answers "is the run slower in the afternoon heat, and by how much?". Pure functions over the
per-minute rollups (``collectors.models.StepMinute`` summed over ranks, ``GpuMinute`` summed over
GPUs); ``read_time_of_day`` at the bottom is the query layer that feeds them.

Definitions (the simulator's ground truth is computed the same way, so they compare exactly):

minute throughput
    For each UTC minute with at least one step row: ``tokens/s = (T / S) × R / D`` where, summed
    over the ranks that reported steps ending in that minute, ``T`` is tokens, ``S`` steps, ``D``
    the mean step duration (duration sum / steps that reported a duration) and ``R`` the number of
    ranks that ever reported steps in the run. In words: tokens per rank-step, times the ranks,
    per second of *step time*. Measuring against step time rather than the minute's wall clock
    means a minute cut short by a restart, a checkpoint save or a stall is not counted as slow:
    downtime is badput (see the Failures page), not slowness. Minutes with no steps are left out.
    A run that reports no tokens is measured in steps/s (``1 / D``) instead; a run that reports no
    step durations falls back to the wall clock, ``T / 60`` (steps/60).
run median
    the median of the minute throughputs over the whole run.
hourly deviation
    for local hour *h* (0..23) of ``Run.timezone`` (IANA; each minute is converted on its own
    with ``zoneinfo``, so the day a clock springs forward has no 02:00 and the day it falls back
    counts both 01:00s in hour 1): ``100 × (median of the minute throughputs in hour h, over all
    days / run median − 1)``, in percent. Hours with fewer than ``MIN_MINUTES_PER_HOUR`` minutes
    are None (too few to trust).
amplitude
    peak-to-trough of the hourly deviation, in percentage points (max − min over the hours that
    have a value).
per-day overlay
    the same deviation per local calendar day and hour (median of that day-hour's minutes, against
    the same run median), so one unusual day does not hide in the average.
temperature per hour
    the mean GPU temperature over every sample taken in a productive minute (one with steps) of
    local hour *h*: idle GPUs during a restart are cooler, and would blur the comparison.
correlation
    Pearson's r between the hourly deviation and the hourly temperature, over the hours that have
    both (``n``), with a two-sided p-value from Fisher's z (approximate; meaningless below n = 4).
    Both curves follow the clock, so r says they move together, not that heat is the cause.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MIN_MINUTES_PER_HOUR = 5
#: Days drawn in the overlay (the most recent ones); more lines than this are unreadable anyway.
MAX_OVERLAY_DAYS = 62
HOURS = range(24)


@dataclass(frozen=True)
class StepMinuteTotals:
    """One minute's StepMinute rows summed over ranks. ``minute`` is Unix seconds (UTC)."""

    minute: float
    ranks: int
    steps: int
    tokens: int
    timed_steps: int  # steps that reported a duration
    step_seconds: float  # their durations, summed


@dataclass(frozen=True)
class GpuMinuteTotals:
    """One minute's GpuMinute rows summed over GPUs."""

    minute: float
    temp_sum: float
    temp_n: int


@dataclass(frozen=True)
class MinuteRate:
    minute: float
    rate: float


@dataclass(frozen=True)
class Correlation:
    r: float | None
    n: int
    p_value: float | None


@dataclass(frozen=True)
class DayCurve:
    day: date  # local calendar day
    deviation_pct: list[float | None]  # 24 values, local hours 0..23


@dataclass
class TimeOfDay:
    timezone: str
    unit: str  # "tokens/s", "steps/s"
    basis: str  # "step time" or "wall clock"
    run_median: float | None
    minutes: int  # productive minutes measured
    hourly_rate: list[float | None] = field(default_factory=lambda: [None] * 24)
    hourly_deviation_pct: list[float | None] = field(default_factory=lambda: [None] * 24)
    hourly_minutes: list[int] = field(default_factory=lambda: [0] * 24)
    hourly_temp_c: list[float | None] = field(default_factory=lambda: [None] * 24)
    days: list[DayCurve] = field(default_factory=list)
    correlation: Correlation = field(default_factory=lambda: Correlation(None, 0, None))
    # 1 when every minute was read; k when a long run was read every k-th minute.
    minutes_every: int = 1
    gpu_minutes_every: int = 1

    @property
    def amplitude_pp(self) -> float | None:
        """Peak-to-trough of the hourly deviation, percentage points."""
        values = [v for v in self.hourly_deviation_pct if v is not None]
        return max(values) - min(values) if len(values) >= 2 else None

    @property
    def slowest_hour(self) -> int | None:
        return _arg(self.hourly_deviation_pct, min)

    @property
    def fastest_hour(self) -> int | None:
        return _arg(self.hourly_deviation_pct, max)

    @property
    def hottest_hour(self) -> int | None:
        return _arg(self.hourly_temp_c, max)


def _arg(values: Sequence[float | None], pick) -> int | None:
    present = [(v, h) for h, v in enumerate(values) if v is not None]
    if not present:
        return None
    best = pick(v for v, _ in present)
    return next(h for v, h in present if v == best)


def site_zone(name: str) -> ZoneInfo:
    """The run's IANA zone; an unknown name is UTC rather than a crash on the page."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def minute_rates(minutes: Iterable[StepMinuteTotals]) -> tuple[list[MinuteRate], str, str]:
    """Throughput per productive minute (see the module docstring), with its unit and basis."""
    rows = [m for m in minutes if m.steps > 0]
    if not rows:
        return [], "tokens/s", "step time"
    ranks = max(m.ranks for m in rows)
    with_tokens = any(m.tokens > 0 for m in rows)
    unit = "tokens/s" if with_tokens else "steps/s"
    timed = any(m.timed_steps > 0 and m.step_seconds > 0 for m in rows)
    rates = []
    for m in rows:
        if timed:
            if m.timed_steps <= 0 or m.step_seconds <= 0:
                continue
            mean_step_s = m.step_seconds / m.timed_steps
            per_step = (m.tokens / m.steps) * ranks if with_tokens else 1.0
            rates.append(MinuteRate(m.minute, per_step / mean_step_s))
        else:
            rates.append(MinuteRate(m.minute, (m.tokens if with_tokens else m.steps) / 60.0))
    return rates, unit, "step time" if timed else "wall clock"


def _deviation(value: float | None, median: float) -> float | None:
    return None if value is None else 100.0 * (value / median - 1.0)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> Correlation:
    """Pearson's r with n and an approximate two-sided p-value (Fisher's z)."""
    n = len(xs)
    if n < 3:
        return Correlation(None, n, None)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return Correlation(None, n, None)
    r = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / math.sqrt(sxx * syy)
    r = max(-1.0, min(1.0, r))
    if n < 4:
        return Correlation(r, n, None)
    if abs(r) >= 1.0:
        return Correlation(r, n, 0.0)
    z = math.atanh(r) * math.sqrt(n - 3)
    return Correlation(r, n, math.erfc(abs(z) / math.sqrt(2)))


def time_of_day(
    steps: Iterable[StepMinuteTotals],
    gpus: Iterable[GpuMinuteTotals],
    timezone: str,
    *,
    min_minutes_per_hour: int = MIN_MINUTES_PER_HOUR,
    max_overlay_days: int = MAX_OVERLAY_DAYS,
) -> TimeOfDay:
    """The Time of day page's numbers from per-minute totals (any order)."""
    zone = site_zone(timezone)
    rates, unit, basis = minute_rates(steps)
    result = TimeOfDay(timezone=zone.key, unit=unit, basis=basis, run_median=None,
                       minutes=len(rates))
    if not rates:
        return result
    median = statistics.median(r.rate for r in rates)
    if median <= 0:
        return result
    result.run_median = median

    local: dict[float, datetime] = {}
    by_hour: dict[int, list[float]] = defaultdict(list)
    by_day_hour: dict[tuple[date, int], list[float]] = defaultdict(list)
    for r in rates:
        when = datetime.fromtimestamp(r.minute, tz=UTC).astimezone(zone)
        local[r.minute] = when
        by_hour[when.hour].append(r.rate)
        by_day_hour[(when.date(), when.hour)].append(r.rate)

    for hour in HOURS:
        values = by_hour.get(hour, [])
        result.hourly_minutes[hour] = len(values)
        if len(values) >= min_minutes_per_hour:
            result.hourly_rate[hour] = statistics.median(values)
            result.hourly_deviation_pct[hour] = _deviation(result.hourly_rate[hour], median)

    days = sorted({day for day, _ in by_day_hour})[-max_overlay_days:]
    for day in days:
        curve = []
        for hour in HOURS:
            values = by_day_hour.get((day, hour), [])
            curve.append(_deviation(statistics.median(values), median)
                         if len(values) >= min_minutes_per_hour else None)
        result.days.append(DayCurve(day, curve))

    temp_sum = [0.0] * 24
    temp_n = [0] * 24
    for g in gpus:
        when = local.get(g.minute)
        if when is None or g.temp_n <= 0:
            continue  # not a productive minute
        temp_sum[when.hour] += g.temp_sum
        temp_n[when.hour] += g.temp_n
    for hour in HOURS:
        if temp_n[hour]:
            result.hourly_temp_c[hour] = temp_sum[hour] / temp_n[hour]

    pairs = [(d, t) for d, t in zip(result.hourly_deviation_pct, result.hourly_temp_c, strict=True)
             if d is not None and t is not None]
    result.correlation = pearson([d for d, _ in pairs], [t for _, t in pairs])
    return result


# The query layer: GROUP BY minute reads of the rollups along their (run, minute, …) unique index,
# so the page costs ~1,440 rows a day whatever the number of ranks or GPUs; on a long, wide run
# they read a systematic sample of minutes (collectors.minute_sample), recorded in the result.


# On PostgreSQL the sampled minutes travel as one array parameter: an IN list of ~1,300
# datetimes compiled by the ORM cost more than the query, and rows come back as plain tuples.
_STEP_MINUTES_SQL = """
SELECT extract(epoch FROM minute)::float8, count(rank), sum(steps), sum(tokens), sum(duration_n),
       sum(duration_sum)
FROM {table} WHERE run_id = %(run)s {minutes}
GROUP BY minute ORDER BY minute
"""
_GPU_MINUTES_SQL = """
SELECT extract(epoch FROM minute)::float8, sum(temp_sum), sum(temp_n)
FROM {table} WHERE run_id = %(run)s AND temp_n > 0 {minutes}
GROUP BY minute ORDER BY minute
"""


def _read_minutes(sql: str, table: str, run, minutes) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=table, minutes="" if minutes is None else
                                  "AND minute = ANY(%(minutes)s::timestamptz[])"),
                       {"run": run.pk, "minutes": None if minutes is None else list(minutes)})
        return cursor.fetchall()


def read_step_minutes(run, minutes=None) -> list[StepMinuteTotals]:
    from django.db import connection
    from django.db.models import Count, Sum

    from collectors.models import StepMinute

    if connection.vendor == "postgresql":
        return [StepMinuteTotals(minute, ranks, int(steps or 0), int(tokens or 0),
                                 int(timed or 0), seconds or 0.0)
                for minute, ranks, steps, tokens, timed, seconds in _read_minutes(
                    _STEP_MINUTES_SQL, StepMinute._meta.db_table, run, minutes)]
    queryset = StepMinute.objects.filter(run=run)
    if minutes is not None:
        queryset = queryset.filter(minute__in=minutes)
    rows = (queryset.values("minute")
            .annotate(ranks=Count("rank"), steps_=Sum("steps"), tokens_=Sum("tokens"),
                      timed=Sum("duration_n"), seconds=Sum("duration_sum"))
            .order_by("minute")
            .values_list("minute", "ranks", "steps_", "tokens_", "timed", "seconds"))
    return [StepMinuteTotals(minute.timestamp(), ranks, steps or 0, tokens or 0, timed or 0,
                             seconds or 0.0)
            for minute, ranks, steps, tokens, timed, seconds in rows]


def read_gpu_minutes(run, minutes=None) -> list[GpuMinuteTotals]:
    """GPU temperature sums per minute from HostMinute: each host's GPUs already summed, so a
    row per host (not per GPU) a minute."""
    from django.db import connection
    from django.db.models import Sum

    from collectors.models import HostMinute

    if connection.vendor == "postgresql":
        return [GpuMinuteTotals(minute, temp_sum or 0.0, int(temp_n or 0))
                for minute, temp_sum, temp_n in _read_minutes(
                    _GPU_MINUTES_SQL, HostMinute._meta.db_table, run, minutes)]
    queryset = HostMinute.objects.filter(run=run, temp_n__gt=0)
    if minutes is not None:
        queryset = queryset.filter(minute__in=minutes)
    rows = (queryset.values("minute")
            .annotate(temp_sum_=Sum("temp_sum"), temp_n_=Sum("temp_n"))
            .order_by("minute")
            .values_list("minute", "temp_sum_", "temp_n_"))
    return [GpuMinuteTotals(minute.timestamp(), temp_sum or 0.0, temp_n or 0)
            for minute, temp_sum, temp_n in rows]


def read_time_of_day(run) -> TimeOfDay:
    """The run's time-of-day analysis, from its rollups."""
    from collectors import minute_sample
    from collectors.models import HostMinute, StepMinute

    step_sample, step_every = minute_sample.sampled_minutes(StepMinute.objects.filter(run=run))
    steps = read_step_minutes(run, step_sample)
    # Temperature only matters in productive minutes: sample among those, by HostMinute rows (a
    # host's, not a GPU's, per minute: a 64-host run reads every productive minute of days).
    productive = [datetime.fromtimestamp(m.minute, tz=UTC) for m in steps if m.steps > 0]
    gpu_minutes, gpu_every = minute_sample.thin(HostMinute.objects.filter(run=run), productive)
    # Only these minutes are used (the others have no rate), so only these are read, even when
    # thinning kept them all: the whole run's HostMinute rows were 5x as many on a sampled run.
    result = time_of_day(steps, read_gpu_minutes(run, gpu_minutes), run.timezone)
    result.minutes_every, result.gpu_minutes_every = step_every, gpu_every
    return result
