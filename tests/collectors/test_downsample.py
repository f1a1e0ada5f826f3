"""The peak-keeping downsampler: a spike or a dip is never averaged away."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from collectors.analysis.downsample import break_gaps, downsample, downsample_indices


def test_short_input_is_returned_unchanged():
    assert downsample([1, 2, 3], [3.0, 1.0, 2.0], 10) == ([1, 2, 3], [3.0, 1.0, 2.0])


def test_empty_input_gives_empty_output():
    assert downsample([], [], 100) == ([], [])
    assert downsample(np.array([]), np.array([]), 100) == ([], [])


def test_single_sample_spike_and_dip_survive():
    x = list(range(200_000))
    y = [500.0 + math.sin(i / 3000) for i in x]
    y[123_457] = 900.0  # one second of a power spike
    y[77_001] = 10.0  # one second of a dip
    xs, ys = downsample(x, y, 2000)
    assert len(xs) <= 2000
    assert (123_457, 900.0) in zip(xs, ys, strict=True)
    assert (77_001, 10.0) in zip(xs, ys, strict=True)
    assert max(ys) == 900.0 and min(ys) == 10.0


@pytest.mark.parametrize("max_points", [2, 3, 10, 101, 1000])
def test_output_never_exceeds_max_points_and_x_stays_monotone(max_points):
    rng = random.Random(max_points)
    x = sorted(rng.uniform(0, 1e6) for _ in range(20_000))
    y = [rng.gauss(0, 1) for _ in x]
    xs, ys = downsample(x, y, max_points)
    assert 0 < len(xs) <= max_points
    assert xs == sorted(xs)
    # A subsequence of the input: every kept point is a real sample.
    originals = dict(zip(x, y, strict=True))
    assert all(originals[xi] == yi for xi, yi in zip(xs, ys, strict=True))
    assert max(ys) == max(y) and min(ys) == min(y)


def test_every_bucket_keeps_its_min_and_max_in_time_order():
    y = [1.0, 5.0, 3.0, 2.0, 9.0, 0.0, 4.0, 4.0]
    # Four points allowed -> two buckets of equal x width: [0, 3.5) and [3.5, 7].
    assert downsample(list(range(8)), y, 4) == ([0, 1, 4, 5], [1.0, 5.0, 9.0, 0.0])


def test_missing_and_non_finite_values_are_dropped():
    xs, ys = downsample([1, 2, 3, 4, 5], [1.0, None, math.nan, math.inf, 4.0], 10)
    assert (xs, ys) == ([1, 5], [1.0, 4.0])


def test_buckets_are_equal_in_time_not_in_count():
    # A dense burst of 10,000 samples in one second and one sample per second for an hour after:
    # the hour must not be squeezed into a couple of buckets.
    x = [i / 10_000 for i in range(10_000)] + [float(s) for s in range(1, 3601)]
    y = [1.0] * 10_000 + [float(s % 7) for s in range(1, 3601)]
    xs, _ = downsample(x, y, 400)
    assert len([v for v in xs if v >= 1.0]) > 300


def test_datetimes_and_numpy_arrays_are_accepted():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    times = [start + timedelta(seconds=s) for s in range(5000)]
    values = np.full(5000, 100.0)
    values[4321] = 250.0
    xs, ys = downsample(times, values, 100)
    assert len(xs) <= 100 and times[4321] in xs and 250.0 in ys
    xs_np, ys_np = downsample(np.arange(5000, dtype=float), values, 100)
    assert 4321.0 in xs_np and isinstance(xs_np[0], float)


def test_indices_let_a_caller_keep_aligned_columns():
    y = [0.0] * 1000
    y[500] = 7.0
    keep = downsample_indices(list(range(1000)), y, 50)
    assert 500 in keep.tolist() and len(keep) <= 50
    assert list(keep) == sorted(keep)


def test_unsorted_x_and_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="non-decreasing"):
        downsample([3, 1, 2], [1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="at least 2"):
        downsample([1], [1.0], 1)
    with pytest.raises(ValueError, match="same length"):
        downsample([1, 2], [1.0], 10)


def test_equal_x_falls_back_to_equal_counts():
    xs, ys = downsample([5.0] * 100, [float(i % 10) for i in range(100)], 10)
    assert len(xs) <= 10 and 9.0 in ys and 0.0 in ys


def test_break_gaps_inserts_a_break_only_across_long_gaps():
    x, y = break_gaps([0, 10, 20, 620, 630], [1.0, 2.0, 3.0, 4.0, 5.0], max_gap=60)
    assert x == [0, 10, 20, 320.0, 620, 630]
    assert y == [1.0, 2.0, 3.0, None, 4.0, 5.0]
