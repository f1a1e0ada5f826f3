"""Turns query results into what the pages and their JSON show. Numbers come from
collectors.analysis, figures from dashboard.charts; this module only wires them together and
formats them, so the HTML page and its JSON refresh can never disagree."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from django.urls import reverse

from collectors import queries
from collectors.analysis import throughput
from collectors.models import Run
from dashboard import charts
from dashboard.views import formatting

# More lines than this on one chart is a blur, and each costs a downsampled series per refresh;
# the first ranks are shown and the page says how many there are.
MAX_RANK_TRACES = 16
# Above this many step rows in the ranks shown, the run page reads the per-minute rollups instead
# of the rows (about 100 ms of reading and downsampling on the 2-core benchmark machine).
RAW_STEP_ROWS_LIMIT = 40_000

# Above this many rollup minutes in the ranks shown, the run page reads the quarter-hour rollups
# (StepQuarter, each quarter's lowest and highest minute per chart) instead: 16 ranks' minutes of
# 4.6 days (106k) were 3/4 of the page.
MINUTE_ROWS_LIMIT = 30_000

# Runs in these states will not change again: their pages stop polling.
FINAL_STATUSES = frozenset({Run.Status.FINISHED, Run.Status.FAILED})


def display_status(run: Run, now: datetime) -> str:
    """The status as the user should read it: a running run that went silent is 'stalled'."""
    return "stalled" if run.is_stale(now) else run.status


def run_row(overview: queries.RunOverview, now: datetime) -> dict[str, Any]:
    """One row of the runs list (also the header numbers of the run page)."""
    run = overview.run
    rates = throughput.throughput_from_aggregate(overview.window)
    return {
        "id": run.pk,
        "url": reverse("run", args=[run.pk]),
        "project": run.project.slug,
        "name": run.name,
        "status": display_status(run, now),
        "attempts": overview.attempts,
        "world_size": run.world_size,
        "last_step": overview.last_step,
        "last_step_text": formatting.integer(overview.last_step),
        "steps_per_s": rates.steps_per_s,
        "steps_per_s_text": formatting.rate(rates.steps_per_s),
        "tokens_per_s": rates.tokens_per_s,
        "tokens_per_s_text": formatting.rate(rates.tokens_per_s),
        "last_seen": overview.last_seen_at.isoformat() if overview.last_seen_at else None,
        "last_seen_epoch": overview.last_seen_at.timestamp() if overview.last_seen_at else None,
        "last_seen_ago": formatting.ago(overview.last_seen_at, now),
        "last_seen_exact": formatting.exact(overview.last_seen_at),
    }


def runs_rows(runs, now: datetime) -> list[dict[str, Any]]:
    return [run_row(overview, now) for overview in queries.run_overviews(runs)]


def run_header(run: Run, now: datetime) -> dict[str, Any]:
    overview = queries.run_overview(run)
    header = run_row(overview, now)
    header.update(
        latest_loss=overview.latest_loss,
        latest_loss_text=formatting.number(overview.latest_loss),
        started_exact=formatting.exact(overview.first_step_at),
        started_ago=formatting.ago(overview.first_step_at, now),
        polling=run.status not in FINAL_STATUSES,
    )
    return header


def run_series(run: Run, now: datetime,
               window: tuple[datetime, datetime] | None = None) -> dict[str, Any]:
    """Everything the run page redraws on a refresh: header numbers and the three figures.

    Up to RAW_STEP_ROWS_LIMIT step rows in the ranks shown, the charts are drawn from the rows
    themselves (every step, downsampled keeping each bucket's extremes). Beyond that they are
    drawn from the per-minute rollups, so a run of weeks costs what a run of hours does: loss
    is each minute's mean, throughput the minute's tokens over the time its steps took, and step
    duration the minute's slowest step, so a slow step is never averaged away. Beyond
    MINUTE_ROWS_LIMIT minutes they are drawn from the quarter-hour rollups: each quarter's lowest
    and highest of those minute values, which is what downsampling the minutes would keep. A
    ``window``
    [since, until) narrows the charts to that time: zoomed in far enough, they show every step
    again."""
    # Not bounded by world_size: a launcher that under-reports it must not hide ranks.
    ranks = range(MAX_RANK_TRACES)
    quarters = queries.run_step_quarters_by_rank(run, ranks, window)
    if sum(float(q.minutes.sum()) for q in quarters.values()) > MINUTE_ROWS_LIMIT:
        charts_by_name, shown, resolution = _quarter_charts(quarters), len(quarters), "quarter"
    else:
        charts_by_name, shown, resolution = _minute_or_step_charts(run, ranks, window)
    return {
        "run": run_header(run, now),
        "ranks_shown": shown,
        "ranks_total": max(run.world_size, shown),
        "resolution": resolution,
        "window": [t.timestamp() for t in window] if window else None,
        "charts": charts_by_name,
        "generated_at": now.isoformat(),
    }


def _minute_or_step_charts(run: Run, ranks: range,
                           window: tuple[datetime, datetime] | None) -> tuple[dict, int, str]:
    minutes = queries.run_step_minutes_by_rank(run, ranks, window)
    summarised = sum(float(m.steps.sum()) for m in minutes.values())
    if summarised > RAW_STEP_ROWS_LIMIT:
        return _minute_charts(minutes), len(minutes), "minute"
    steps_by_rank = queries.run_steps_by_rank(run, ranks, window)
    return _step_charts(steps_by_rank), len(steps_by_rank), "step"


def _step_charts(steps_by_rank: dict[int, queries.RankSteps]) -> dict[str, Any]:
    unit = throughput.rate_unit(t for rank in steps_by_rank.values() for t in rank.tokens)
    loss = {rank: (s.step, s.loss) for rank, s in steps_by_rank.items()}
    duration = {rank: (s.step, s.duration_s) for rank, s in steps_by_rank.items()}
    rate = {
        rank: (s.ts, throughput.step_rates(s.duration_s, s.tokens, unit))
        for rank, s in steps_by_rank.items()
    }
    return {
        "loss": charts.loss_figure(loss),
        "throughput": charts.throughput_figure(rate, unit),
        "duration": charts.step_duration_figure(duration),
    }


def _minute_charts(minutes: dict[int, queries.RankMinutes]) -> dict[str, Any]:
    unit = (throughput.TOKENS_PER_S if any(m.tokens.sum() > 0 for m in minutes.values())
            else throughput.STEPS_PER_S)
    # Ingest and rebuild always set a minute's last step, but rows written any other way may leave
    # it null (NaN here): such a minute has no place on a step axis (cast, it would sit at step
    # -9.2e18), so loss and duration leave it off; throughput, against time, keeps it.
    placed = {rank: ~np.isnan(m.last_step) for rank, m in minutes.items()}
    step = {rank: m.last_step[placed[rank]].astype(np.int64) for rank, m in minutes.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = {rank: (step[rank], (m.loss_sum / m.loss_n)[placed[rank]])
                for rank, m in minutes.items()}
    duration = {rank: (step[rank], m.duration_max[placed[rank]]) for rank, m in minutes.items()}
    rate = {
        rank: (m.minute, throughput.minute_rates(m.tokens, m.duration_sum, m.duration_n, unit))
        for rank, m in minutes.items()
    }
    return {
        "loss": charts.loss_figure(loss, note="mean per minute"),
        "throughput": charts.throughput_figure(rate, unit, note="per minute"),
        "duration": charts.step_duration_figure(duration, note="slowest step per minute"),
    }


def _quarter_charts(quarters: dict[int, queries.RankQuarters]) -> dict[str, Any]:
    """The minute charts drawn from each quarter hour's lowest and highest minute: what the
    minute charts' min/max downsampling keeps of a run this long, read at 1/15 of the rows."""
    use_tokens = any(q.tokens.sum() > 0 for q in quarters.values())
    unit = throughput.TOKENS_PER_S if use_tokens else throughput.STEPS_PER_S
    rate = "token_rate" if use_tokens else "step_rate"

    def points(name: str, x: str, *, steps: bool) -> dict[int, tuple]:
        return {rank: _extreme_points(getattr(q, f"{name}_low{x}"), getattr(q, f"{name}_low"),
                                      getattr(q, f"{name}_high{x}"), getattr(q, f"{name}_high"),
                                      steps=steps)
                for rank, q in quarters.items()}

    note = "; each 15 min's lowest and highest"
    return {
        "loss": charts.loss_figure(points("loss", "_step", steps=True),
                                   note="mean per minute" + note),
        "throughput": charts.throughput_figure(points(rate, "_at", steps=False), unit,
                                               note="per minute" + note),
        "duration": charts.step_duration_figure(points("slowest", "_step", steps=True),
                                                note="slowest step per minute" + note),
    }


def _extreme_points(x_low: np.ndarray, low: np.ndarray, x_high: np.ndarray, high: np.ndarray,
                    *, steps: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each quarter's low and high as two points in x order (one where they are the same
    minute), quarters in time order; quarters without a value are left out."""
    low_first = ~(x_high < x_low)
    x = np.column_stack((np.where(low_first, x_low, x_high), np.where(low_first, x_high, x_low)))
    y = np.column_stack((np.where(low_first, low, high), np.where(low_first, high, low)))
    y[(x_low == x_high) & (low == high), 1] = np.nan
    x, y = x.ravel(), y.ravel()
    kept = np.isfinite(y) & np.isfinite(x)
    x, y = x[kept], y[kept]
    return (x.astype(np.int64) if steps else x), y
