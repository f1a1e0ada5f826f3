"""The Failures and Checkpoints pages of a run, and the re-label control, through Django's client
with the owner/member/outsider personas. The run is the generated one whose truth is known."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from collectors import reliability
from collectors.models import Category, IngestToken, Interruption
from dashboard.views.failure_presenters import duration, percent
from tests.generated_run import generate_run


@pytest.fixture
def generated(projects):
    token = IngestToken.issue(projects["llm"])[1]
    return generate_run(token, project="llm", name="llama-gen")


def failures_url(run, query: str = "") -> str:
    return f"/runs/{run.pk}/failures/{query}"


def test_member_reads_ettr_badput_root_causes_and_interruptions(clients, generated):
    run = generated.run
    response = clients["member"].get(failures_url(run))
    assert response.status_code == 200
    goodput = reliability.run_goodput(run)
    page = response.content.decode()
    context = response.context
    # The numbers on the page are the analysis's numbers.
    assert context["ettr"] == percent(goodput.ettr) == percent(generated.truth.ettr)
    assert context["interruptions"] == 3 and context["unexpected"] == 3
    assert f'data-field="ettr">{context["ettr"]}<' in page
    assert [row["bucket"] for row in context["badput_rows"]] == [
        "productive", "startup", "checkpoint_save", "lost_progress", "restart_downtime", "stall"]
    stall = next(r for r in context["badput_rows"] if r["bucket"] == "stall")
    assert stall["text"] == duration(generated.truth.stall) == "10 min 00 s"
    assert sorted(r["category"] for r in context["root_causes"]) == [
        "gpu_hardware", "host", "nccl_timeout"]
    assert all(r["pct"] == "33.3%" for r in context["root_causes"])
    assert len(context["interruption_rows"]) == 3
    assert "CUDA error: an illegal memory access" in page
    assert [a["number"] for a in context["attempts"]] == [0, 1, 2, 3]
    timeline = context["figures"]["timeline"]
    assert {t["name"] for t in timeline["data"]} == {
        "Productive", "Startup", "Checkpoint save", "Lost progress", "Restart downtime", "Stalls"}


def test_checkpoints_page_lists_saves_and_restores(clients, generated):
    response = clients["owner"].get(f"/runs/{generated.run.pk}/checkpoints/")
    assert response.status_code == 200
    context = response.context
    assert context["summary"]["saves"] == generated.truth.saves
    assert context["summary"]["median_blocking"] == "6.0 s"
    assert context["summary"]["median_size"] == "4.0 GiB"
    assert [r["step"] for r in context["restores"]] == ["300", "250", "150"]
    assert [r["steps_lost"] for r in context["restores"]] == ["30", "10", "23"]
    bars = context["figures"]["saves"]["data"][0]
    assert len(bars["x"]) == generated.truth.saves


def test_run_page_has_tabs_to_failures_and_checkpoints(clients, generated):
    page = clients["member"].get(f"/runs/{generated.run.pk}/").content.decode()
    assert f'href="/runs/{generated.run.pk}/failures/"' in page
    assert f'href="/runs/{generated.run.pk}/checkpoints/"' in page


@pytest.mark.parametrize("path", ["failures/", "checkpoints/"])
def test_outsider_gets_404_and_anonymous_is_sent_to_log_in(clients, generated, path):
    url = f"/runs/{generated.run.pk}/{path}"
    assert clients["outsider"].get(url).status_code == 404
    response = Client().get(url)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert clients["admin"].get(url).status_code == 200


def label_url(interruption) -> str:
    return f"/runs/{interruption.run_id}/failures/{interruption.pk}/label"


def test_a_member_relabels_and_the_label_wins_in_every_statistic(clients, users, generated):
    run = generated.run
    hang = Interruption.objects.get(run=run, source="stall")
    response = clients["member"].post(label_url(hang), {
        "category": Category.HOST_MAINTENANCE, "expected": "yes",
        "next": failures_url(run, "?range=all")})
    assert response.status_code == 302
    assert response["Location"] == failures_url(run, f"?range=all#interruption-{hang.pk}")
    hang.refresh_from_db()
    assert (hang.label_category, hang.label_expected) == (Category.HOST_MAINTENANCE, True)
    assert hang.labelled_by == users["member"] and hang.labelled_at is not None
    assert hang.category == Category.NCCL_TIMEOUT  # the classifier's verdict is kept

    context = clients["member"].get(failures_url(run)).context
    rows = {r["category"]: r for r in context["root_causes"]}
    assert "nccl_timeout" not in rows and rows["host_maintenance"]["pct"] == "0.0%"
    assert rows["host"]["pct"] == "50.0%"
    assert context["unexpected"] == 2
    assert context["mtbi_unexpected"] == duration(generated.truth.wall / 2)

    # Both empty: back to the classifier's verdict.
    clients["member"].post(label_url(hang), {"category": "", "expected": ""})
    hang.refresh_from_db()
    assert (hang.label_category, hang.label_expected, hang.labelled_by) == ("", None, None)


def test_relabel_refuses_bad_values_outsiders_gets_and_foreign_redirects(clients, generated):
    interruption = Interruption.objects.filter(run=generated.run).first()
    assert clients["member"].post(label_url(interruption), {"category": "cosmic_rays"}).status_code == 400
    assert clients["member"].post(label_url(interruption), {"expected": "maybe"}).status_code == 400
    assert clients["outsider"].post(label_url(interruption), {"category": "host"}).status_code == 404
    assert clients["member"].get(label_url(interruption)).status_code == 405
    response = clients["member"].post(label_url(interruption),
                                      {"category": "host", "next": "https://evil.example/"})
    assert response["Location"].startswith(failures_url(generated.run))
    interruption.refresh_from_db()
    assert interruption.label_category == "host"


def test_relabel_needs_the_csrf_token(users, generated):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["owner"])
    interruption = Interruption.objects.filter(run=generated.run).first()
    assert client.post(label_url(interruption), {"category": "host"}).status_code == 403


def test_time_range_filters_the_root_causes_and_the_list(clients, generated):
    run = generated.run
    first = Interruption.objects.filter(run=run).order_by("ts").first()
    # The generated run is in the past: the last 24 h hold nothing.
    context = clients["member"].get(failures_url(run, "?range=24h")).context
    assert context["root_causes"] == [] and context["interruption_rows"] == []
    assert context["range"].preset == "24h"
    # ETTR is the whole run's, whatever the range.
    assert context["ettr"] == percent(generated.truth.ettr)
    since = (first.ts + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S")
    context = clients["member"].get(failures_url(run, f"?from={since}")).context
    assert len(context["interruption_rows"]) == 2 and first.pk not in {
        r["id"] for r in context["interruption_rows"]}
    until = (first.ts + timedelta(seconds=1)).isoformat()
    context = clients["member"].get(failures_url(run, f"?to={until.replace('+', '%2B')}")).context
    assert [r["id"] for r in context["interruption_rows"]] == [first.pk]
    response = clients["member"].get(failures_url(run, "?from=yesterday"))
    assert "Dates must look like" in response.content.decode()
    assert len(response.context["interruption_rows"]) == 3


def test_a_run_without_attempts_shows_empty_pages(clients, projects):
    from tests.dashboard.conftest import make_run

    run, _ = make_run(projects["llm"], "empty", attempts=0)
    for path in ("failures/", "checkpoints/"):
        response = clients["member"].get(f"/runs/{run.pk}/{path}")
        assert response.status_code == 200
    assert response.context["summary"]["saves"] == 0
