"""StepQuarter: a rank's StepMinute rows merged per quarter hour, for the run page of long runs.

The run page draws each rank's loss, step duration and throughput from its minutes, downsampled
to a few hundred points keeping each bucket's lowest and highest minute. A run of days has 1,440
minutes a day per rank, and reading them was most of the page. A StepQuarter row carries, per
chart, its quarter's lowest and highest minute value and where it sits on the x axis, so charts
drawn from two points a quarter keep every extreme a downsampling of the minutes would keep.

Like HostMinute and GpuHour from GpuMinute (collectors.rollups), the rows a batch touched are
recomputed from StepMinute (replaced, not merged) after its StepMinute upsert, in the batch's
transaction: a minute's mean loss or rate changes when a later batch adds steps to it, so the
extremes cannot be merged. Two transactions storing the same rank's steps of one quarter at
once could each miss the other's minute in that row; the rank's next batch of that quarter, or
``rebuild``, repairs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import connection

QUARTER_S = 900
TABLE = "collectors_stepquarter"
_SUMS = ("steps", "duration_n", "duration_sum", "tokens", "loss_n", "loss_sum")
_TIMED = "duration_n > 0 AND duration_sum > 0 AND duration_sum < 'Infinity'::float8"
# Per chart: the minute value (NULL where the minute has none, as the charts drop it) and the x
# it is drawn at. Loss and duration are drawn against the minute's last step, throughput against
# the minute's start.
_CHARTS = (
    ("loss", "loss_n > 0 AND last_step IS NOT NULL", "loss_sum / loss_n", "last_step", "_step"),
    ("slowest", "last_step IS NOT NULL", "duration_max", "last_step", "_step"),
    ("token_rate", f"{_TIMED} AND tokens > 0",
     "tokens / duration_sum", "minute", "_at"),
    ("step_rate", _TIMED, "duration_n / duration_sum", "minute", "_at"),
)
COLUMNS = ("run_id", "rank", "quarter", "minutes", *_SUMS, "last_step",
           *(f"{name}_{end}{part}" for name, *_, x_suffix in _CHARTS
             for end in ("low", "high") for part in ("", x_suffix)))


def _finite(expression: str) -> str:
    # NaN sorts above every number in PostgreSQL; the charts drop it (and infinities) instead.
    return (f"CASE WHEN ({expression}) > '-Infinity'::float8 "
            f"AND ({expression}) < 'Infinity'::float8 THEN ({expression}) END")


def _select(source: str) -> str:
    """The StepQuarter rows of the StepMinute rows ``source`` yields (a FROM clause)."""
    values = ", ".join(
        f"CASE WHEN {condition} THEN {_finite(f'({value})::float8')} END AS {name}"
        for name, condition, value, _, _ in _CHARTS)
    extremes = []
    for name, _, _, x, _ in _CHARTS:
        # Ties as the downsampling breaks them: the earliest lowest, the latest highest.
        for pick, order in (("min", "ASC, minute ASC"), ("max", "DESC, minute DESC")):
            extremes += [f"{pick}({name})",
                         f"(array_agg({x} ORDER BY {name} {order}) "
                         f"FILTER (WHERE {name} IS NOT NULL))[1]"]
    return f"""
SELECT run_id, rank, date_bin('{QUARTER_S} seconds', minute, TIMESTAMPTZ '2000-01-01 00:00+00'),
       count(*), {', '.join(f'sum({name})' for name in _SUMS)}, max(last_step),
       {', '.join(extremes)}
FROM (SELECT run_id, rank, minute, {', '.join(_SUMS)}, last_step, {values} FROM {source}) m
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
"""


_UPSERT = (f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) {{select}} "
           f"ON CONFLICT (run_id, rank, quarter) DO UPDATE SET "
           + ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS[3:]))
# LATERAL (OFFSET 0 keeps it from being flattened into a join) so that each touched quarter is an
# index range of StepMinute: as a join, a batch of 64 ranks was planned as a hash join over every
# StepMinute row (0.15 s on the 20M-sample run; 18 ms this way).
_DERIVE = _UPSERT.format(select=_select(
    "unnest(%(runs)s::int8[], %(ranks)s::int8[], %(quarters)s::int8[]) AS t(run, rank_, quarter) "
    "CROSS JOIN LATERAL (SELECT * FROM collectors_stepminute s WHERE s.run_id = t.run "
    f"AND s.minute >= to_timestamp(t.quarter) AND s.minute < to_timestamp(t.quarter + {QUARTER_S}) "
    "AND s.rank = t.rank_ OFFSET 0) s"
))


def derive(touched: Iterable[tuple[int, int, Iterable[int]]]) -> None:
    """Recomputes from StepMinute the StepQuarter rows of the quarters that the given minutes
    (Unix seconds) of each (run, rank) fall in. Call after the StepMinute upsert, in the same
    transaction."""
    quarters = sorted({(run_id, rank, minute - minute % QUARTER_S)
                       for run_id, rank, minutes in touched for minute in minutes})
    if not quarters:
        return
    if connection.vendor == "postgresql":
        runs, ranks, starts = zip(*quarters, strict=True)
        with connection.cursor() as cursor:
            cursor.execute(_DERIVE, {"runs": list(runs), "ranks": list(ranks),
                                     "quarters": list(starts)})
        return
    _derive_portably(quarters)


def rebuild(run_id: int | None) -> None:
    """Recomputes the StepQuarter rows of one run (or of every run) from StepMinute as it stands.
    Call in the transaction that rebuilt StepMinute."""
    from collectors.models import StepQuarter

    stale = StepQuarter.objects.all()
    (stale if run_id is None else stale.filter(run_id=run_id)).delete()
    if connection.vendor == "postgresql":
        source = "collectors_stepminute" + ("" if run_id is None else " WHERE run_id = %(run)s")
        with connection.cursor() as cursor:
            cursor.execute(_UPSERT.format(select=_select(source)), {"run": run_id})
        return
    from collectors.models import StepMinute

    minutes = StepMinute.objects.all()
    if run_id is not None:
        minutes = minutes.filter(run_id=run_id)
    StepQuarter.objects.bulk_create(quarter_rows(minutes.order_by("run_id", "rank", "minute")),
                                    batch_size=1000)


def _derive_portably(quarters: list[tuple[int, int, int]]) -> None:
    """SQLite (the embedded mode): the same rows computed in Python from the quarters' minutes."""
    from collectors.models import StepMinute, StepQuarter

    for run_id, rank, start in quarters:
        minutes = StepMinute.objects.filter(
            run_id=run_id, rank=rank, minute__gte=datetime.fromtimestamp(start, tz=UTC),
            minute__lt=datetime.fromtimestamp(start + QUARTER_S, tz=UTC)).order_by("minute")
        for row in quarter_rows(minutes):
            StepQuarter.objects.update_or_create(
                run_id=run_id, rank=rank, quarter=row.quarter,
                defaults={c: getattr(row, c) for c in COLUMNS[3:]})


def quarter_rows(minutes) -> list:
    """StepQuarter rows (unsaved) of StepMinute rows given in (run, rank, minute) order: what the
    SQL above computes, for databases without it."""
    from collectors.models import StepQuarter

    found: dict[tuple, StepQuarter] = {}
    for m in minutes:
        seconds = int(m.minute.timestamp())
        start = datetime.fromtimestamp(seconds - seconds % QUARTER_S, tz=UTC)
        q = found.get((m.run_id, m.rank, start))
        if q is None:
            q = found[(m.run_id, m.rank, start)] = StepQuarter(
                run_id=m.run_id, rank=m.rank, quarter=start)
        q.minutes += 1
        for name in _SUMS:
            setattr(q, name, getattr(q, name) + getattr(m, name))
        if m.last_step is not None:
            q.last_step = m.last_step if q.last_step is None else max(q.last_step, m.last_step)
        for name, value, x in _minute_values(m):
            if value is None:
                continue
            # Minutes come in order: a tie keeps the earliest low and moves the high on.
            low, high = getattr(q, f"{name}_low"), getattr(q, f"{name}_high")
            if low is None or value < low:
                setattr(q, f"{name}_low", value)
                setattr(q, f"{name}_low{x[0]}", x[1])
            if high is None or value >= high:
                setattr(q, f"{name}_high", value)
                setattr(q, f"{name}_high{x[0]}", x[1])
    return list(found.values())


def _minute_values(m) -> list[tuple[str, float | None, tuple[str, object]]]:
    def finite(value: float) -> float | None:
        return value if value == value and abs(value) != float("inf") else None

    placed = m.last_step is not None
    timed = m.duration_n > 0 and 0 < m.duration_sum < float("inf")
    return [
        ("loss", finite(m.loss_sum / m.loss_n) if placed and m.loss_n > 0 else None,
         ("_step", m.last_step)),
        ("slowest", finite(m.duration_max) if placed and m.duration_max is not None else None,
         ("_step", m.last_step)),
        ("token_rate", finite(m.tokens / m.duration_sum) if timed and m.tokens > 0 else None,
         ("_at", m.minute)),
        ("step_rate", finite(m.duration_n / m.duration_sum) if timed else None,
         ("_at", m.minute)),
    ]
