"""The Time of day and Stragglers pages and their JSON: login and membership, the analysis's numbers
on the page, small charts, and sensible empty states."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from html import unescape
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from collectors import rollups
from collectors.analysis.stragglers import read_stragglers
from collectors.analysis.time_of_day import read_time_of_day
from collectors.models import GpuMinute, IngestedBatch, Run, StepMinute
from dashboard.views.cluster_time import correlation_caption

PAGES = ("run_time_of_day", "run_time_of_day_json", "run_stragglers", "run_stragglers_json")
CHICAGO = ZoneInfo("America/Chicago")


def cluster_run(project, *, ranks: int = 8, days: int = 2) -> Run:
    """``ranks`` ranks on 8-GPU hosts for ``days`` days of minutes: steps 1.5% slower from 13:00 to
    17:59 Chicago time when the GPUs run 8 °C hotter; rank 5 is 12% slower all the time."""
    run = Run.objects.create(project=project, name="cluster", timezone="America/Chicago",
                             world_size=ranks)
    start = datetime(2026, 7, 1, 5, 0, tzinfo=UTC)
    steps, gpus = [], []
    for i in range(days * 1440):
        minute = start + timedelta(minutes=i)
        hot = 13 <= minute.astimezone(CHICAGO).hour < 18
        for rank in range(ranks):
            step_s = 6.0 * (1.015 if hot else 1.0) * (1.12 if rank == 5 else 1.0)
            # As ingest writes them: the minute's last step and slowest step too (the run page
            # charts against them; a null last step is a minute with no place on that axis).
            steps.append(StepMinute(run=run, rank=rank, minute=minute, steps=10,
                                    last_step=10 * (i + 1), duration_n=10,
                                    duration_sum=10 * step_s, duration_max=step_s,
                                    tokens=10 * 4096))
            gpus.append(GpuMinute(run=run, host=f"node{rank // 8:03d}", gpu=rank % 8,
                                  minute=minute, samples=6, temp_n=6,
                                  temp_sum=6 * (70.0 if hot else 62.0)))
    StepMinute.objects.bulk_create(steps, batch_size=10_000)
    GpuMinute.objects.bulk_create(gpus, batch_size=10_000)
    rollups.derive_coarse(run.pk)  # HostMinute, as ingest would have kept it
    IngestedBatch.objects.bulk_create(
        IngestedBatch(batch_id=uuid.uuid4(), run=run, rank=rank, host=f"node{rank // 8:03d}",
                      local_rank=rank % 8) for rank in range(ranks))
    return run


@pytest.fixture
def run(projects) -> Run:
    return cluster_run(projects["llm"])


def url(name: str, run: Run) -> str:
    return reverse(name, args=[run.pk])


@pytest.mark.parametrize("name", PAGES)
def test_pages_need_a_login_and_membership(client, clients, projects, name):
    run = cluster_run(projects["llm"], days=0)
    assert client.get(url(name, run)).status_code == 302
    assert clients["outsider"].get(url(name, run)).status_code == 404
    assert clients["member"].get(url(name, run)).status_code == 200
    assert clients["admin"].get(url(name, run)).status_code == 200
    assert clients["member"].post(url(name, run)).status_code == 405


def test_time_of_day_page_shows_the_analysis_numbers(clients, run):
    result = read_time_of_day(run)
    response = clients["member"].get(url("run_time_of_day", run))
    html = response.content.decode()
    summary = response.context["summary"]
    assert summary["amplitude"] == f"{result.amplitude_pp:.2f} pp"
    assert result.amplitude_pp == pytest.approx(100 * (1 - 1 / 1.015))
    assert f'data-field="amplitude">{summary["amplitude"]}<' in html
    assert summary["slowest_hour"] == "13:00" and summary["hottest_hour"] == "13:00"
    assert summary["correlation"] == f"{result.correlation.r:+.2f}" == "-1.00"
    assert summary["correlation_n"] == 24
    assert "Throughput swings 1.48 percentage points" in html
    assert correlation_caption(result.correlation) in unescape(html)
    assert 'class="active" aria-current="page">Time of day<' in html


def test_time_of_day_json_figures_are_24_hours_and_one_line_per_day(clients, run):
    data = clients["member"].get(url("run_time_of_day_json", run)).json()
    hourly = data["figures"]["hourly"]["data"]
    assert [len(t["x"]) for t in hourly] == [24, 24]
    assert hourly[1]["yaxis"] == "y2"
    assert hourly[0]["y"][13] == pytest.approx(100 * (1 / 1.015 - 1), abs=1e-4)
    overlay = data["figures"]["overlay"]["data"]
    assert [t["name"] for t in overlay] == ["2026-07-01", "2026-07-02",
                                            "all days (median)"]
    assert data["summary"]["amplitude_pp"] == pytest.approx(read_time_of_day(run).amplitude_pp,
                                                            abs=1e-4)


def test_stragglers_page_ranks_the_slow_rank_with_its_host_and_gpu(clients, run):
    report = read_stragglers(run)
    response = clients["member"].get(url("run_stragglers", run))
    rows = response.context["rows"]
    assert [r["rank"] for r in rows if r["flagged"]] == [5]
    assert rows[0] == {**rows[0], "rank": 5, "host": "node000", "gpu": 5,
                       "excess": f"{report.stragglers[0].excess_pct:+.1f}%", "flagged": True}
    assert rows[0]["excess"] == "+12.0%"
    assert len(rows) == 8  # every rank fits in the top 20
    html = response.content.decode()
    assert '<tr data-rank="5" class="flagged">' in html
    assert f'data-field="straggler_wait">{response.context["summary"]["straggler_wait"]}' in html
    # Rank 5 alone makes every step wait 0.72 s (6 s × 12%) at night.
    assert report.cost.straggler_wait_s == pytest.approx(0.72 * (19 / 24) + 0.7308 * (5 / 24),
                                                         rel=1e-3)


def test_stragglers_json_has_one_bar_per_rank_and_a_binned_distribution(clients, run):
    data = clients["member"].get(url("run_stragglers_json", run)).json()
    bars = data["figures"]["ranks"]["data"][0]
    assert bars["x"] == [str(rank) for rank in range(8)]
    assert bars["marker"]["color"][5] != bars["marker"]["color"][4]
    histogram = data["figures"]["distribution"]["data"][0]
    assert sum(histogram["y"]) == 8 and len(histogram["x"]) == 40


def test_the_cluster_runs_own_page_charts_step_duration_against_its_steps(clients, run):
    # The run page the Time of day tab is reached from: its 230k steps are drawn from the rollups.
    series = clients["member"].get(reverse("run_series", args=[run.pk])).json()
    assert series["resolution"] == "minute"
    for trace in series["charts"]["duration"]["data"]:
        assert trace["x"][0] == 10 and trace["x"][-1] == 2 * 1440 * 10
        assert trace["x"] == sorted(trace["x"])
    slow = series["charts"]["duration"]["data"][5]["y"]
    assert max(slow) == pytest.approx(6.0 * 1.015 * 1.12)


def test_a_run_without_rollups_reads_as_empty_not_an_error(clients, projects):
    run = Run.objects.create(project=projects["llm"], name="fresh")
    tod = clients["member"].get(url("run_time_of_day", run))
    assert tod.status_code == 200
    assert "Not enough steps yet" in tod.content.decode()
    strag = clients["member"].get(url("run_stragglers", run))
    assert strag.status_code == 200
    assert "nothing to compare" in strag.content.decode()
