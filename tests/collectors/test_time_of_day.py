"""Throughput against the time of day: crafted per-minute rollups (DST days, empty hours, restarts,
runs without tokens or durations) and the query layer on real StepMinute/GpuMinute rows."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from collectors import rollups
from collectors.analysis.time_of_day import (
    GpuMinuteTotals,
    StepMinuteTotals,
    pearson,
    read_time_of_day,
    time_of_day,
)
from collectors.models import GpuMinute, Run, StepMinute

CHICAGO = ZoneInfo("America/Chicago")
TOKENS_PER_STEP = 1000  # per rank


def minute_totals(start: datetime, minutes: int, step_s, *, ranks: int = 4,
                  steps: int = 10, tokens: bool = True) -> list[StepMinuteTotals]:
    """``minutes`` consecutive minutes from ``start``; ``step_s(local datetime)`` is the mean step
    time of that minute; each of ``ranks`` ranks did ``steps`` steps."""
    rows = []
    for i in range(minutes):
        when = start + timedelta(minutes=i)
        duration = step_s(when.astimezone(CHICAGO))
        rows.append(StepMinuteTotals(when.timestamp(), ranks, ranks * steps,
                                     ranks * steps * TOKENS_PER_STEP if tokens else 0,
                                     ranks * steps, ranks * steps * duration))
    return rows


def slower_in_the_afternoon(local: datetime) -> float:
    # 6 s at night, 2% slower (6.12 s) from 12:00 to 17:59 local time.
    return 6.12 if 12 <= local.hour < 18 else 6.0


def test_afternoon_slowdown_is_measured_exactly_against_the_run_median():
    start = datetime(2026, 6, 1, 5, 0, tzinfo=UTC)  # local midnight (CDT, UTC-5)
    result = time_of_day(minute_totals(start, 3 * 1440, slower_in_the_afternoon), [],
                         "America/Chicago")
    fast = 4 * TOKENS_PER_STEP / 6.0  # 4 ranks' tokens per step / step time
    slow = 4 * TOKENS_PER_STEP / 6.12
    assert result.unit == "tokens/s" and result.basis == "step time"
    assert result.run_median == pytest.approx(fast)  # 18 of 24 hours are fast
    assert result.hourly_deviation_pct[3] == pytest.approx(0.0)
    assert result.hourly_deviation_pct[14] == pytest.approx(100 * (slow / fast - 1))
    assert result.amplitude_pp == pytest.approx(100 * (1 - 6.0 / 6.12))
    assert result.slowest_hour == 12 and result.fastest_hour == 0
    assert result.hourly_minutes == [180] * 24
    assert [d.day for d in result.days] == [date(2026, 6, 1), date(2026, 6, 2), date(2026, 6, 3)]
    assert all(d.deviation_pct == result.hourly_deviation_pct for d in result.days)


def test_spring_forward_day_has_no_2am_and_fall_back_counts_both_1ams_in_hour_1():
    # Local midnight to midnight on both DST days in Chicago (23 h and 25 h long).
    spring = datetime(2026, 3, 8, 0, 0, tzinfo=CHICAGO).astimezone(UTC)
    fall = datetime(2026, 11, 1, 0, 0, tzinfo=CHICAGO).astimezone(UTC)
    rows = (minute_totals(spring, 23 * 60, lambda local: 6.0 + 0.01 * local.hour)
            + minute_totals(fall, 25 * 60, lambda local: 6.0 + 0.01 * local.hour))
    result = time_of_day(rows, [], "America/Chicago")
    by_day = {d.day: d.deviation_pct for d in result.days}
    assert by_day[date(2026, 3, 8)][2] is None
    assert by_day[date(2026, 3, 8)][3] is not None
    assert result.hourly_minutes[2] == 60  # only the November day has a 2 o'clock
    assert result.hourly_minutes[1] == 60 + 120  # March 1:00, and November's 1:00 twice
    assert sum(result.hourly_minutes) == 48 * 60
    # Local hour h was planted at 6 + 0.01 h s: the hourly order follows the local clock exactly.
    rates = [r for r in result.hourly_rate if r is not None]
    assert rates == sorted(rates, reverse=True)


def test_hours_without_steps_are_empty_and_left_out_of_the_amplitude():
    # Training only from 09:00 to 16:59 local, two days; hour 9 is 3% slower.
    rows = []
    for day in (1, 2):
        start = datetime(2026, 6, day, 9, 0, tzinfo=CHICAGO).astimezone(UTC)
        rows += minute_totals(start, 8 * 60, lambda local: 6.18 if local.hour == 9 else 6.0)
    result = time_of_day(rows, [], "America/Chicago")
    present = [h for h, v in enumerate(result.hourly_deviation_pct) if v is not None]
    assert present == list(range(9, 17))
    assert result.amplitude_pp == pytest.approx(100 * (1 - 6.0 / 6.18))
    assert result.hourly_minutes[8] == 0 and result.hourly_rate[8] is None


def test_a_restart_minute_is_not_slow_and_too_few_minutes_make_no_hour():
    start = datetime(2026, 6, 1, 15, 0, tzinfo=UTC)
    rows = minute_totals(start, 60, lambda local: 6.0)
    # Minutes around a restart: few steps, but each as fast as ever.
    rows += [StepMinuteTotals((start + timedelta(minutes=90 + i)).timestamp(), 4, 4, 4000, 4, 24.0)
             for i in range(4)]
    result = time_of_day(rows, [], "UTC")
    assert result.hourly_deviation_pct[15] == pytest.approx(0.0)
    assert result.hourly_minutes[16] == 4 and result.hourly_deviation_pct[16] is None
    assert result.minutes == 64


def test_run_without_tokens_is_measured_in_steps_and_without_durations_on_the_wall_clock():
    start = datetime(2026, 6, 1, 0, 0, tzinfo=UTC)
    steps_only = time_of_day(minute_totals(start, 120, lambda local: 5.0, tokens=False), [], "UTC")
    assert steps_only.unit == "steps/s" and steps_only.run_median == pytest.approx(0.2)
    untimed = [StepMinuteTotals(m.minute, m.ranks, m.steps, m.tokens, 0, 0.0)
               for m in minute_totals(start, 120, lambda local: 5.0)]
    wall = time_of_day(untimed, [], "UTC")
    assert wall.basis == "wall clock" and wall.run_median == pytest.approx(40 * 1000 / 60)


def test_temperature_per_hour_counts_productive_minutes_only_and_correlates():
    start = datetime(2026, 6, 1, 5, 0, tzinfo=UTC)
    rows = minute_totals(start, 2 * 1440, slower_in_the_afternoon)
    temps = [GpuMinuteTotals(r.minute, 8 * (80.0 if 12 <= datetime.fromtimestamp(
        r.minute, CHICAGO).hour < 18 else 60.0), 8) for r in rows]
    # A cold GPU minute outside any step minute (a restart) must not pull the hour down.
    temps.append(GpuMinuteTotals((start + timedelta(days=5)).timestamp(), 8 * 20.0, 8))
    result = time_of_day(rows, temps, "America/Chicago")
    assert result.hourly_temp_c[13] == pytest.approx(80.0)
    assert result.hourly_temp_c[2] == pytest.approx(60.0)
    assert result.hottest_hour == 12
    assert result.correlation.n == 24
    assert result.correlation.r == pytest.approx(-1.0)
    assert result.correlation.p_value < 1e-10


def test_pearson_is_none_without_variance_or_points_and_gives_a_p_value():
    assert pearson([1.0, 2.0], [2.0, 4.0]).r is None
    assert pearson([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]).r is None
    xs = [math.sin(i) for i in range(24)]
    ys = [math.cos(i * 1.7) for i in range(24)]
    weak = pearson(xs, ys)
    assert weak.n == 24 and abs(weak.r) < 0.4 and weak.p_value > 0.05
    strong = pearson(xs, [2 * x + 0.1 * y for x, y in zip(xs, ys, strict=True)])
    assert strong.r > 0.99 and strong.p_value < 1e-6


def test_empty_run_and_unknown_zone():
    result = time_of_day([], [], "Mars/Olympus_Mons")
    assert result.timezone == "UTC" and result.run_median is None
    assert result.amplitude_pp is None and result.days == []
    assert result.correlation.r is None


@pytest.mark.django_db
def test_query_layer_reads_the_rollups_and_matches_the_pure_analysis(project):
    run = Run.objects.create(project=project, name="tod", timezone="Asia/Kolkata")  # UTC+5:30
    start = datetime(2026, 6, 1, 0, 0, tzinfo=UTC)
    steps, gpus = [], []
    for i in range(1440):
        minute = start + timedelta(minutes=i)
        local_hour = minute.astimezone(ZoneInfo("Asia/Kolkata")).hour
        for rank in range(3):
            duration = 6.0 * (1.01 if local_hour == 14 else 1.0) + 0.01 * rank
            steps.append(StepMinute(run=run, rank=rank, minute=minute, steps=10, duration_n=10,
                                    duration_sum=10 * duration, tokens=10 * 2048))
        for gpu in range(2):
            gpus.append(GpuMinute(run=run, host="node0", gpu=gpu, minute=minute, samples=6,
                                  temp_n=6, temp_sum=6 * (70.0 + local_hour / 10)))
    StepMinute.objects.bulk_create(steps)
    GpuMinute.objects.bulk_create(gpus)
    rollups.derive_coarse(run.pk)  # HostMinute, as ingest would have kept it
    result = read_time_of_day(run)
    assert result.timezone == "Asia/Kolkata" and result.minutes == 1440
    # The 14:00 hour in Kolkata is 08:30–09:29 UTC: 60 whole minutes, all 1% slower.
    assert result.hourly_deviation_pct[14] == pytest.approx(100 * (6.01 / 6.07 - 1))
    assert result.hourly_temp_c[14] == pytest.approx(71.4)
    assert result.run_median == pytest.approx(3 * 2048 / 6.01)


@pytest.mark.django_db
def test_recovers_the_simulators_planted_diurnal_swing(project):
    from collectors.models import IngestToken
    from collectors.simulation import SimConfig, run_simulation

    # Two days of 16 GPUs, steps from one rank per host: ~60k step rows and 46k GPU samples.
    truth = run_simulation(SimConfig(project="llm", run_name="diurnal", gpus=16, days=2, seed=7,
                                     diurnal_slowdown_pct=1.5, stragglers=0, step_ranks=[0, 8],
                                     sample_interval_s=60.0),
                           token=IngestToken.issue(project)[1])
    result = read_time_of_day(Run.objects.get(pk=truth.run_id))
    assert result.timezone == truth.site_timezone
    assert truth.diurnal_amplitude_pct > 1.0
    assert abs(result.amplitude_pp - truth.diurnal_amplitude_pct) <= 0.2
    pairs = [(ours, planted) for ours, planted in zip(result.hourly_deviation_pct,
                                                       truth.hourly_deviation_pct, strict=True)
             if ours is not None and planted is not None]
    assert len(pairs) == 24
    assert pearson([p[0] for p in pairs], [p[1] for p in pairs]).r > 0.95
    assert max(abs(ours - planted) for ours, planted in pairs) < 0.2
    # The heat of the afternoon is the slow time, and the GPUs' temperature says so.
    assert result.correlation.n == 24 and result.correlation.r < -0.8


@pytest.mark.django_db
def test_a_run_over_the_row_budget_is_read_every_kth_minute_and_says_so(project, monkeypatch):
    from collectors import minute_sample

    run = Run.objects.create(project=project, name="long", timezone="UTC")
    start = datetime(2026, 6, 1, tzinfo=UTC)
    steps, gpus = [], []
    for i in range(2 * 1440):
        minute = start + timedelta(minutes=i)
        duration = 6.0 * (1.02 if 12 <= minute.hour < 18 else 1.0)
        for rank in range(2):
            steps.append(StepMinute(run=run, rank=rank, minute=minute, steps=10, duration_n=10,
                                    duration_sum=10 * duration, tokens=10 * 1000))
        for gpu in range(4):
            gpus.append(GpuMinute(run=run, host="node0", gpu=gpu, minute=minute, samples=6,
                                  temp_n=6, temp_sum=6 * (70.0 if 12 <= minute.hour < 18 else 60)))
    StepMinute.objects.bulk_create(steps)
    GpuMinute.objects.bulk_create(gpus)
    rollups.derive_coarse(run.pk)  # HostMinute, as ingest would have kept it
    exact = read_time_of_day(run)
    assert (exact.minutes_every, exact.gpu_minutes_every) == (1, 1)

    monkeypatch.setattr(minute_sample, "ROW_BUDGET", 1000)
    sampled = read_time_of_day(run)
    # 5,760 step rows for 1,000: every 6th minute; then 480 productive minutes × 1 host row
    # (HostMinute sums the host's 4 GPUs): all of them.
    assert (sampled.minutes_every, sampled.gpu_minutes_every) == (6, 1)
    assert sampled.minutes == 480
    assert sampled.amplitude_pp == pytest.approx(exact.amplitude_pp)
    assert sampled.hourly_temp_c == exact.hourly_temp_c
