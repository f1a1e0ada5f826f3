"""The runs list with more runs than it shows: the most recently active ones, and a line saying
how many there are."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from dashboard.views import runs as runs_views
from tests.dashboard.conftest import make_run


@pytest.mark.django_db
def test_runs_list_shows_the_most_recently_active_runs_and_says_how_many_exist(
        clients, projects, now, monkeypatch):
    monkeypatch.setattr(runs_views, "RUNS_LIST_LIMIT", 3)
    for minutes, name in ((50, "oldest"), (40, "old"), (30, "recent"), (20, "newer"),
                          (10, "newest")):
        make_run(projects["llm"], name, last_seen_at=now - timedelta(minutes=minutes))

    page = clients["member"].get(reverse("runs")).content.decode()
    payload = clients["member"].get(reverse("runs_json")).json()

    assert [row["name"] for row in payload["runs"]] == ["newest", "newer", "recent"]
    assert payload["total"] == 5
    assert "Showing the 3 most recently active of 5 runs." in page
    assert "oldest" not in page and "newest" in page


@pytest.mark.django_db
def test_runs_list_says_nothing_about_a_limit_it_did_not_reach(clients, projects, now):
    make_run(projects["llm"], "only", last_seen_at=now)

    page = clients["member"].get(reverse("runs")).content.decode()

    assert 'id="runs-limit"' not in page
    assert clients["member"].get(reverse("runs_json")).json()["total"] == 1
