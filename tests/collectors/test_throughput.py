"""Recent throughput and per-step rates, on hand-computed rows."""

from __future__ import annotations

import math

import pytest

from collectors.analysis.throughput import (
    STEPS_PER_S,
    TOKENS_PER_S,
    StepSample,
    WindowAggregate,
    aggregate_window,
    rate_unit,
    recent_throughput,
    recent_window,
    step_rates,
    throughput_from_aggregate,
)


def _rows(ranks: int, steps: range, every_s: float, tokens: int | None = None):
    return [StepSample(rank=r, ts=1000.0 + s * every_s, tokens=tokens)
            for r in range(ranks) for s in steps]


def test_window_is_the_last_minute_of_rows_not_reaching_before_the_first():
    assert recent_window(0.0, 500.0) == (440.0, 500.0)
    assert recent_window(480.0, 500.0) == (480.0, 500.0)
    assert recent_window(0.0, 500.0, window_s=10) == (490.0, 500.0)


def test_steps_per_second_is_per_rank_and_tokens_are_summed_across_ranks():
    # 4 ranks, a step every 0.5 s for 200 s: the last 60 s hold 120 steps per rank.
    rates = recent_throughput(_rows(4, range(1, 401), 0.5, tokens=1000))
    assert rates.steps_per_s == pytest.approx(2.0)
    assert rates.tokens_per_s == pytest.approx(4 * 2.0 * 1000)


def test_young_run_counts_intervals_not_rows():
    rates = recent_throughput(_rows(1, range(0, 11), 1.0, tokens=10))
    assert rates.steps_per_s == pytest.approx(1.0)
    assert rates.tokens_per_s == pytest.approx(10.0)


def test_window_is_anchored_at_the_newest_row():
    # A run that stopped long ago still shows the pace it had.
    rows = _rows(2, range(1, 1001), 1.0)
    aggregate = aggregate_window(rows)
    assert aggregate == WindowAggregate(span_s=60.0, step_rows=120, ranks=2, tokens=None)
    rates = throughput_from_aggregate(aggregate)
    assert rates.steps_per_s == pytest.approx(1.0)
    assert rates.tokens_per_s is None


def test_row_order_does_not_matter():
    rows = _rows(2, range(1, 301), 0.25, tokens=7)
    assert recent_throughput(rows) == recent_throughput(list(reversed(rows)))


def test_no_rows_or_one_row_has_no_rate():
    assert recent_throughput([]).steps_per_s is None
    single = recent_throughput([StepSample(rank=0, ts=5.0, tokens=3)])
    assert single.steps_per_s is None and single.tokens_per_s is None


def test_aggregate_from_sql_gives_the_same_rates():
    rates = throughput_from_aggregate(WindowAggregate(span_s=60, step_rows=240, ranks=2,
                                                      tokens=240 * 512))
    assert rates.steps_per_s == pytest.approx(2.0)
    assert rates.tokens_per_s == pytest.approx(2048.0)
    assert throughput_from_aggregate(None).steps_per_s is None
    assert throughput_from_aggregate(WindowAggregate(0, 0, 0, None)).steps_per_s is None


def test_partial_tokens_sum_what_was_reported():
    rows = [StepSample(0, 1.0, None), StepSample(0, 2.0, 50), StepSample(0, 3.0, 50)]
    assert recent_throughput(rows).tokens_per_s == pytest.approx(50.0)


def test_rate_unit_is_tokens_when_any_step_reports_tokens():
    assert rate_unit([None, None]) == STEPS_PER_S
    assert rate_unit([None, 8]) == TOKENS_PER_S
    assert rate_unit([]) == STEPS_PER_S


def test_step_rates_divide_by_duration_and_skip_unusable_steps():
    durations = [0.5, 2.0, None, 0.0, -1.0, math.inf, 1.0]
    tokens = [100, 100, 100, 100, 100, 100, None]
    assert step_rates(durations, tokens, TOKENS_PER_S) == [200.0, 50.0, None, None, None, None,
                                                           None]
    assert step_rates(durations, tokens, STEPS_PER_S) == [2.0, 0.5, None, None, None, None, 1.0]


def test_step_rates_need_equal_columns():
    with pytest.raises(ValueError):
        step_rates([1.0], [1, 2], TOKENS_PER_S)
