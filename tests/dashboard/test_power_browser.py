"""The Power and GPU health pages in a real browser (Debian's Chromium through Playwright): the
tabs open, the charts draw, the tables hold the analysis's numbers, zooming refetches the range.
Also the README's screenshots from a simulated cluster: RUNWATCH_SCREENSHOTS=1 writes them to
docs/screenshots."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from collectors.models import Run
from collectors.simulation import SimConfig, run_simulation
from dashboard.views import cluster_presenters
from tests.dashboard.conftest import make_run
from tests.dashboard.test_browser import SCREENSHOTS, browser, log_in, page  # noqa: F401
from tests.dashboard.test_power_pages import DIP_AT, START, planted_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def traces(page, chart_id: str) -> list[dict]:  # noqa: F811
    return page.evaluate(
        "id => (document.getElementById(id).data || []).map(t => ({type: t.type, name: t.name,"
        " n: (t.x || []).length, x0: (t.x || [])[0], y0: (t.y || [])[0]}))", chart_id)


def wait_for_chart(page, chart_id: str) -> None:  # noqa: F811
    page.wait_for_function(f"() => (document.getElementById('{chart_id}').data || []).length")


def test_power_and_gpu_health_tabs_draw_their_charts_and_tables(page, live_server, users,  # noqa: F811
                                                                projects):
    run, (attempt,) = make_run(projects["llm"], "cluster-16", world_size=16)
    attempt.started_at = START
    attempt.save()
    planted_cluster(run, attempt)
    log_in(page, live_server, users["member"].username)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.click(".run-tabs >> text=Power")
    page.wait_for_url(f"**/runs/{run.pk}/power/")
    wait_for_chart(page, "chart-power")
    wait_for_chart(page, "chart-histogram")
    power = traces(page, "chart-power")
    assert [t["name"] for t in power] == ["cluster power (per second)", "swing: checkpoint"]
    assert 0 < power[0]["n"] <= 2100 and power[1]["n"] == 2
    assert [t["name"] for t in traces(page, "chart-histogram")] == ["falls", "rises"]
    view = cluster_presenters.power_view(run)
    assert page.locator("#swings tbody tr").count() == len(view.swings) == 2
    assert page.locator('#swings [data-field="cause"]').all_inner_texts() == ["checkpoint"] * 2
    assert page.locator('#swings [data-field="delta"]').all_inner_texts() == [
        f"{s.delta_kw:+,.1f} kW" for s in view.swings]
    assert page.locator('[data-field="largest_fall"]').inner_text() == \
        f"{min(s.delta_kw for s in view.swings):+,.1f} kW"

    # Zoom to two minutes around the dip: the page fetches that range and redraws it.
    lo, hi = START.timestamp() + DIP_AT - 60, START.timestamp() + DIP_AT + 60
    page.evaluate(f"() => Plotly.relayout('chart-power', {{'xaxis.range': "
                  f"[new Date({lo * 1000}).toISOString(), new Date({hi * 1000}).toISOString()]}})")
    page.wait_for_function(f"() => document.getElementById('chart-power').data[0].x[0] >= {lo * 1000}")
    zoomed = traces(page, "chart-power")
    assert zoomed[0]["n"] == 121 and zoomed[0]["x0"] == lo * 1000

    page.click(".run-tabs >> text=GPU health")
    page.wait_for_url(f"**/runs/{run.pk}/gpus/")
    wait_for_chart(page, "chart-temp")
    wait_for_chart(page, "chart-gpu-power")
    assert [t["type"] for t in traces(page, "chart-temp")] == ["heatmap"]
    assert page.locator('#hottest [data-field="gpu"]').first.inner_text() == "node002:3"
    assert page.locator('#throttling [data-field="gpu"]').all_inner_texts() == ["node002:3"]
    assert page.locator("#gpu-errors tbody tr").count() == 1
    page.click("text=hottest first")
    page.wait_for_url("**/gpus/?order=hottest")
    wait_for_chart(page, "chart-temp")
    first_row = page.evaluate("() => document.getElementById('chart-temp').data[0].y[0]")
    assert first_row == "node002:3"


def test_simulated_cluster_power_and_gpu_health_pages(page, live_server, users, projects,  # noqa: F811
                                                      tmp_path):
    shots = SCREENSHOTS if os.environ.get("RUNWATCH_SCREENSHOTS") else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    truth = run_simulation(SimConfig(project="llm", run_name="sim-cluster-32", gpus=32, days=0.5,
                                     seed=21, start=datetime(2026, 7, 1, 6, 0, tzinfo=UTC),
                                     interruptions=1, stalls=1, checkpoint_every_steps=400))
    run = Run.objects.get(pk=truth.run_id)
    log_in(page, live_server, users["owner"].username)
    page.goto(f"{live_server.url}/runs/{run.pk}/power/")
    wait_for_chart(page, "chart-power")
    wait_for_chart(page, "chart-histogram")
    page.wait_for_timeout(300)
    causes = page.locator('#swings [data-field="cause"]').all_inner_texts()
    # Every listed swing has a cause: the restarts, the crash, the stall, the saves.
    assert {"restart", "interruption", "stall", "checkpoint"} == set(causes)
    page.screenshot(path=str(shots / "power.png"), full_page=True)

    page.goto(f"{live_server.url}/runs/{run.pk}/gpus/?order=hottest")
    wait_for_chart(page, "chart-temp")
    page.wait_for_timeout(300)
    hot = {f"{h['host']}:{h['gpu']}" for h in truth.hot_gpus}
    listed = page.locator('#hottest [data-field="gpu"]').all_inner_texts()
    assert set(listed[:len(hot)]) == hot
    page.screenshot(path=str(shots / "gpu_health.png"), full_page=True)
    assert all((shots / name).stat().st_size > 10_000 for name in ("power.png", "gpu_health.png"))
