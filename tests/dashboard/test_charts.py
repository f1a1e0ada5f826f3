"""Chart builders and the min/max downsampler."""

from __future__ import annotations

import math
import random

import pytest

from dashboard.charts import (
    downsample_minmax,
    loss_figure,
    rank_color,
    throughput_figure,
)


def test_short_series_pass_through_unchanged():
    assert downsample_minmax([1, 2, 3], [3.0, 1.0, 2.0], 10) == ([1, 2, 3], [3.0, 1.0, 2.0])


def test_points_are_capped():
    x = list(range(100_000))
    y = [math.sin(i / 50) for i in x]
    xs, ys = downsample_minmax(x, y, 2000)
    assert len(xs) == len(ys) <= 2000
    assert xs == sorted(xs)


def test_every_spike_and_dip_survives():
    rng = random.Random(1)
    x = list(range(50_000))
    y = [1.0 + rng.random() * 0.1 for _ in x]
    y[12_345] = 99.0
    y[40_001] = -5.0
    xs, ys = downsample_minmax(x, y, 500)
    assert max(ys) == 99.0 and xs[ys.index(99.0)] == 12_345
    assert min(ys) == -5.0 and xs[ys.index(-5.0)] == 40_001


def test_each_bucket_keeps_its_extremes():
    # Buckets of 4 consecutive points: min and max of each, in x order.
    y = [1.0, 5.0, 3.0, 2.0, 9.0, 8.0, 0.0, 7.0]
    assert downsample_minmax(list(range(8)), y, 4) == ([0, 1, 4, 6], [1.0, 5.0, 9.0, 0.0])


def test_missing_and_non_finite_values_are_dropped():
    xs, ys = downsample_minmax([1, 2, 3, 4], [1.0, None, math.nan, 4.0], 10)
    assert (xs, ys) == ([1, 4], [1.0, 4.0])


def test_max_points_below_two_is_refused():
    with pytest.raises(ValueError):
        downsample_minmax([1], [1.0], 1)


def test_loss_figure_has_one_trace_per_rank_with_stable_colours():
    figure = loss_figure({1: ([1, 2], [3.0, 2.0]), 0: ([1, 2], [3.1, 2.1])})
    assert [t["name"] for t in figure["data"]] == ["rank 0", "rank 1"]
    assert figure["data"][1]["line"]["color"] == rank_color(1)
    assert figure["layout"]["uirevision"]


def test_throughput_figure_uses_a_date_axis_in_epoch_milliseconds():
    from datetime import UTC, datetime

    t = datetime(2026, 1, 1, tzinfo=UTC)
    figure = throughput_figure({0: ([t], [5.0])}, "tokens/s")
    assert figure["data"][0]["x"] == [t.timestamp() * 1000]
    assert figure["layout"]["xaxis"]["type"] == "date"
