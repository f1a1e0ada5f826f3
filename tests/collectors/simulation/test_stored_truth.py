"""A simulated run stored through the real ingest task: what the collectors and their analyses
read back is what the simulator planted."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from collectors import reliability
from collectors.models import Checkpoint, GpuSample, Interruption, Project, Run, StepMetric
from collectors.simulation import SimConfig, run_simulation
from collectors.simulation.config import LLAMA3_MIX
from collectors.simulation.physics import SW_THERMAL_SLOWDOWN

pytestmark = pytest.mark.django_db

CONFIG = SimConfig(
    project="simtest", run_name="stored-truth", gpus=16, days=0.5, seed=11,
    start=datetime(2026, 7, 1, 12, 0, tzinfo=UTC),
    # Every category equally likely, so one short run exercises several kinds of evidence.
    interruptions=6, interruption_mix={category: 1 for category in LLAMA3_MIX},
    checkpoint_every_steps=400, stalls=1,
)
#: ETTR: the goodput analysis counts each attempt's first step as startup and cannot see a stall
#: that recovered by itself; everything else is defined the same way.
ETTR_TOLERANCE = 0.003


@pytest.fixture(scope="module")
def truth(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        planted = run_simulation(CONFIG)
        yield planted
        Project.objects.filter(slug=CONFIG.project).delete()


@pytest.fixture
def run(truth) -> Run:
    return Run.objects.get(pk=truth.run_id)


def test_run_is_stored_with_its_site_timezone_attempts_and_end(truth, run):
    assert run.timezone == "America/Chicago"
    assert run.world_size == 16
    assert run.config["simulated"] is True and run.config["seed"] == CONFIG.seed
    assert run.status == Run.Status.FINISHED
    assert run.attempts.count() == truth.details["attempts"] == CONFIG.interruptions + 1
    assert StepMetric.objects.filter(run=run).count() == truth.details["rows_sent"]["steps"]
    assert GpuSample.objects.filter(run=run).count() == truth.details["rows_sent"]["gpu_samples"]


def test_collectors_classify_each_interruption_as_planted(truth, run):
    stored = list(Interruption.objects.filter(run=run).order_by("ts"))
    assert Counter(i.category for i in stored) == Counter(truth.interruptions)
    planted = truth.details["interruption_list"]
    assert [i.category for i in stored] == [p["category"] for p in planted]
    assert [i.host for i in stored] == [p["host"] for p in planted]
    assert sum(not i.expected for i in stored) == truth.unexpected_interruptions
    for interruption in stored:
        if interruption.category in ("gpu_hardware", "gpu_memory"):
            assert interruption.evidence.get("xids"), interruption.evidence


def test_checkpoints_are_stored_every_k_steps(truth, run):
    steps = sorted(set(Checkpoint.objects.filter(run=run, kind="save")
                       .values_list("step", flat=True)))
    assert steps == truth.details["checkpoint_steps"]
    assert steps and all(step % CONFIG.checkpoint_every_steps == 0 for step in steps)
    assert Checkpoint.objects.filter(run=run, kind="load").values("attempt").distinct().count() \
        == CONFIG.interruptions


def test_cluster_power_drops_while_a_checkpoint_is_saved(run):
    saves = Checkpoint.objects.filter(run=run, kind="save", rank=0)
    assert saves.count() >= 3
    for save in saves:
        began = save.ts.timestamp() - save.duration_s
        during = _mean_power(run, began + 1, save.ts.timestamp() - 1)
        before = _mean_power(run, began - 60, began - 1)
        assert during < 0.6 * before, (save.step, during, before)


def test_goodput_analysis_recovers_the_planted_ettr(truth, run):
    measured = reliability.run_goodput(run).ettr
    parts = truth.details["ettr_parts"]
    unseen_stalls = parts["stall_s"] / parts["wall_s"]
    assert truth.ettr < 0.99  # six interruptions in half a day cost something
    assert measured == pytest.approx(truth.ettr + unseen_stalls, abs=ETTR_TOLERANCE)


def test_planted_stragglers_report_slower_steps(truth, run):
    rows = np.array(StepMetric.objects.filter(run=run).values_list("rank", "step", "attempt_id",
                                                                   "duration_s"), dtype=float)
    keys = rows[:, 1] * 1000 + rows[:, 2]
    order = np.argsort(keys, kind="stable")
    ratio = np.empty(len(rows))
    sorted_keys = keys[order]
    bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
    for group in np.split(order, bounds):
        ratio[group] = rows[group, 3] / np.median(rows[group, 3])
    slow = {s["rank"]: s["slowdown"] for s in truth.stragglers}
    assert len(slow) == CONFIG.stragglers
    for rank in range(16):
        median_ratio = float(np.median(ratio[rows[:, 0] == rank]))
        assert median_ratio == pytest.approx(1.0 + slow.get(rank, 0.0), abs=0.01), rank


def test_hot_gpus_run_hot_and_throttle_and_no_other_gpu_does(truth, run):
    hot = {(g["host"], g["gpu"]) for g in truth.hot_gpus}
    assert len(hot) == CONFIG.hot_gpus
    samples = GpuSample.objects.filter(run=run)
    for host, gpu in hot:
        mine = samples.filter(host=host, gpu=gpu)
        assert max(mine.values_list("temp_c", flat=True)) >= CONFIG.thermal_limit_c
        assert any(bits & SW_THERMAL_SLOWDOWN for bits in mine.values_list("throttle", flat=True))
    throttled = {(h, g) for h, g, bits in samples.values_list("host", "gpu", "throttle")
                 if bits & SW_THERMAL_SLOWDOWN}
    assert throttled == hot


def test_stored_steps_carry_the_planted_time_of_day_swing(truth, run):
    # The planted definition, applied to what was stored: per step the median rank's time, per
    # local hour the tokens over the time, as % of the run's median tokens/s.
    rows = np.array(StepMetric.objects.filter(run=run, rank__in=range(16))
                    .values_list("step", "attempt_id", "duration_s", "ts"), dtype=object)
    by_step: dict[tuple, list] = {}
    for step, attempt, duration, ts in rows:
        by_step.setdefault((step, attempt), []).append((duration, ts))
    zone = ZoneInfo(run.timezone)
    durations, hours = [], []
    for values in by_step.values():
        durations.append(float(np.median([d for d, _ in values])))
        hours.append(min(ts for _, ts in values).astimezone(zone).hour)
    durations, hours = np.array(durations), np.array(hours)
    rate = 1.0 / durations
    median = np.median(rate)
    deviations = {h: 100 * ((hours == h).sum() / durations[hours == h].sum() / median - 1)
                  for h in set(hours.tolist())}
    amplitude = max(deviations.values()) - min(deviations.values())
    assert amplitude == pytest.approx(truth.diurnal_amplitude_pct, abs=0.2)
    for hour, deviation in deviations.items():
        assert deviation == pytest.approx(truth.hourly_deviation_pct[hour], abs=0.2)


def test_planted_power_swings_are_in_the_stored_samples(truth, run):
    """Cluster power (each GPU's latest sample, summed) one sample interval before a planted swing
    and one after it differs by the planted delta, for every swing the truth lists."""
    rows = GpuSample.objects.filter(run=run).order_by("ts").values_list("host", "gpu", "ts",
                                                                       "power_w")
    per_gpu: dict[tuple, list] = {}
    for host, gpu, ts, power in rows:
        per_gpu.setdefault((host, gpu), []).append((ts.timestamp(), power))
    per_gpu = {key: np.array(values) for key, values in per_gpu.items()}
    assert len(per_gpu) == 16

    def cluster_kw(at: float) -> float:
        total = 0.0
        for rows in per_gpu.values():
            i = np.searchsorted(rows[:, 0], at, side="right") - 1
            assert i >= 0
            total += rows[i, 1]
        return total / 1000.0

    swings = truth.swings
    assert {s["cause"] for s in swings} >= {"checkpoint", "restart", "interruption", "stall"}
    assert swings[0]["cause"] == "restart"  # the whole cluster ramps from startup to busy
    for swing in swings:
        start = datetime.fromisoformat(swing["start"]).timestamp()
        end = datetime.fromisoformat(swing["end"]).timestamp()
        measured = cluster_kw(end + 1) - cluster_kw(start - 1)
        # Sensor noise summed over 16 GPUs, and leakage that follows each sample's own noise.
        assert measured == pytest.approx(swing["delta_kw"], abs=0.1 * abs(swing["delta_kw"]) + 0.3), \
            swing


def _mean_power(run: Run, t0: float, t1: float) -> float:
    values = GpuSample.objects.filter(
        run=run, ts__gte=datetime.fromtimestamp(t0, tz=UTC), ts__lte=datetime.fromtimestamp(t1, tz=UTC),
    ).values_list("power_w", flat=True)
    assert values, "no samples in the window"
    return float(np.mean(list(values)))
