"""The run page of a long run: charts drawn from the per-minute rollups instead of every step row,
with the same numbers the rows give per minute, and a slow step or a loss spike never averaged
away."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from django.urls import reverse

from collectors import rollups
from collectors.models import Run, StepMetric, StepMinute
from dashboard import charts
from dashboard.views import presenters
from tests.dashboard.conftest import add_steps, make_run


def _series(client, run: Run) -> dict:
    response = client.get(reverse("run_series", args=[run.pk]))
    assert response.status_code == 200
    return response.json()


def _per_minute_from_rows(run: Run, rank: int) -> dict[str, list]:
    """What a minute of the rows says: its last step, mean loss, slowest step, tokens/s."""
    minutes = defaultdict(list)
    for row in StepMetric.objects.filter(run=run, rank=rank).order_by("ts"):
        minutes[row.ts.replace(second=0, microsecond=0)].append(row)
    expected = defaultdict(list)
    for minute in sorted(minutes):
        rows = minutes[minute]
        expected["minute_ms"].append(minute.timestamp() * 1000)
        expected["last_step"].append(max(r.step for r in rows))
        expected["loss"].append(sum(r.loss for r in rows) / len(rows))
        expected["slowest"].append(max(r.duration_s for r in rows))
        expected["tokens_per_s"].append(sum(r.tokens for r in rows)
                                        / sum(r.duration_s for r in rows))
    return expected


@pytest.fixture
def long_run_limit(monkeypatch):
    # The switch to rollups is about cost, not correctness: a low limit keeps these tests small.
    monkeypatch.setattr(presenters, "RAW_STEP_ROWS_LIMIT", 500)


@pytest.mark.django_db
def test_long_run_charts_are_the_per_minute_figures_of_its_rows(clients, projects, now,
                                                               long_run_limit):
    run, attempts = make_run(projects["llm"], "long", world_size=2, last_seen_at=now)
    start = (now - timedelta(hours=1)).replace(second=0, microsecond=0)
    add_steps(run, attempts[0], ranks=2, steps=range(1, 601), start=start, every_s=2.5,
              tokens=4096, loss=lambda rank, step: 3.0 - step / 1000 + 0.1 * rank + (step % 7) / 50,
              duration=lambda rank, step: 2.0 + (step % 5) / 10 + rank / 4)
    rollups.rebuild(run.pk)

    series = _series(clients["member"], run)

    assert series["resolution"] == "minute"
    assert series["ranks_shown"] == 2
    for rank in (0, 1):
        expected = _per_minute_from_rows(run, rank)
        loss = series["charts"]["loss"]["data"][rank]
        assert loss["x"] == expected["last_step"]
        assert loss["y"] == pytest.approx(expected["loss"], rel=1e-7)
        duration = series["charts"]["duration"]["data"][rank]
        assert duration["x"] == expected["last_step"]
        assert duration["y"] == pytest.approx(expected["slowest"], rel=1e-7)
        throughput = series["charts"]["throughput"]["data"][rank]
        assert throughput["x"] == expected["minute_ms"]
        assert throughput["y"] == pytest.approx(expected["tokens_per_s"], rel=1e-7)
    assert "per minute" in series["charts"]["loss"]["layout"]["title"]["text"]
    assert "tokens/s" in series["charts"]["throughput"]["layout"]["title"]["text"]


@pytest.mark.django_db
def test_long_run_keeps_a_slow_step_and_a_loss_spike_through_rollups_and_downsampling(
        clients, projects, now, long_run_limit):
    run, attempts = make_run(projects["llm"], "weeks", world_size=1, last_seen_at=now)
    # One step a minute for 3 days: more minutes than a trace may have points.
    steps = range(1, 4321)
    add_steps(run, attempts[0], ranks=1, steps=steps, start=now - timedelta(days=3), every_s=60,
              tokens=1000,
              loss=lambda rank, step: 9.0 if step == 2_345 else 2.0 + 1.0 / step,
              duration=lambda rank, step: 41.0 if step == 1_234 else 1.0 + (step % 3) / 100)
    rollups.rebuild(run.pk)

    charts_ = _series(clients["owner"], run)["charts"]

    duration = charts_["duration"]["data"][0]
    assert len(duration["x"]) <= charts.MAX_POINTS_PER_TRACE < len(steps)
    assert max(duration["y"]) == 41.0
    assert duration["x"][duration["y"].index(41.0)] == 1_234
    loss = charts_["loss"]["data"][0]
    assert max(loss["y"]) == 9.0
    assert loss["x"][loss["y"].index(9.0)] == 2_345
    throughput = charts_["throughput"]["data"][0]
    assert min(throughput["y"]) == pytest.approx(1000 / 41.0)


@pytest.mark.django_db
def test_a_run_without_rollups_is_drawn_from_its_rows(clients, projects, now, long_run_limit):
    # Rows that arrived before the rollups existed (or by hand): the page must not go blank.
    run, attempts = make_run(projects["llm"], "old", world_size=1, last_seen_at=now)
    add_steps(run, attempts[0], ranks=1, steps=range(1, 1001), start=now - timedelta(hours=1),
              every_s=1.0)

    series = _series(clients["owner"], run)

    assert series["resolution"] == "step"
    assert len(series["charts"]["loss"]["data"][0]["x"]) == 1000


@pytest.mark.django_db
def test_many_ranks_share_the_charts_point_budget(clients, projects, now, long_run_limit):
    run, attempts = make_run(projects["llm"], "wide", world_size=64, last_seen_at=now)
    add_steps(run, attempts[0], ranks=16, steps=range(1, 1201), start=now - timedelta(days=1),
              every_s=60, tokens=100)
    rollups.rebuild(run.pk)

    series = _series(clients["owner"], run)

    per_trace = charts.points_per_trace(16)
    assert per_trace < 1200
    for name in ("loss", "throughput", "duration"):
        traces = series["charts"][name]["data"]
        assert len(traces) == 16
        assert all(len(t["x"]) <= per_trace for t in traces)
        assert sum(len(t["x"]) for t in traces) <= charts.CHART_POINT_BUDGET


@pytest.mark.django_db
def test_a_short_window_of_a_long_run_shows_every_step_in_it(clients, projects, now,
                                                             long_run_limit):
    run, attempts = make_run(projects["llm"], "zoom", world_size=1, last_seen_at=now)
    start = (now - timedelta(hours=2)).replace(second=0, microsecond=0)
    add_steps(run, attempts[0], ranks=1, steps=range(0, 3600), start=start, every_s=2.0,
              tokens=100)
    rollups.rebuild(run.pk)
    since, until = start + timedelta(minutes=30), start + timedelta(minutes=40)

    whole = _series(clients["owner"], run)
    response = clients["owner"].get(reverse("run_series", args=[run.pk]),
                                    {"since": since.timestamp(), "until": until.timestamp()})

    assert whole["resolution"] == "minute"
    zoomed = response.json()
    assert zoomed["resolution"] == "step"
    assert zoomed["window"] == [since.timestamp(), until.timestamp()]
    # Steps at start + 2 s x step: minute 30 begins at step 900, minute 40 at step 1200.
    assert zoomed["charts"]["loss"]["data"][0]["x"] == list(range(900, 1200))


@pytest.mark.django_db
@pytest.mark.parametrize("query", [{"since": "soon", "until": "1"}, {"since": "100"},
                                   {"since": "200", "until": "100"},
                                   {"since": "nan", "until": "inf"}])
def test_a_bad_window_is_refused_with_a_400_that_says_why(clients, llm_run, query):
    response = clients["owner"].get(reverse("run_series", args=[llm_run.pk]), query)

    assert response.status_code == 400
    assert b"since" in response.content


@pytest.mark.django_db
def test_minutes_without_a_known_last_step_stay_off_the_step_charts(clients, projects, now,
                                                                    long_run_limit):
    # Rollup rows written without ingest (a hand load, an old fixture) may leave last_step null:
    # such a minute has no place on a step axis, and must not land at step -9.2e18.
    run, _ = make_run(projects["llm"], "unplaced", world_size=1, last_seen_at=now)
    start = (now - timedelta(hours=2)).replace(second=0, microsecond=0)
    StepMinute.objects.bulk_create(
        StepMinute(run=run, rank=0, minute=start + timedelta(minutes=i), steps=10,
                   last_step=10 * (i + 1) if i % 2 == 0 else None, duration_n=10,
                   duration_sum=20.0, duration_max=2.0 + i / 100, tokens=1000, loss_n=10,
                   loss_sum=30.0 - i / 10)
        for i in range(60))

    series = _series(clients["owner"], run)

    assert series["resolution"] == "minute"
    placed = [10 * (i + 1) for i in range(0, 60, 2)]
    for name in ("loss", "duration"):
        assert series["charts"][name]["data"][0]["x"] == placed
    assert series["charts"]["duration"]["data"][0]["y"] == pytest.approx(
        [2.0 + i / 100 for i in range(0, 60, 2)])
    # Throughput is against time, which every minute has.
    assert len(series["charts"]["throughput"]["data"][0]["x"]) == 60


@pytest.mark.django_db
def test_a_run_of_days_is_drawn_from_each_quarter_hours_lowest_and_highest_minute(
        clients, projects, now, long_run_limit, monkeypatch):
    monkeypatch.setattr(presenters, "MINUTE_ROWS_LIMIT", 1_000)
    run, attempts = make_run(projects["llm"], "days", world_size=1, last_seen_at=now)
    start = (now - timedelta(days=3)).replace(minute=0, second=0, microsecond=0)
    add_steps(run, attempts[0], ranks=1, steps=range(1, 4321), start=start, every_s=60,
              tokens=1000,
              loss=lambda rank, step: 9.0 if step == 2_345 else 2.0 + 1.0 / step,
              duration=lambda rank, step: 41.0 if step == 1_234 else
              1.0 + (step % 7) / 100 + step / 1e6)
    rollups.rebuild(run.pk)

    series = _series(clients["owner"], run)

    assert series["resolution"] == "quarter"
    assert "each 15 min's lowest and highest" in series["charts"]["loss"]["layout"]["title"]["text"]
    # What the rows say per minute, then each quarter hour's lowest and highest minute.
    minutes = _per_minute_from_rows(run, 0)
    expected: dict[str, set] = {"loss": set(), "duration": set(), "throughput": set()}
    quarters = defaultdict(list)
    for i, minute_ms in enumerate(minutes["minute_ms"]):
        quarters[minute_ms // 900_000].append(i)
    for quarter in quarters.values():
        for chart, x, y in (("loss", "last_step", "loss"), ("duration", "last_step", "slowest"),
                            ("throughput", "minute_ms", "tokens_per_s")):
            points = [(minutes[x][i], minutes[y][i]) for i in quarter]
            expected[chart] |= {min(points, key=lambda p: p[1]), max(points, key=lambda p: p[1])}
    assert len(quarters) > 288
    for chart, points in expected.items():
        trace = series["charts"][chart]["data"][0]
        # Two points a quarter (one for a quarter of one minute), in time order; y to the 9
        # significant digits the charts send.
        assert len(points) == 2 * len(quarters) - 1
        assert trace["x"] == [x for x, _ in sorted(points)]
        assert trace["y"] == pytest.approx([y for _, y in sorted(points)], rel=1e-8)
    loss, duration = series["charts"]["loss"]["data"][0], series["charts"]["duration"]["data"][0]
    assert loss["x"][loss["y"].index(9.0)] == 2_345
    assert duration["x"][duration["y"].index(41.0)] == 1_234
    assert min(series["charts"]["throughput"]["data"][0]["y"]) == pytest.approx(1000 / 41.0)
