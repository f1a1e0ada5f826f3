"""Stragglers: ranks whose step time is persistently above the per-step median, and what they cost.

Answers "which ranks drag every step, where do they run, and how much time do we lose to them?".
Read from the per-minute rollup (``collectors.models.StepMinute``), so a run of any length costs one
row per rank and minute.

Definitions:

rank-minute step time
    a rank's mean step duration in one minute: duration sum / steps that reported a duration.
minute median
    the median of the rank-minute step times across the ranks that reported in that minute. Minutes
    with fewer than two such ranks have nothing to compare against and are left out.
slow minute
    a minute in which the rank's step time is at least ``SLOW_PCT`` (5%) above the minute median.
    A tie with the median is never slow.
straggler
    a rank that was slow in at least ``PERSISTENT_SHARE`` (50%) of the minutes it reported (and
    in at least ``MIN_MINUTES`` minutes): persistently, not one bad minute. 5% sits well above the
    minute-to-minute jitter of a healthy rank's mean over a minute of steps (~1%) and below the
    slowdown of a throttling GPU or a bad link (8–30%).
excess
    the mean over the rank's minutes of ``100 × (rank step time / minute median − 1)``, in percent.
    Ranks are ranked by it, largest first.
cost
    Synchronous data parallelism makes every rank wait for the slowest at each step. Per minute,
    ``wait = slowest rank − median`` is the time each step loses to the slowest rank, and
    ``straggler wait = slowest rank − slowest non-straggler`` the part the flagged ranks alone
    cause (what fixing them would give back). Both are averaged over minutes (seconds per step), and
    the straggler wait is also summed over the run (× the minute's steps: time lost in total).

``rank_minute_rows`` → ``summarise_ranks`` → ``straggler_report`` is the pure path (any database,
unit tests); on PostgreSQL ``read_stragglers`` lets the database do the same per-minute reduction
(``_SUMMARY_SQL``, ``_COST_SQL``) so only one row per rank comes back.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

SLOW_PCT = 5.0
PERSISTENT_SHARE = 0.5
MIN_MINUTES = 5
TOP_N = 20


@dataclass(frozen=True)
class RankMinute:
    """One StepMinute row reduced: ``minute`` in Unix seconds, the rank's mean step time there."""

    minute: float
    rank: int
    step_s: float
    steps: int = 1


@dataclass(frozen=True)
class RankSummary:
    """A rank's minutes compared with the minute medians (what ``_SUMMARY_SQL`` returns)."""

    rank: int
    minutes: int
    slow_minutes: int
    excess_sum: float  # Σ (step time / minute median − 1)
    step_s_sum: float  # Σ the rank's step time, for its mean

    @property
    def excess_pct(self) -> float:
        return 100.0 * self.excess_sum / self.minutes if self.minutes else 0.0

    @property
    def mean_step_s(self) -> float:
        return self.step_s_sum / self.minutes if self.minutes else 0.0

    @property
    def slow_share(self) -> float:
        return self.slow_minutes / self.minutes if self.minutes else 0.0


@dataclass(frozen=True)
class WaitCost:
    """What waiting for the slowest rank costs (see "cost" above)."""

    minutes: int = 0
    median_step_s: float | None = None  # mean over minutes of the minute median
    wait_s: float | None = None  # mean over minutes of (slowest − median), per step
    straggler_wait_s: float | None = None  # mean over minutes of (slowest − slowest other)
    straggler_lost_s: float = 0.0  # Σ over minutes of straggler wait × steps in the minute

    @property
    def straggler_wait_pct(self) -> float | None:
        if self.straggler_wait_s is None or not self.median_step_s:
            return None
        return 100.0 * self.straggler_wait_s / self.median_step_s

    @property
    def wait_pct(self) -> float | None:
        if self.wait_s is None or not self.median_step_s:
            return None
        return 100.0 * self.wait_s / self.median_step_s


@dataclass(frozen=True)
class Placement:
    host: str
    gpu: int | None  # the local rank: torchrun binds local rank i to GPU i


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    gpu: int | None
    excess_pct: float
    slow_minutes: int
    minutes: int
    mean_step_s: float

    @property
    def slow_share(self) -> float:
        return self.slow_minutes / self.minutes if self.minutes else 0.0


@dataclass
class StragglerReport:
    ranks: list[RankSummary] = field(default_factory=list)  # every compared rank, by rank
    stragglers: list[Straggler] = field(default_factory=list)  # flagged, largest excess first
    top: list[Straggler] = field(default_factory=list)  # the TOP_N largest excesses, flagged or not
    cost: WaitCost = field(default_factory=WaitCost)
    slow_pct: float = SLOW_PCT
    persistent_share: float = PERSISTENT_SHARE
    minutes_every: int = 1  # k when a long run was read every k-th minute

    @property
    def median_rank_step_s(self) -> float | None:
        """The median over ranks of each rank's mean step time (the chart's reference line)."""
        return statistics.median(r.mean_step_s for r in self.ranks) if self.ranks else None

    @property
    def flagged_ranks(self) -> set[int]:
        return {s.rank for s in self.stragglers}


def is_straggler(summary: RankSummary, *, persistent_share: float = PERSISTENT_SHARE,
                 min_minutes: int = MIN_MINUTES) -> bool:
    return (summary.minutes >= min_minutes
            and summary.slow_minutes >= persistent_share * summary.minutes)


def _by_minute(rows: Iterable[RankMinute]) -> dict[float, list[RankMinute]]:
    minutes: dict[float, list[RankMinute]] = defaultdict(list)
    for row in rows:
        if row.step_s is not None and row.step_s > 0:
            minutes[row.minute].append(row)
    return {m: ranks for m, ranks in minutes.items() if len(ranks) >= 2}


def summarise_ranks(rows: Iterable[RankMinute], *, slow_pct: float = SLOW_PCT) -> list[RankSummary]:
    """Per rank, its minutes against the minute medians; ranks in rank order."""
    threshold = 1.0 + slow_pct / 100.0
    acc: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for ranks in _by_minute(rows).values():
        median = statistics.median(r.step_s for r in ranks)
        for r in ranks:
            a = acc[r.rank]
            a[0] += 1
            a[1] += r.step_s >= median * threshold
            a[2] += r.step_s / median - 1.0
            a[3] += r.step_s
    return [RankSummary(rank, int(a[0]), int(a[1]), a[2], a[3]) for rank, a in sorted(acc.items())]


def wait_cost(rows: Iterable[RankMinute], stragglers: set[int]) -> WaitCost:
    """Seconds per step lost to the slowest rank, and to the flagged ``stragglers`` alone."""
    medians, waits, straggler_waits = [], [], []
    lost = 0.0
    for ranks in _by_minute(rows).values():
        median = statistics.median(r.step_s for r in ranks)
        slowest = max(r.step_s for r in ranks)
        others = [r.step_s for r in ranks if r.rank not in stragglers]
        # With every rank flagged there is no healthy rank to compare with: the median stands in.
        slowest_other = max(others) if others else median
        medians.append(median)
        waits.append(slowest - median)
        straggler_waits.append(slowest - slowest_other)
        lost += (slowest - slowest_other) * max(r.steps for r in ranks)
    if not medians:
        return WaitCost()
    return WaitCost(len(medians), statistics.fmean(medians), statistics.fmean(waits),
                    statistics.fmean(straggler_waits), lost)


def straggler_report(summaries: Sequence[RankSummary], cost: WaitCost,
                     placements: Mapping[int, Placement], *, top_n: int = TOP_N,
                     slow_pct: float = SLOW_PCT,
                     persistent_share: float = PERSISTENT_SHARE) -> StragglerReport:
    """Flags the persistent stragglers among ``summaries`` and ranks every rank by excess."""

    def named(s: RankSummary) -> Straggler:
        place = placements.get(s.rank, Placement("", None))
        return Straggler(s.rank, place.host, place.gpu, s.excess_pct, s.slow_minutes, s.minutes,
                         s.mean_step_s)

    # Ties in excess go to the lower rank, so the order is stable from one page load to the next.
    ordered = sorted(summaries, key=lambda s: (-s.excess_pct, s.rank))
    flagged = [named(s) for s in ordered
               if is_straggler(s, persistent_share=persistent_share)]
    return StragglerReport(ranks=sorted(summaries, key=lambda s: s.rank), stragglers=flagged,
                           top=[named(s) for s in ordered[:top_n]], cost=cost,
                           slow_pct=slow_pct, persistent_share=persistent_share)


def stragglers_from_rows(rows: Sequence[RankMinute], placements: Mapping[int, Placement], *,
                         top_n: int = TOP_N) -> StragglerReport:
    """The whole analysis from rank-minute rows."""
    summaries = summarise_ranks(rows)
    flagged = {s.rank for s in summaries if is_straggler(s)}
    return straggler_report(summaries, wait_cost(rows, flagged), placements, top_n=top_n)


# The query layer. On PostgreSQL the per-minute medians are taken in the database (one pass along
# the (run, minute, rank) unique index), so 512 ranks × 3 days (2.2M rank-minutes) come back as 512
# rows; elsewhere (the embedded SQLite mode) the rows are read and reduced by the functions above.

_PER = """
    SELECT minute, rank, steps, duration_sum / duration_n AS d
    FROM {table} WHERE run_id = %(run)s AND duration_n > 0 AND duration_sum > 0 {sampled}
"""
_SAMPLED = "AND minute = ANY(%(minutes)s)"

_SUMMARY_SQL = """
WITH per AS ({per}),
med AS (
    SELECT minute, percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS m
    FROM per GROUP BY minute HAVING count(*) >= 2)
SELECT per.rank, count(*), sum(CASE WHEN per.d >= med.m * %(threshold)s THEN 1 ELSE 0 END),
       sum(per.d / med.m - 1), sum(per.d)
FROM per JOIN med USING (minute)
GROUP BY per.rank ORDER BY per.rank
"""

_COST_SQL = """
WITH per AS ({per}),
by_minute AS (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS m, max(d) AS slowest,
           max(d) FILTER (WHERE NOT (rank = ANY(%(flagged)s))) AS slowest_other,
           max(steps) AS steps
    FROM per GROUP BY minute HAVING count(*) >= 2)
SELECT count(*), avg(m), avg(slowest - m), avg(slowest - coalesce(slowest_other, m)),
       coalesce(sum((slowest - coalesce(slowest_other, m)) * steps), 0)
FROM by_minute
"""


def read_rank_minutes(run, minutes=None) -> list[RankMinute]:
    from collectors.models import StepMinute

    queryset = StepMinute.objects.filter(run=run, duration_n__gt=0, duration_sum__gt=0)
    if minutes is not None:
        queryset = queryset.filter(minute__in=minutes)
    rows = queryset.values_list("minute", "rank", "duration_sum", "duration_n", "steps")
    return [RankMinute(minute.timestamp(), rank, total / n, steps)
            for minute, rank, total, n, steps in rows]


def read_placements(run, ranks: Iterable[int]) -> dict[int, Placement]:
    """Host and GPU of each rank, from the batches it sent. One indexed lookup per rank, stopping
    at its first batch (every rank sends one per flush, so that is near the run's first rows)."""
    from collectors.models import IngestedBatch

    placements = {}
    for rank in ranks:
        # Sliced, not .first(): no ORDER BY, so the scan stops at the first match.
        found = list(IngestedBatch.objects.filter(run=run, rank=rank)
                     .values_list("host", "local_rank")[:1])
        if found:
            placements[rank] = Placement(*found[0])
    return placements


def read_stragglers(run, *, top_n: int = TOP_N) -> StragglerReport:
    """The run's straggler report. A long, wide run is read every k-th minute (see
    collectors.minute_sample; a third of its row budget, as a straggler is slow all the time and
    the query sorts its rows twice): minutes and slow minutes count the minutes read, and the time
    lost is scaled by k."""
    from django.db import connection, transaction

    from collectors import minute_sample
    from collectors.models import StepMinute

    sample, every = minute_sample.sampled_minutes(StepMinute.objects.filter(run=run),
                                                  minute_sample.ROW_BUDGET // 3)
    if connection.vendor != "postgresql":
        rows = read_rank_minutes(run, sample)
        summaries = summarise_ranks(rows)
        flagged = {s.rank for s in summaries if is_straggler(s)}
        cost = wait_cost(rows, flagged)
    else:
        per = _PER.format(table=StepMinute._meta.db_table,
                          sampled=_SAMPLED if sample is not None else "")
        params = {"run": run.pk, "minutes": sample}
        with transaction.atomic(), connection.cursor() as cursor:
            # The per-minute medians sort ~30k rows twice; the default 4 MB spills them to disk.
            cursor.execute("SET LOCAL work_mem = '32MB'")
            cursor.execute(_SUMMARY_SQL.format(per=per),
                           {**params, "threshold": 1.0 + SLOW_PCT / 100.0})
            summaries = [RankSummary(rank, minutes, slow, excess, total)
                         for rank, minutes, slow, excess, total in cursor.fetchall()]
            flagged = {s.rank for s in summaries if is_straggler(s)}
            cursor.execute(_COST_SQL.format(per=per), {**params, "flagged": sorted(flagged)})
            minutes, median, wait, straggler_wait, lost = cursor.fetchone()
        cost = (WaitCost(minutes, median, wait, straggler_wait, float(lost)) if minutes
                else WaitCost())
    if every > 1:
        cost = WaitCost(cost.minutes, cost.median_step_s, cost.wait_s, cost.straggler_wait_s,
                        cost.straggler_lost_s * every)
    top = sorted(summaries, key=lambda s: (-s.excess_pct, s.rank))[:top_n]
    placements = read_placements(run, sorted({s.rank for s in top} | flagged))
    report = straggler_report(summaries, cost, placements, top_n=top_n)
    report.minutes_every = every
    return report
