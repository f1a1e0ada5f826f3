"""Cluster power per second (carried forward, staleness) and its swings with their causes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collectors.analysis import power
from collectors.analysis.power import Happening, cluster_power, find_swings

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


def test_a_gpus_last_value_is_carried_until_its_next_sample():
    # GPU 0 samples every 10 s at 500 W then 300 W; GPU 1 once at t=5 with 200 W.
    ts = [T0, T0 + 10, T0 + 5]
    gpu = [0, 0, 1]
    watts = [500.0, 300.0, 200.0]
    series = cluster_power(ts, gpu, watts, stale_after_s=30, min_coverage=0)
    assert series.start == T0 and len(series) == 11
    assert series.kw[:5].tolist() == [0.5] * 5
    assert series.kw[5:10].tolist() == [0.7] * 5
    assert series.kw[10] == pytest.approx(0.5)
    assert series.gpus[:5].tolist() == [1] * 5 and series.gpus[5:].tolist() == [2] * 6


def test_a_sample_between_seconds_counts_from_the_next_whole_second():
    series = cluster_power([T0 + 0.4, T0 + 2.6], [0, 0], [100.0, 300.0], stale_after_s=30,
                           start=T0, end=T0 + 4)
    assert math.isnan(series.kw[0])
    assert series.kw[1:].tolist() == [0.1, 0.1, 0.3, 0.3]


def test_a_stale_gpu_stops_counting_and_an_all_stale_second_is_a_gap_not_zero():
    # Two GPUs at 10 s; GPU 1 dies after t=20, GPU 0 after t=100; the range runs to t=200.
    ts = [T0 + t for t in range(0, 101, 10)] + [T0, T0 + 10, T0 + 20]
    gpu = [0] * 11 + [1] * 3
    watts = [600.0] * 11 + [400.0] * 3
    # Default staleness: 3 x 10 s. (Coverage off: see the next tests for partial sums.)
    series = cluster_power(ts, gpu, watts, end=T0 + 200, min_coverage=0)
    at = {int(t - T0): v for t, v in zip(series.times, series.kw, strict=True)}
    assert at[49] == pytest.approx(1.0)  # GPU 1's t=20 sample still carried (< 20 + 30)
    assert at[50] == pytest.approx(0.6)  # ...and no longer
    assert at[129] == pytest.approx(0.6)
    assert math.isnan(at[130]) and math.isnan(at[200])
    assert series.gpus[130] == 0
    # With the default coverage, a second that only GPU 0 covers is no cluster sum at all.
    covered = cluster_power(ts, gpu, watts, end=T0 + 200)
    assert covered.kw[49] == pytest.approx(1.0) and math.isnan(covered.kw[50])


def test_default_staleness_is_three_median_sample_intervals():
    ts = np.array([0, 5, 10, 15, 0, 5, 10], dtype=float)
    gpu = np.array([0, 0, 0, 0, 1, 1, 1])
    assert power.sample_interval(ts, gpu) == 5.0
    assert power.default_stale_after(ts, gpu) == 15.0
    assert power.default_stale_after(np.array([1.0]), np.array([0])) == power.DEFAULT_STALE_S


def test_samples_without_a_power_reading_are_ignored():
    series = cluster_power([T0, T0 + 1, T0 + 2], [0, 0, 0], [100.0, None, 300.0], stale_after_s=30)
    assert series.kw.tolist() == [0.1, 0.1, 0.3]


def _cluster_with_step(gpus=500, seconds=1200, drop_at=600.0, ramp_s=5, busy=700.0, low=100.0,
                       recover_at=None, noise_w=5.0, seed=1):
    """1 Hz samples of ``gpus`` GPUs; GPU i falls from busy to low at drop_at + (i % ramp_s), so
    the cluster steps down by gpus × (busy - low) over ramp_s seconds."""
    rng = np.random.default_rng(seed)
    t = np.arange(seconds, dtype=float)
    ts = np.tile(T0 + t, gpus)
    gpu = np.repeat(np.arange(gpus), seconds)
    offset = np.repeat(np.arange(gpus) % ramp_s + 1, seconds)
    rel = ts - T0
    down = rel >= drop_at + offset
    if recover_at is not None:
        down &= rel < recover_at + offset
    watts = np.where(down, low, busy) + rng.normal(0, noise_w, len(ts))
    return ts, gpu, watts


def test_a_planted_300_kw_fall_over_5_s_is_found_with_its_size_rate_and_checkpoint():
    ts, gpu, watts = _cluster_with_step(recover_at=660.0)
    series = cluster_power(ts, gpu, watts)
    swings = find_swings(series, window_s=60)
    checkpoint = Happening("checkpoint", T0 + 598, T0 + 660, "save at step 5000")
    interruption_later = Happening("interruption", T0 + 1100, T0 + 1100, "gpu_hardware")
    annotated = power.annotate(swings, [checkpoint, interruption_later], tolerance_s=30)
    # The fall and the recovery, nothing from the noise (5 W per GPU, ~0.1 kW summed).
    assert len(annotated) == 2
    fall = next(s for s in annotated if s.direction == "fall")
    assert fall.delta_kw == pytest.approx(-300.0, abs=2.0)
    assert fall.start == pytest.approx(T0 + 600, abs=0.1)
    assert fall.end == pytest.approx(T0 + 605, abs=0.1)
    assert fall.duration_s == pytest.approx(5.0, abs=0.1)
    assert fall.rate_kw_s == pytest.approx(-60.0, abs=1.5)
    assert fall.peak_rate_kw_s == pytest.approx(-60.0, abs=2.0)
    assert fall.cause == "checkpoint" and fall.happenings == (checkpoint,)
    rise = next(s for s in annotated if s.direction == "rise")
    assert rise.delta_kw == pytest.approx(300.0, abs=2.0) and rise.start == pytest.approx(T0 + 660, abs=0.1)


def test_a_swing_slower_than_the_window_is_measured_only_within_it():
    # 300 kW over 200 s is at most 90 kW per 60 s window.
    t = np.arange(600, dtype=float)
    kw = np.clip(600 - 1.5 * (t - 100), 300, 600)
    series = power.PowerSeries(T0, 1.0, kw, np.ones(600, dtype=np.int64))
    swings = find_swings(series, window_s=60, min_kw=10)
    assert max(abs(s.delta_kw) for s in swings) == pytest.approx(90.0)
    assert all(s.rate_kw_s == pytest.approx(-1.5) for s in swings)


def test_swings_do_not_overlap_and_come_largest_first():
    t = np.arange(1000, dtype=float)
    kw = np.full(1000, 500.0)
    kw[200:] -= 100  # fall of 100 at 200
    kw[400:] += 250  # rise of 250 at 400
    kw[700:] -= 50  # fall of 50 at 700
    series = power.PowerSeries(T0, 1.0, kw, np.ones(1000, dtype=np.int64))
    swings = find_swings(series, min_kw=20)
    assert [round(s.delta_kw) for s in swings] == [250, -100, -50]
    assert [s.start - T0 for s in swings] == [399, 199, 699]
    assert all(s.duration_s == 1.0 for s in swings)
    assert find_swings(series, min_kw=20, limit=1)[0].delta_kw == 250
    del t


def test_gaps_are_not_swings_but_a_short_gap_is_bridged():
    kw = np.full(300, 400.0)
    kw[100:110] = np.nan  # 10 s without telemetry, then lower
    kw[110:] = 200.0
    kw[200:] = np.nan  # the job died: silence to the end
    series = power.PowerSeries(T0, 1.0, kw, np.ones(300, dtype=np.int64))
    swings = find_swings(series)
    assert len(swings) == 1
    assert swings[0].delta_kw == -200.0 and swings[0].start == T0 + 99
    assert swings[0].end == T0 + 110


def test_causes_are_ranked_restart_over_its_checkpoint_load():
    swing = power.Swing(start=T0 + 100, end=T0 + 130, delta_kw=250, rate_kw_s=8.3,
                        peak_rate_kw_s=20, from_kw=50, to_kw=300)
    load = Happening("checkpoint", T0 + 60, T0 + 90, "load")
    restart = Happening("restart", T0 + 40, T0 + 105, "attempt 2")
    far = Happening("interruption", T0 + 500, T0 + 500)
    (annotated,) = power.annotate([swing], [load, restart, far], tolerance_s=30)
    assert annotated.cause == "restart"
    assert annotated.happenings == (restart, load)
    (alone,) = power.annotate([swing], [far], tolerance_s=30)
    assert alone.cause is None and alone.happenings == ()


def test_step_gaps_that_nothing_explains_are_stalls():
    steps = [0, 6, 12, 18, 140, 146, 152, 600, 606]
    gaps = power.step_gaps(steps, min_gap_s=60)
    assert gaps == [(18.0, 140.0), (152.0, 600.0)]
    checkpoint = Happening("checkpoint", 160, 590)
    stalls = power.stall_happenings(gaps, [checkpoint], 60)
    assert [(h.kind, h.start, h.end) for h in stalls] == [("stall", 18.0, 140.0)]
    # A save that ends and then a hang: the hang is what is left of the gap.
    save_then_hang = power.stall_happenings([(100.0, 300.0)], [Happening("checkpoint", 95, 165)], 60)
    assert [(h.start, h.end) for h in save_then_hang] == [(165.0, 300.0)]


def test_candidate_regions_from_minute_bounds_contain_the_swing():
    ts, gpu, watts = _cluster_with_step(gpus=50, seconds=3600, drop_at=1830.0)
    series = cluster_power(ts, gpu, watts)
    # The per-minute rollup: sum over GPUs of each GPU's mean, max and min that minute.
    minute = np.floor((ts - T0) / 60).astype(int)
    mean = np.zeros(60)
    upper = np.zeros(60)
    lower = np.zeros(60)
    for g in range(50):
        mine = gpu == g
        for m in range(60):
            values = watts[mine & (minute == m)]
            mean[m] += values.mean() / 1000
            upper[m] += values.max() / 1000
            lower[m] += values.min() / 1000
    minutes = power.minute_power(T0 + 60 * np.arange(60), mean, upper, lower, [50] * 60)
    regions = power.candidate_regions(minutes, min_kw=15, margin_s=30)
    assert regions and regions[0][0] <= T0 + 1830 <= regions[0][1]
    assert len(regions) == 1  # nothing else in the run can swing by 15 kW
    refined = []
    for lo, hi in regions:
        keep = (ts >= lo - 30) & (ts <= hi)
        refined.append(find_swings(cluster_power(ts[keep], gpu[keep], watts[keep], start=lo, end=hi),
                                   min_kw=15))
    whole = find_swings(series, min_kw=15)
    assert power.merge_swings(refined) == whole


def test_histogram_splits_rises_and_falls_on_shared_bins():
    swings = [power.Swing(0, 1, d, d, d, 0, d) for d in (-100.0, -40.0, 30.0, 95.0, 10.0)]
    histogram = power.swing_histogram(swings, bins=4)
    assert histogram.edges_kw == [0.0, 25.0, 50.0, 75.0, 100.0]
    assert histogram.rises == [1, 1, 0, 1]
    assert histogram.falls == [0, 1, 0, 1]
    assert power.swing_histogram([]).rises == []


def test_centered_max_matches_the_obvious_definition():
    rng = np.random.default_rng(3)
    values = rng.integers(0, 100, 1000).astype(float)
    for half in (0, 1, 7, 50, 2000):
        expected = [values[max(0, i - half):i + half + 1].max() for i in range(1000)]
        assert power.centered_max(values, half).tolist() == expected


def test_gpus_going_silent_one_by_one_are_a_gap_not_a_fall():
    # 20 GPUs at 500 W sampled every 10 s; the job dies at t=600 and each GPU's sampler stops
    # within the next 10 s. Carried forward, they go stale one by one: a partial sum, not a swing.
    ts, gpu, watts = [], [], []
    for g in range(20):
        for t in range(g % 10, 600 + g % 10, 10):
            ts.append(T0 + t)
            gpu.append(g)
            watts.append(500.0)
    series = cluster_power(ts, gpu, watts, end=T0 + 700)
    assert series.kw[100] == pytest.approx(10.0)
    assert find_swings(series) == []
    # Complete from t=9 (every GPU's first sample in) to t=619 (GPU 0's last goes stale at 620).
    assert not np.isnan(series.kw[9:620]).any()
    assert np.isnan(series.kw[:9]).all() and np.isnan(series.kw[620:]).all()
    assert series.gpus[620] == 18  # two GPUs per phase
    raw = cluster_power(ts, gpu, watts, end=T0 + 700, min_coverage=0)
    # What partial sums would have read: a rise as the samplers start, a fall as they stop.
    assert sorted(round(s.delta_kw) for s in find_swings(raw)) == [-9, 9]
