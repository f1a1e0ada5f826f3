"""The Time of day and Stragglers tabs in a real browser (Debian's Chromium through Playwright): the
tabs lead there, every chart draws, the numbers are the analysis's. Also the README's screenshots
from a simulated cluster: RUNWATCH_SCREENSHOTS=1 writes them to docs/screenshots."""

from __future__ import annotations

import os

import pytest

from collectors.analysis.stragglers import read_stragglers
from collectors.analysis.time_of_day import read_time_of_day
from tests.dashboard.test_browser import SCREENSHOTS, browser, log_in, page  # noqa: F401
from tests.dashboard.test_time_of_day_pages import cluster_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def trace_lengths(page, chart_id: str) -> list[int]:  # noqa: F811
    return page.evaluate(
        "id => (document.getElementById(id).data || []).map(t => t.x.length)", chart_id)


def wait_for_chart(page, chart_id: str) -> None:  # noqa: F811
    page.wait_for_function(
        "id => (document.getElementById(id).data || []).length && "
        "document.getElementById(id).querySelector('.main-svg')", arg=chart_id)


def test_time_of_day_and_stragglers_tabs_draw_their_charts(page, live_server, users,  # noqa: F811
                                                           projects):
    run = cluster_run(projects["llm"])
    log_in(page, live_server, users["member"].username)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.click(".run-tabs >> text=Time of day")
    page.wait_for_url(f"**/runs/{run.pk}/time-of-day/")
    for chart in ("chart-hourly", "chart-overlay"):
        wait_for_chart(page, chart)
    assert trace_lengths(page, "chart-hourly") == [24, 24]
    assert trace_lengths(page, "chart-overlay") == [24, 24, 24]
    # Plotly drew one bar per hour and a second y axis for the temperature.
    assert page.locator("#chart-hourly .bars .point").count() == 24
    assert page.locator("#chart-hourly .y2tick").count() > 0
    result = read_time_of_day(run)
    assert page.locator('[data-field="amplitude"]').inner_text() == f"{result.amplitude_pp:.2f} pp"
    assert "swings 1.48 percentage points" in page.locator("#amplitude-sentence").inner_text()
    assert "r = -1.00" in page.locator("#correlation-caption").inner_text()

    page.click(".run-tabs >> text=Stragglers")
    page.wait_for_url(f"**/runs/{run.pk}/stragglers/")
    for chart in ("chart-ranks", "chart-distribution"):
        wait_for_chart(page, chart)
    assert trace_lengths(page, "chart-ranks") == [8, 2]
    report = read_stragglers(run)
    first = page.locator("#stragglers tbody tr").first
    assert first.get_attribute("data-rank") == "5"
    assert first.locator("td").nth(1).inner_text() == "node000"
    assert first.locator("td").nth(3).inner_text() == f"{report.stragglers[0].excess_pct:+.1f}%"
    assert page.locator('[data-field="stragglers"]').inner_text().startswith("1")


def test_simulated_cluster_pages_and_screenshots(page, live_server, users, projects,  # noqa: F811
                                                 tmp_path):
    from collectors.models import IngestToken
    from collectors.simulation import SimConfig, run_simulation

    shots = SCREENSHOTS if os.environ.get("RUNWATCH_SCREENSHOTS") else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    token = IngestToken.issue(projects["llm"])[1]
    # 3 hosts for 2 days; steps from a sample of ranks plus the 2 slow ones (the simulator's
    # large-cluster default), GPU samples every minute: small enough for a test on 2 cores.
    # RUNWATCH_SCREENSHOT_GPUS makes the README's bigger cluster.
    gpus = int(os.environ.get("RUNWATCH_SCREENSHOT_GPUS", "24"))
    truth = run_simulation(SimConfig(project="llm", run_name=f"llama-sim-{gpus}", gpus=gpus, days=2,
                                     seed=11, stragglers=2, sample_interval_s=60.0), token=token)
    log_in(page, live_server, users["owner"].username)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/runs/{truth.run_id}/time-of-day/")
    for chart in ("chart-hourly", "chart-overlay"):
        wait_for_chart(page, chart)
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "time_of_day.png"))
    page.goto(f"{live_server.url}/runs/{truth.run_id}/stragglers/")
    for chart in ("chart-ranks", "chart-distribution"):
        wait_for_chart(page, chart)
    page.wait_for_timeout(300)
    flagged = page.locator("#stragglers tbody tr.flagged")
    assert sorted(int(r) for r in flagged.evaluate_all("rows => rows.map(r => r.dataset.rank)")) \
        == sorted(s["rank"] for s in truth.stragglers)
    page.screenshot(path=str(shots / "stragglers.png"))
    assert all((shots / name).stat().st_size > 10_000
               for name in ("time_of_day.png", "stragglers.png"))
