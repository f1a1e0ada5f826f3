"""The Failures and Checkpoints pages in a real browser (Debian's Chromium through Playwright):
they load, draw their charts, show the analysis's numbers, and the re-label form works. Also the
README's screenshots: RUNWATCH_SCREENSHOTS=1 writes them to docs/screenshots."""

from __future__ import annotations

import os
import time

import pytest

from collectors import reliability
from collectors.models import Category, IngestToken, Interruption
from dashboard.views.failure_presenters import percent
from tests.dashboard.test_browser import SCREENSHOTS, browser, log_in, page  # noqa: F401
from tests.generated_run import generate_run, realistic_generated_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def chart_traces(page, chart_id: str) -> int:  # noqa: F811
    return page.evaluate("id => (document.getElementById(id).data || []).length", chart_id)


def test_failures_page_shows_ettr_root_causes_and_relabels(page, live_server, users,  # noqa: F811
                                                            projects):
    generated = generate_run(IngestToken.issue(projects["llm"])[1], name="llama-gen")
    run = generated.run
    log_in(page, live_server, users["member"].username)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.click(".run-tabs >> text=Failures")
    page.wait_for_url(f"**/runs/{run.pk}/failures/")
    page.wait_for_function("() => (document.getElementById('chart-timeline').data || []).length")
    assert chart_traces(page, "chart-timeline") == 6
    assert chart_traces(page, "chart-root-causes") == 1
    assert page.locator('[data-field="ettr"]').inner_text() == percent(generated.truth.ettr)
    categories = page.locator("#root-causes tbody td:first-child").all_inner_texts()
    assert sorted(categories) == ["GPU hardware", "Host (CPU, RAM, OS)",
                                  "NCCL timeout / collective hang"]
    assert page.locator("#interruptions .interruption").count() == 3

    hang = Interruption.objects.get(run=run, source="stall")
    form = page.locator(f"#interruption-{hang.pk} form.relabel")
    form.locator("select[name=category]").select_option(Category.NETWORK)
    form.locator("select[name=expected]").select_option("no")
    form.locator("button").click()
    page.wait_for_url(f"**/failures/#interruption-{hang.pk}")
    article = page.locator(f"#interruption-{hang.pk}")
    assert article.locator('[data-field="category"]').inner_text() == "Network"
    assert article.locator(".tag-label").is_visible()
    assert "Network" in page.locator("#root-causes tbody").inner_text()
    hang.refresh_from_db()
    assert hang.label_category == Category.NETWORK and hang.labelled_by == users["member"]

    # Last 24 h: this run is older, so the table and the list empty out; ETTR stays.
    page.click("#range >> text=Last 24 h")
    page.wait_for_url("**/failures/?range=24h")
    assert "No interruptions in this time range." in page.locator("#root-causes").inner_text()
    assert page.locator('[data-field="ettr"]').inner_text() == percent(generated.truth.ettr)


def test_checkpoints_page_draws_saves_and_lists_restores(page, live_server, users,  # noqa: F811
                                                          projects):
    generated = generate_run(IngestToken.issue(projects["llm"])[1], name="llama-gen")
    log_in(page, live_server, users["owner"].username)
    page.goto(f"{live_server.url}/runs/{generated.run.pk}/failures/")
    page.click(".run-tabs >> text=Checkpoints")
    page.wait_for_url(f"**/runs/{generated.run.pk}/checkpoints/")
    page.wait_for_function("() => (document.getElementById('chart-saves').data || []).length")
    assert chart_traces(page, "chart-saves") == 3
    assert page.locator("#saves tbody tr").count() == generated.truth.saves
    assert page.locator("#restores tbody tr").count() == 3
    assert page.locator('[data-field="saves"]').inner_text() == str(generated.truth.saves)


def test_realistic_failures_and_checkpoints_pages(page, live_server, users, projects,  # noqa: F811
                                                  tmp_path):
    shots = SCREENSHOTS if os.environ.get("RUNWATCH_SCREENSHOTS") else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    generated = realistic_generated_run(IngestToken.issue(projects["llm"])[1],
                                        ends_at=time.time() - 600)
    run = generated.run
    goodput = reliability.run_goodput(run)
    assert abs(goodput.ettr - generated.truth.ettr) * 100 < 0.1
    log_in(page, live_server, users["owner"].username)
    page.goto(f"{live_server.url}/runs/{run.pk}/failures/")
    page.wait_for_function("() => (document.getElementById('chart-root-causes').data || []).length")
    page.wait_for_timeout(300)
    assert page.locator("#interruptions .interruption").count() == 10
    assert page.locator('[data-field="interruptions"]').inner_text().startswith("10")
    page.screenshot(path=str(shots / "failures.png"))

    page.goto(f"{live_server.url}/runs/{run.pk}/checkpoints/")
    page.wait_for_function("() => (document.getElementById('chart-saves').data || []).length")
    page.wait_for_timeout(300)
    assert page.locator("#restores tbody tr").count() == 10
    page.screenshot(path=str(shots / "checkpoints.png"))
    assert all((shots / name).stat().st_size > 10_000 for name in ("failures.png", "checkpoints.png"))
