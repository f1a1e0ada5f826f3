"""Throughput of a run: the recent rate shown on the runs list and the per-step rate charted on the
run page. Pure functions: rows or aggregates in, numbers out.

The recent rate is measured over the newest RECENT_WINDOW_S seconds of a run's step rows, anchored
at its newest row rather than at "now", so a finished or stalled run still shows the pace it had
(the list's status column says it stopped). The window is half-open, (end - span, end], and never
reaches back before the run's first row: a run younger than the window is measured over its whole
life, and because its first row sits on the open edge, N rows one second apart give exactly 1/s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

RECENT_WINDOW_S = 60.0


@dataclass(frozen=True)
class StepSample:
    """The part of one StepMetric row that throughput needs. ``ts`` is Unix seconds."""

    rank: int
    ts: float
    tokens: int | None = None


@dataclass(frozen=True)
class WindowAggregate:
    """A run's step rows inside its recent window, reduced to sums (what SQL returns)."""

    span_s: float  # length of the window actually covered
    step_rows: int
    ranks: int
    tokens: int | None  # None when no row in the window reported tokens


@dataclass(frozen=True)
class Throughput:
    steps_per_s: float | None
    tokens_per_s: float | None


NO_THROUGHPUT = Throughput(steps_per_s=None, tokens_per_s=None)


def recent_window(
    first_ts: float, last_ts: float, window_s: float = RECENT_WINDOW_S
) -> tuple[float, float]:
    """The (start, end] bounds of the recent window for a run whose rows span first_ts..last_ts."""
    return max(first_ts, last_ts - window_s), last_ts


def aggregate_window(
    samples: Iterable[StepSample], window_s: float = RECENT_WINDOW_S
) -> WindowAggregate | None:
    """Reduces a run's step rows (any order, any subset that includes its newest and oldest rows
    within reach) to the aggregate over the recent window; None when there are no rows."""
    rows = list(samples)
    if not rows:
        return None
    start, end = recent_window(min(r.ts for r in rows), max(r.ts for r in rows), window_s)
    inside = [r for r in rows if start < r.ts <= end]
    token_counts = [r.tokens for r in inside if r.tokens is not None]
    return WindowAggregate(
        span_s=end - start,
        step_rows=len(inside),
        ranks=len({r.rank for r in inside}),
        tokens=sum(token_counts) if token_counts else None,
    )


def throughput_from_aggregate(window: WindowAggregate | None) -> Throughput:
    """steps/s = step rows per rank per second; tokens/s = tokens summed across ranks per second.

    Dividing rows by ranks makes steps/s the pace of the job, not of the cluster: 8 ranks doing one
    step a second each is 1 step/s. Tokens are summed because each rank consumes its own tokens."""
    if window is None or window.span_s <= 0 or window.step_rows == 0 or window.ranks == 0:
        return NO_THROUGHPUT
    steps = window.step_rows / window.ranks / window.span_s
    tokens = None if window.tokens is None else window.tokens / window.span_s
    return Throughput(steps_per_s=steps, tokens_per_s=tokens)


def recent_throughput(
    samples: Iterable[StepSample], window_s: float = RECENT_WINDOW_S
) -> Throughput:
    return throughput_from_aggregate(aggregate_window(samples, window_s))


TOKENS_PER_S = "tokens/s"
STEPS_PER_S = "steps/s"


def rate_unit(tokens: Iterable[int | None]) -> str:
    """tokens/s when the run reports tokens at all, else steps/s. One unit for the whole run:
    mixing the two on one axis would put numbers 10^5 apart side by side."""
    return TOKENS_PER_S if any(t is not None for t in tokens) else STEPS_PER_S


def step_rates(
    durations_s: Sequence[float | None], tokens: Sequence[int | None], unit: str
) -> list[float | None]:
    """The instantaneous rate of each step, for the throughput-over-time chart: tokens / duration
    or 1 / duration by ``unit``. A step without a usable duration (missing, zero, negative,
    non-finite) or, in tokens/s, without a token count has no rate (None)."""
    rates: list[float | None] = []
    for duration, count in zip(durations_s, tokens, strict=True):
        if duration is None or not math.isfinite(duration) or duration <= 0:
            rates.append(None)
        elif unit == TOKENS_PER_S:
            rates.append(None if count is None else count / duration)
        else:
            rates.append(1.0 / duration)
    return rates


def minute_rates(tokens: np.ndarray, duration_sum: np.ndarray, duration_n: np.ndarray,
                 unit: str) -> np.ndarray:
    """The rate of each minute of a rank's steps, from its rollup sums: tokens over the time its
    steps took (tokens/s), or steps over that time (steps/s). The same quantity as step_rates
    over the minute's steps, weighted by their duration. A minute with no usable duration, or no
    tokens in tokens/s, has no rate (NaN)."""
    tokens, seconds, steps = (np.asarray(a, dtype=np.float64)
                              for a in (tokens, duration_sum, duration_n))
    usable = (steps > 0) & np.isfinite(seconds) & (seconds > 0)
    if unit == TOKENS_PER_S:
        usable &= np.isfinite(tokens) & (tokens > 0)
    numerator = tokens if unit == TOKENS_PER_S else steps
    rates = np.full(len(seconds), np.nan)
    np.divide(numerator, seconds, out=rates, where=usable)
    return rates
