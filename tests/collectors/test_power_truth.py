"""Truth recovery: a simulated cluster run stored through the real ingest path; the Power and GPU
health analyses find what the simulator planted (collectors.simulation.GroundTruth).

Tolerances: a planted swing is found when one of ours starts within 60 s of it (the truth's edge
vs our 10%-90% transition, sampled every 10 s), has the same cause, and its size is within 5% of
the planted one (the truth is noise-free; ours sums 16 noisy sensors, ~0.3% of the swing). A hot
GPU's distance from the fleet median is within 3 °C of the planted excess (leakage and the
states' cooling move it a little)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from collectors.models import Project, Run
from collectors.simulation import SimConfig, run_simulation
from dashboard.views import cluster_presenters

pytestmark = pytest.mark.django_db

CONFIG = SimConfig(project="powertruth", run_name="power-truth", gpus=16, days=1.0, seed=21,
                   start=datetime(2026, 7, 1, 0, 0, tzinfo=UTC), interruptions=2, stalls=2)
SIZE_TOLERANCE = 0.05
TIME_TOLERANCE_S = 60.0
HOT_TOLERANCE_C = 3.0


@pytest.fixture(scope="module")
def truth(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        planted = run_simulation(CONFIG)
        yield planted
        Project.objects.filter(slug=CONFIG.project).delete()


@pytest.fixture
def run(truth) -> Run:
    return Run.objects.get(pk=truth.run_id)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _match(planted: dict, swings):
    """Our swing for a planted one: starts within the time tolerance, same direction."""
    at = _epoch(planted["start"])
    near = [s for s in swings if abs(s.start - at) <= TIME_TOLERANCE_S
            and (s.delta_kw > 0) == (planted["delta_kw"] > 0)]
    return min(near, key=lambda s: abs(s.start - at)) if near else None


def _assert_recovered(planted: dict, found) -> None:
    assert found is not None, f"planted swing not found: {planted}"
    assert found.cause == planted["cause"], (planted, found)
    assert found.delta_kw == pytest.approx(planted["delta_kw"],
                                           rel=SIZE_TOLERANCE), (planted, found)


def test_the_largest_planted_swing_is_found_with_its_cause_and_size(truth, run):
    view = cluster_presenters.power_view(run)  # what the page shows
    largest = truth.swings[0]
    _assert_recovered(largest, _match(largest, view.swings))
    # And our largest is a planted one, as large within the tolerance.
    ours = view.swings[0]
    planted = next(p for p in truth.swings if _match(p, [ours]) is ours)
    assert planted["cause"] == ours.cause
    assert abs(ours.delta_kw) == pytest.approx(abs(largest["delta_kw"]), rel=SIZE_TOLERANCE)


def test_every_large_planted_swing_is_found_and_nothing_large_is_invented(truth, run,
                                                                         monkeypatch):
    # Every swing of the run, per second, not only the page's table.
    monkeypatch.setattr(cluster_presenters, "RAW_SAMPLES_LIMIT", 10**9)
    monkeypatch.setattr(cluster_presenters, "MAX_SWINGS", 10_000)
    view = cluster_presenters.power_view(run)
    top = abs(truth.swings[0]["delta_kw"])
    large = [p for p in truth.swings if abs(p["delta_kw"]) >= 0.5 * top]
    assert {p["cause"] for p in large} == {"restart", "interruption", "stall", "checkpoint"}
    for planted in large:
        _assert_recovered(planted, _match(planted, view.swings))
    for swing in view.swings:
        if abs(swing.delta_kw) >= 0.5 * top:
            assert any(_match(p, [swing]) is swing for p in truth.swings), swing


def test_the_rollup_path_finds_the_same_largest_swings_as_raw_samples(truth, run, monkeypatch):
    monkeypatch.setattr(cluster_presenters, "RAW_SAMPLES_LIMIT", 10**9)
    per_second = cluster_presenters.power_view(run)
    assert per_second.per_minute is False
    monkeypatch.setattr(cluster_presenters, "RAW_SAMPLES_LIMIT", 1000)
    per_minute = cluster_presenters.power_view(run)
    assert per_minute.per_minute is True
    count = 8
    assert [(round(s.start), round(s.delta_kw, 1), s.cause) for s in per_minute.swings[:count]] \
        == [(round(s.start), round(s.delta_kw, 1), s.cause) for s in per_second.swings[:count]]


def test_planted_hot_gpus_top_the_hottest_and_throttling_lists(truth, run):
    view = cluster_presenters.gpu_health_view(run)
    hot = {f"{h['host']}:{h['gpu']}": h for h in truth.hot_gpus}
    assert hot
    hottest = view.hottest[:len(hot)]
    assert {g.name for g in hottest} == set(hot)
    for gpu in hottest:
        assert gpu.above_median_c == pytest.approx(hot[gpu.name]["extra_c"], abs=HOT_TOLERANCE_C)
    # Nobody else is anywhere near: the next GPU is within a few degrees of the median.
    assert view.hottest[len(hot)].above_median_c < 5.0
    throttling = {g.name for g in view.throttling}
    assert throttling == {name for name, h in hot.items() if h["throttling"]}
    assert all("SW thermal slowdown" in g.throttle_reasons for g in view.throttling)
