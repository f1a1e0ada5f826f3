"""The reads the dashboard makes of collected data. Each returns plain rows or aggregates; what
they mean (rates, charts) is worked out by collectors.analysis and dashboard.charts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import connection
from django.db.models import Count, Max, QuerySet, Sum

from collectors.analysis.throughput import RECENT_WINDOW_S, WindowAggregate
from collectors.models import Attempt, Run, StepMetric, StepMinute, StepQuarter
from collectors.step_quarters import QUARTER_S


@dataclass(frozen=True)
class RunOverview:
    """What the runs list and the run page header show about one run."""

    run: Run
    attempts: int
    last_step: int | None
    last_seen_at: datetime | None  # the collectors' last word, else the newest step row
    first_step_at: datetime | None
    latest_loss: float | None
    window: WindowAggregate | None  # the recent window of step rows, None without rows


# One round trip for the whole list. Every per-run lookup is a LATERAL subquery that walks the
# (run, ts) index from one end, so the cost grows with the number of runs shown and the rows in
# their last minute, not with the length of the runs. The window bounds repeat
# throughput.recent_window(): (greatest(first, last - window), last].
_OVERVIEW_SQL = """
SELECT r.id, a.attempts, b.first_ts, b.last_ts, b.latest_loss,
       w.step_rows, w.ranks, w.tokens::bigint, w.max_step,
       extract(epoch FROM b.last_ts - greatest(b.first_ts, b.last_ts - %(window)s))
FROM {run} r
CROSS JOIN LATERAL (SELECT count(*) AS attempts FROM {attempt} WHERE run_id = r.id) a
CROSS JOIN LATERAL (
    SELECT (SELECT ts FROM {step} WHERE run_id = r.id ORDER BY ts LIMIT 1) AS first_ts,
           (SELECT ts FROM {step} WHERE run_id = r.id ORDER BY ts DESC LIMIT 1) AS last_ts,
           (SELECT loss FROM {step} WHERE run_id = r.id AND loss IS NOT NULL
             ORDER BY ts DESC LIMIT 1) AS latest_loss
) b
CROSS JOIN LATERAL (
    SELECT count(*) AS step_rows, count(DISTINCT s.rank) AS ranks, sum(s.tokens) AS tokens,
           max(s.step) AS max_step
    FROM {step} s
    WHERE s.run_id = r.id
      AND s.ts > greatest(b.first_ts, b.last_ts - %(window)s) AND s.ts <= b.last_ts
) w
WHERE r.id = ANY(%(ids)s)
ORDER BY coalesce(r.last_seen_at, b.last_ts, r.created_at) DESC, r.id DESC
"""


def run_overviews(
    runs: QuerySet[Run], window_s: float = RECENT_WINDOW_S
) -> list[RunOverview]:
    """Overviews of ``runs``, most recently seen first."""
    by_id = runs.select_related("project").in_bulk()
    if not by_id:
        return []
    if connection.vendor != "postgresql":
        rows = _overview_rows_portable(list(by_id.values()), timedelta(seconds=window_s))
        return [_overview(by_id[row[0]], *row[1:]) for row in rows]
    sql = _OVERVIEW_SQL.format(
        run=Run._meta.db_table, attempt=Attempt._meta.db_table, step=StepMetric._meta.db_table
    )
    params = {"ids": list(by_id), "window": timedelta(seconds=window_s)}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [_overview(by_id[row[0]], *row[1:]) for row in rows]


def _overview(run: Run, attempts: int, first_ts: datetime | None, last_ts: datetime | None,
              latest_loss: float | None, step_rows: int, ranks: int, tokens: int | None,
              max_step: int | None, span_s: float | None) -> RunOverview:
    window = None
    if last_ts is not None:
        window = WindowAggregate(
            span_s=float(span_s), step_rows=step_rows, ranks=ranks, tokens=tokens
        )
    return RunOverview(
        run=run,
        attempts=attempts,
        # Step rows are the truth; the denormalised column covers runs whose rows were pruned.
        last_step=max_step if max_step is not None else run.last_step,
        last_seen_at=run.last_seen_at or last_ts,
        first_step_at=first_ts,
        latest_loss=latest_loss,
        window=window,
    )


def _overview_rows_portable(runs: list[Run], window: timedelta) -> list[tuple]:
    """The rows of _OVERVIEW_SQL, in its order, for databases without LATERAL (the embedded
    mode's SQLite): a few ORM queries per run, each walking the same (run, ts) index."""
    rows = []
    for run in runs:
        steps = StepMetric.objects.filter(run=run)
        first_ts = steps.order_by("ts").values_list("ts", flat=True).first()
        last_ts = steps.order_by("-ts").values_list("ts", flat=True).first()
        latest_loss = (steps.filter(loss__isnull=False).order_by("-ts")
                       .values_list("loss", flat=True).first())
        aggregate = {"step_rows": 0, "ranks": 0, "tokens": None, "max_step": None}
        span_s = None
        if last_ts is not None:
            since = max(first_ts, last_ts - window)
            aggregate = steps.filter(ts__gt=since, ts__lte=last_ts).aggregate(
                step_rows=Count("id"), ranks=Count("rank", distinct=True), tokens=Sum("tokens"),
                max_step=Max("step"))
            span_s = (last_ts - since).total_seconds()
        rows.append((
            run.pk, Attempt.objects.filter(run=run).count(), first_ts, last_ts, latest_loss,
            aggregate["step_rows"], aggregate["ranks"], aggregate["tokens"], aggregate["max_step"],
            span_s,
        ))
    # ORDER BY coalesce(last_seen_at, last step row, created_at) DESC, id DESC
    seen = {run.pk: (run.last_seen_at or row[3] or run.created_at, run.pk)
            for run, row in zip(runs, rows, strict=True)}
    return sorted(rows, key=lambda row: seen[row[0]], reverse=True)


def run_overview(run: Run, window_s: float = RECENT_WINDOW_S) -> RunOverview:
    return run_overviews(Run.objects.filter(pk=run.pk), window_s)[0]


@dataclass
class RankSteps:
    """One rank's step rows as columns, in time order."""

    step: list[int] = field(default_factory=list)
    ts: list[datetime] = field(default_factory=list)
    duration_s: list[float | None] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)


def run_steps_by_rank(run: Run, ranks: Iterable[int],
                      window: tuple[datetime, datetime] | None = None) -> dict[int, RankSteps]:
    """The step rows of ``run`` for the given ranks, as columns per rank (ranks without rows are
    left out), within ``window`` [since, until) when given. Streams from the database so a long
    run does not sit in memory twice."""
    columns: dict[int, RankSteps] = {}
    steps = StepMetric.objects.filter(run=run, rank__in=list(ranks))
    if window is not None:
        steps = steps.filter(ts__gte=window[0], ts__lt=window[1])
    rows = (
        steps
        .order_by("rank", "ts", "step")
        .values_list("rank", "step", "ts", "duration_s", "tokens", "loss")
    )
    for rank, step, ts, duration_s, tokens, loss in rows.iterator(chunk_size=20_000):
        rank_steps = columns.get(rank)
        if rank_steps is None:
            rank_steps = columns[rank] = RankSteps()
        rank_steps.step.append(step)
        rank_steps.ts.append(ts)
        rank_steps.duration_s.append(duration_s)
        rank_steps.tokens.append(tokens)
        rank_steps.loss.append(loss)
    return columns


@dataclass
class RankMinutes:
    """One rank's StepMinute rows as NumPy columns, in minute order: what long runs are charted
    from. Floats are NaN where the rollup has no value (no step of the minute reported it)."""

    minute: np.ndarray  # start of the minute, Unix seconds
    last_step: np.ndarray
    steps: np.ndarray
    duration_n: np.ndarray
    duration_sum: np.ndarray
    duration_max: np.ndarray
    tokens: np.ndarray
    loss_n: np.ndarray
    loss_sum: np.ndarray


_MINUTE_COLUMNS = ("last_step", "steps", "duration_n", "duration_sum", "duration_max", "tokens",
                   "loss_n", "loss_sum")
# One row per rank, its minutes packed by PostgreSQL into one bytea of big-endian float8s (NULL as
# NaN), nine per minute, that NumPy reads in place: a month-long run's 16 ranks are ~700k rollup
# rows, and building a Python tuple per row (or reading a COPY row by row) cost several times the
# query. One aggregate of concatenated values is ~25% cheaper than one aggregate per column.
_MINUTES_SQL = """
SELECT rank, string_agg({packed}, ''::bytea)
FROM {table} WHERE run_id = %(run)s AND rank = ANY(%(ranks)s)
  AND {time} >= %(since)s AND {time} < %(until)s
GROUP BY rank
"""
_ALL_TIME = (datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC))


def run_step_minutes_by_rank(run: Run, ranks: Iterable[int],
                             window: tuple[datetime, datetime] | None = None
                             ) -> dict[int, RankMinutes]:
    """The per-minute step rollups of ``run`` for the given ranks (ranks without rows left out),
    for the minutes that overlap ``window`` [since, until) when given. A rank's rows are 1/60 of
    its raw rows at one step a second, and far fewer at real step times, which is what keeps a
    weeks-long run page fast."""
    ranks = [int(rank) for rank in ranks]
    since, until = window or _ALL_TIME
    since = since.replace(second=0, microsecond=0)  # the minute that holds ``since``
    if connection.vendor != "postgresql":
        return _step_minutes_portable(run, ranks, since, until)
    packed = " || ".join(
        f"float8send(coalesce(({expression})::float8, 'NaN'))"
        for expression in ("extract(epoch FROM minute)", *_MINUTE_COLUMNS))
    sql = _MINUTES_SQL.format(packed=packed, table=StepMinute._meta.db_table, time="minute")
    with connection.cursor() as cursor:
        cursor.execute(sql, {"run": run.pk, "ranks": ranks, "since": since, "until": until})
        rows = cursor.fetchall()
    found = {}
    for rank, packed_rows in rows:
        table = np.frombuffer(packed_rows, dtype=">f8").astype(np.float64).reshape(
            -1, 1 + len(_MINUTE_COLUMNS))
        # string_agg's order is the scan's, not the minutes': one argsort restores it.
        table = table[np.argsort(table[:, 0], kind="stable")]
        found[rank] = RankMinutes(*table.T)
    return dict(sorted(found.items()))


def _step_minutes_portable(run: Run, ranks: list[int], since: datetime,
                           until: datetime) -> dict[int, RankMinutes]:
    """The same for databases without bytea packing (the embedded mode's SQLite)."""
    found: dict[int, list] = {}
    for rank, minute, *rest in (StepMinute.objects.filter(run=run, rank__in=ranks,
                                                          minute__gte=since, minute__lt=until)
                                .order_by("rank", "minute")
                                .values_list("rank", "minute", *_MINUTE_COLUMNS)):
        found.setdefault(rank, []).append((minute.timestamp(), *rest))
    return {rank: RankMinutes(*np.array(rows, dtype=np.float64).T)
            for rank, rows in found.items()}


@dataclass
class RankQuarters:
    """One rank's StepQuarter rows as NumPy columns, in quarter order: what the run page of a run
    of days is charted from. Per chart, each quarter's lowest and highest minute value with its
    x (last step, or the minute's start in Unix seconds); NaN where the quarter has none."""

    quarter: np.ndarray  # start of the quarter hour, Unix seconds
    minutes: np.ndarray
    steps: np.ndarray
    tokens: np.ndarray
    loss_low: np.ndarray
    loss_low_step: np.ndarray
    loss_high: np.ndarray
    loss_high_step: np.ndarray
    slowest_low: np.ndarray
    slowest_low_step: np.ndarray
    slowest_high: np.ndarray
    slowest_high_step: np.ndarray
    token_rate_low: np.ndarray
    token_rate_low_at: np.ndarray
    token_rate_high: np.ndarray
    token_rate_high_at: np.ndarray
    step_rate_low: np.ndarray
    step_rate_low_at: np.ndarray
    step_rate_high: np.ndarray
    step_rate_high_at: np.ndarray


_QUARTER_COLUMNS = tuple(RankQuarters.__dataclass_fields__)


def run_step_quarters_by_rank(run: Run, ranks: Iterable[int],
                              window: tuple[datetime, datetime] | None = None
                              ) -> dict[int, RankQuarters]:
    """The StepQuarter rows of ``run`` for the given ranks (ranks without rows left out), for the
    quarter hours that overlap ``window`` [since, until) when given: 96 rows a day per rank,
    packed and read as run_step_minutes_by_rank reads minutes."""
    ranks = [int(rank) for rank in ranks]
    since, until = window or _ALL_TIME
    if window:  # the quarter that holds ``since``
        since = datetime.fromtimestamp(since.timestamp() // QUARTER_S * QUARTER_S, tz=UTC)
    if connection.vendor != "postgresql":
        rows = (StepQuarter.objects.filter(run=run, rank__in=ranks, quarter__gte=since,
                                           quarter__lt=until)
                .order_by("rank", "quarter").values_list("rank", *_QUARTER_COLUMNS))
        found: dict[int, list] = {}
        for rank, *values in rows:
            found.setdefault(rank, []).append(
                [v.timestamp() if isinstance(v, datetime) else v for v in values])
        return {rank: RankQuarters(*np.array(values, dtype=np.float64).T)
                for rank, values in found.items()}
    packed = " || ".join(
        f"float8send(coalesce(({expression})::float8, 'NaN'))"
        for expression in (f"extract(epoch FROM {name})" if name == "quarter" or
                           name.endswith("_at") else name for name in _QUARTER_COLUMNS))
    sql = _MINUTES_SQL.format(packed=packed, table=StepQuarter._meta.db_table, time="quarter")
    with connection.cursor() as cursor:
        cursor.execute(sql, {"run": run.pk, "ranks": ranks, "since": since, "until": until})
        rows = cursor.fetchall()
    found_packed = {}
    for rank, packed_rows in rows:
        table = np.frombuffer(packed_rows, dtype=">f8").astype(np.float64).reshape(
            -1, len(_QUARTER_COLUMNS))
        table = table[np.argsort(table[:, 0], kind="stable")]
        found_packed[rank] = RankQuarters(*table.T)
    return dict(sorted(found_packed.items()))
