"""The dashboard in a real browser: log in through the form, read the runs list, watch the run
page's charts grow as new steps land in the database, without a reload."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from collectors.models import Run, StepMetric
from tests.dashboard.conftest import PASSWORD, realistic_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make between
# page actions are still synchronous, so Django's guard against async contexts must stand down.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CHART_IDS = ("chart-loss", "chart-throughput", "chart-duration")


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    # No external resources: any request off the live server fails the test.
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url)
            if not r.url.startswith(("http://localhost", "http://127.0.0.1", "data:")) else None)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not outside, outside
    assert not errors, errors


def log_in(page, live_server, username: str) -> None:
    page.goto(live_server.url + "/")
    assert "/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")


def trace_lengths(page, chart_id: str) -> list[int]:
    return page.evaluate(
        "id => (document.getElementById(id).data || []).map(t => t.x.length)", chart_id
    )


def trace_names(page, chart_id: str) -> list[str]:
    return page.evaluate("id => (document.getElementById(id).data || []).map(t => t.name)",
                         chart_id)


def test_log_in_see_run_and_watch_charts_grow(page, live_server, users, projects, llm_run,
                                              settings):
    settings.RUNWATCH_REFRESH_MS = 500
    log_in(page, live_server, users["member"].username)
    row = page.locator(f'tr[data-run-id="{llm_run.pk}"]')
    assert "llama-8b-pretrain" in row.inner_text()
    assert "2.05k" in row.inner_text()

    row.locator("a").click()
    page.wait_for_url(f"**/runs/{llm_run.pk}/")
    for chart_id in CHART_IDS:
        page.wait_for_function("id => (document.getElementById(id).data || []).length === 2",
                               arg=chart_id)
        assert trace_names(page, chart_id) == ["rank 0", "rank 1"]
        assert trace_lengths(page, chart_id) == [200, 200]
    assert page.locator("#live").get_attribute("data-state") == "live"

    # Set on this document only: if it survives, the charts grew without a reload.
    page.evaluate("() => { window.noReload = true; }")
    attempt = llm_run.attempts.order_by("number").last()
    last = llm_run.stepmetric_set.order_by("-ts").first().ts
    StepMetric.objects.bulk_create(
        StepMetric(run=llm_run, attempt=attempt, rank=rank, step=step,
                   ts=last + timedelta(seconds=(step - 200) * 0.5), duration_s=0.5,
                   tokens=512, loss=0.04)
        for rank in range(2) for step in range(201, 231)
    )
    for chart_id in CHART_IDS:
        page.wait_for_function(
            "id => document.getElementById(id).data.every(t => t.x.length === 230)",
            arg=chart_id, timeout=10_000,
        )
    page.wait_for_function(
        "() => document.querySelector('[data-field=\"last_step_text\"]').textContent === '230'",
        timeout=10_000,
    )
    assert page.evaluate("() => window.noReload") is True

    # The run ends: the header says so and the page stops polling.
    Run.objects.filter(pk=llm_run.pk).update(status=Run.Status.FINISHED)
    page.wait_for_function(
        "() => document.querySelector('#live .live-text').textContent === 'Final'",
        timeout=10_000,
    )
    assert page.locator('[data-field="status"]').inner_text().lower() == "finished"


def test_finished_run_page_does_not_poll(page, live_server, users, projects, llm_run, settings):
    settings.RUNWATCH_REFRESH_MS = 300
    Run.objects.filter(pk=llm_run.pk).update(status=Run.Status.FINISHED)
    log_in(page, live_server, users["owner"].username)
    series_requests: list[str] = []
    page.on("request", lambda r: series_requests.append(r.url) if "series.json" in r.url
            else None)
    page.goto(f"{live_server.url}/runs/{llm_run.pk}/")
    page.wait_for_function("() => (document.getElementById('chart-loss').data || []).length")
    page.wait_for_timeout(1200)
    assert series_requests == []
    assert page.locator("#live .live-text").inner_text() == "Final"


def test_outsider_sees_no_run_and_gets_404(page, live_server, users, projects, llm_run):
    log_in(page, live_server, users["outsider"].username)
    assert page.locator("#runs-empty").is_visible()
    response = page.goto(f"{live_server.url}/runs/{llm_run.pk}/")
    assert response.status == 404


def test_logout_through_the_top_bar(page, live_server, users, projects):
    log_in(page, live_server, users["owner"].username)
    page.click(".logout button")
    page.wait_for_url("**/login/")
    page.goto(live_server.url + "/")
    assert "/login/" in page.url


def test_a_realistic_runs_list_shows_every_status(page, live_server, users, projects, tmp_path):
    """Also the README's screenshots: RUNWATCH_SCREENSHOTS=1 writes them to docs/screenshots."""
    shots = SCREENSHOTS if os.environ.get("RUNWATCH_SCREENSHOTS") else tmp_path
    now = timezone.now()
    run = realistic_run(projects["llm"], "llama-1b-pretrain", now)
    done = realistic_run(projects["llm"], "llama-1b-lr-sweep-3e-4", now - timedelta(hours=2),
                         steps=300, status=Run.Status.FINISHED, seed=3)
    Run.objects.filter(pk=done.pk).update(last_seen_at=now - timedelta(hours=2))
    failed = realistic_run(projects["llm"], "llama-1b-bs512", now - timedelta(hours=5), steps=120,
                           status=Run.Status.FAILED, seed=5)
    Run.objects.filter(pk=failed.pk).update(last_seen_at=now - timedelta(hours=5))
    hung = realistic_run(projects["llm"], "llama-1b-long-ctx", now - timedelta(minutes=9),
                         steps=200, seed=9)
    Run.objects.filter(pk=hung.pk).update(last_seen_at=now - timedelta(minutes=9))
    shots.mkdir(parents=True, exist_ok=True)
    page.goto(live_server.url + "/login/")
    page.screenshot(path=str(shots / "login.png"))
    log_in(page, live_server, users["owner"].username)
    page.screenshot(path=str(shots / "runs.png"))
    statuses = page.locator("#runs-body .pill").all_inner_texts()
    assert sorted(s.strip().lower() for s in statuses) == ["failed", "finished", "running", "stalled"]
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.wait_for_function("() => (document.getElementById('chart-duration').data || []).length")
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "run.png"))
    assert all((shots / name).stat().st_size > 10_000 for name in ("login.png", "runs.png", "run.png"))


def test_add_a_slack_channel_and_send_a_test(page, live_server, users, projects, webhook_server):
    log_in(page, live_server, users["member"].username)
    page.click("nav.topnav >> text=Alerts")
    page.wait_for_url(live_server.url + "/alerts/")
    page.click("text=New channel")
    page.select_option("#id_project", label="llm")
    page.fill("#id_name", "llm on-call")
    page.select_option("#id_kind", "slack")
    page.fill("#id_url", webhook_server.url)
    page.click("button[type=submit] >> text=Save")
    page.wait_for_url(live_server.url + "/alerts/")
    row = page.locator("#channels tr", has_text="llm on-call")
    assert "XXXX…WXYZ" in row.inner_text()
    assert "abcdefghijklmnopqrst" not in page.content()

    row.locator("button", has_text="Send test").click()
    page.wait_for_selector("text=Test message sent to llm on-call.")
    [request] = webhook_server.requests
    assert request["json"]["text"].startswith("[TEST]")
    page.click("text=Notification history")
    assert "sent" in page.locator("#history tbody tr").first.inner_text()
