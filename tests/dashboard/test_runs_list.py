"""The runs list: one row per visible run with its latest numbers, most recently seen first."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from collectors.models import Run
from tests.dashboard.conftest import add_steps, make_run


@pytest.mark.django_db
def test_list_shows_last_step_and_recent_rates(clients, llm_run):
    row = clients["owner"].get(reverse("runs_json")).json()["runs"][0]
    assert row["last_step"] == 200
    # Hand-computed in the llm_run fixture: 240 rows / 2 ranks / 60 s, 240 * 512 tokens / 60 s.
    assert row["steps_per_s"] == pytest.approx(2.0)
    assert row["tokens_per_s"] == pytest.approx(2048.0)
    assert row["attempts"] == 2
    assert row["world_size"] == 2
    assert row["status"] == "running"
    assert row["last_seen_ago"] == "5 s ago"

    page = clients["owner"].get(reverse("runs")).content.decode()
    assert "200" in page and "2.00" in page and "2.05k" in page
    assert f'href="{reverse("run", args=[llm_run.pk])}"' in page
    assert 'title="' + row["last_seen_exact"] + '"' in page


@pytest.mark.django_db
def test_young_run_is_measured_over_its_whole_life(clients, projects, now):
    # 11 rows one second apart: 10 s old, so 10 intervals in 10 s, 1.0 steps/s, not 11/60.
    run, attempts = make_run(projects["llm"], "young", world_size=1, last_seen_at=now)
    add_steps(run, attempts[0], ranks=1, steps=range(0, 11), start=now - timedelta(seconds=10),
              every_s=1.0, tokens=100)
    row = clients["owner"].get(reverse("runs_json")).json()["runs"][0]
    assert row["steps_per_s"] == pytest.approx(1.0)
    assert row["tokens_per_s"] == pytest.approx(100.0)


@pytest.mark.django_db
def test_silent_running_run_shows_stalled(clients, projects, now, settings):
    settings.RUNWATCH_STALE_AFTER_S = 120
    make_run(projects["llm"], "hung", last_seen_at=now - timedelta(minutes=10))
    make_run(projects["llm"], "done", status=Run.Status.FINISHED,
             last_seen_at=now - timedelta(minutes=10))
    rows = {r["name"]: r for r in clients["owner"].get(reverse("runs_json")).json()["runs"]}
    assert rows["hung"]["status"] == "stalled"
    assert rows["done"]["status"] == "finished"
    page = clients["owner"].get(reverse("runs")).content.decode()
    assert 'class="pill pill-stalled"' in page


@pytest.mark.django_db
def test_most_recently_seen_first(clients, projects, now):
    for name, age_s in (("old", 600), ("new", 1), ("middle", 60)):
        make_run(projects["llm"], name, last_seen_at=now - timedelta(seconds=age_s))
    names = [r["name"] for r in clients["owner"].get(reverse("runs_json")).json()["runs"]]
    assert names == ["new", "middle", "old"]


@pytest.mark.django_db
def test_run_without_steps_has_no_rates(clients, projects):
    make_run(projects["llm"], "just-registered")
    row = clients["owner"].get(reverse("runs_json")).json()["runs"][0]
    assert row["last_step"] is None
    assert row["steps_per_s"] is None and row["tokens_per_s"] is None
    assert row["steps_per_s_text"] == "—"


@pytest.mark.django_db
def test_empty_list_explains_how_to_start_streaming(clients, projects):
    page = clients["owner"].get(reverse("runs")).content.decode()
    assert "No runs yet" in page
    assert "from trainer_plugin import Monitor" in page
    assert 'mon = Monitor(project="my-project", run="my-run")' in page
    assert "mon.step(loss=loss, tokens=n)" in page
    assert "RUNWATCH_URL" in page and "RUNWATCH_TOKEN" in page


@pytest.mark.django_db
def test_json_rows_html_matches_the_page(clients, llm_run):
    payload = clients["owner"].get(reverse("runs_json")).json()
    assert f'data-run-id="{llm_run.pk}"' in payload["rows_html"]
    assert "llama-8b-pretrain" in payload["rows_html"]


@pytest.mark.django_db
def test_pages_load_only_local_assets(clients, llm_run, projects):
    for url in (reverse("runs"), reverse("run", args=[llm_run.pk]), reverse("login")):
        page = clients["owner"].get(url).content.decode()
        assert not re.search(r'(src|href)="(https?:)?//', page), url


@pytest.mark.django_db
def test_wrong_password_says_so(users):
    response = Client().post(reverse("login"), {"username": "olivia", "password": "nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
