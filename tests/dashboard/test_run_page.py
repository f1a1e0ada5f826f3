"""The run page and its series endpoint: header numbers and per-rank, downsampled charts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from collectors.models import Run
from dashboard.charts import MAX_POINTS_PER_TRACE
from tests.dashboard.conftest import add_steps, make_run


def _series(client, run: Run) -> dict:
    response = client.get(reverse("run_series", args=[run.pk]))
    assert response.status_code == 200
    return response.json()


@pytest.mark.django_db
def test_series_has_one_trace_per_rank_in_every_chart(clients, llm_run):
    series = _series(clients["member"], llm_run)
    for name in ("loss", "throughput", "duration"):
        traces = series["charts"][name]["data"]
        assert [t["name"] for t in traces] == ["rank 0", "rank 1"], name
        assert all(len(t["x"]) == 200 for t in traces), name


@pytest.mark.django_db
def test_series_values_are_the_stored_steps(clients, llm_run):
    series = _series(clients["member"], llm_run)
    loss = series["charts"]["loss"]["data"][1]
    assert loss["x"][:3] == [1, 2, 3]
    assert loss["y"][:3] == pytest.approx([10.01, 5.01, 10 / 3 + 0.01])
    throughput = series["charts"]["throughput"]["data"][0]
    # 512 tokens in a 0.5 s step.
    assert set(throughput["y"]) == {1024.0}
    assert "tokens/s" in series["charts"]["throughput"]["layout"]["title"]["text"]
    first_ts = llm_run.stepmetric_set.order_by("ts").first().ts
    assert throughput["x"][0] == pytest.approx(first_ts.timestamp() * 1000)
    duration = series["charts"]["duration"]["data"][0]
    assert set(duration["y"]) == {0.5}


@pytest.mark.django_db
def test_series_carries_header_numbers_and_status(clients, llm_run):
    run = _series(clients["member"], llm_run)["run"]
    assert run["status"] == "running" and run["polling"] is True
    assert run["last_step"] == 200
    assert run["steps_per_s"] == pytest.approx(2.0)
    assert run["tokens_per_s"] == pytest.approx(2048.0)
    assert run["latest_loss"] == pytest.approx(10 / 200 + 0.01)
    assert run["attempts"] == 2


@pytest.mark.django_db
def test_finished_run_stops_polling(clients, llm_run):
    llm_run.status = Run.Status.FINISHED
    llm_run.save()
    assert _series(clients["member"], llm_run)["run"]["polling"] is False
    page = clients["member"].get(reverse("run", args=[llm_run.pk])).content.decode()
    assert 'data-state="final"' in page


@pytest.mark.django_db
def test_without_tokens_throughput_is_steps_per_second(clients, projects, now):
    run, attempts = make_run(projects["llm"], "no-tokens", world_size=1, last_seen_at=now)
    add_steps(run, attempts[0], ranks=1, steps=range(1, 5), start=now - timedelta(seconds=10),
              every_s=0.25)
    chart = _series(clients["owner"], run)["charts"]["throughput"]
    assert chart["data"][0]["y"] == [4.0, 4.0, 4.0, 4.0]
    assert "steps/s" in chart["layout"]["title"]["text"]


@pytest.mark.django_db
def test_long_run_is_downsampled_and_keeps_the_spike(clients, projects, now):
    run, attempts = make_run(projects["llm"], "long", world_size=1, last_seen_at=now)
    add_steps(
        run, attempts[0], ranks=1, steps=range(1, 10_001), start=now - timedelta(hours=3),
        every_s=1.0, loss=lambda rank, step: 50.0 if step == 7_777 else 2.0 + 1.0 / step,
        duration=lambda rank, step: 30.0 if step == 4_321 else 1.0,
    )
    charts = _series(clients["owner"], run)["charts"]
    loss = charts["loss"]["data"][0]
    assert len(loss["x"]) <= MAX_POINTS_PER_TRACE
    assert max(loss["y"]) == 50.0
    assert loss["x"][loss["y"].index(50.0)] == 7_777
    duration = charts["duration"]["data"][0]
    assert len(duration["y"]) <= MAX_POINTS_PER_TRACE
    assert max(duration["y"]) == 30.0
    assert min(charts["throughput"]["data"][0]["y"]) == pytest.approx(1 / 30)


@pytest.mark.django_db
def test_run_page_shows_header_config_and_chart_holders(clients, llm_run):
    page = clients["owner"].get(reverse("run", args=[llm_run.pk])).content.decode()
    assert "llama-8b-pretrain" in page
    assert 'class="pill pill-running"' in page
    assert "<details" in page and "&quot;batch_size&quot;: 512" in page
    for chart_id in ("chart-loss", "chart-throughput", "chart-duration"):
        assert f'id="{chart_id}"' in page
    assert '/static/vendor/plotly.min.js' in page
    assert 'id="run-series"' in page
    assert reverse("run_series", args=[llm_run.pk]) in page


@pytest.mark.django_db
def test_plotly_is_served_locally(clients):
    response = clients["owner"].get("/static/vendor/plotly.min.js")
    assert response.status_code == 200
