"""Every page and endpoint needs a login; users see only their projects' runs."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse


def _urls(run_id: int) -> list[str]:
    return [
        reverse("runs"),
        reverse("runs_json"),
        reverse("run", args=[run_id]),
        reverse("run_series", args=[run_id]),
    ]


@pytest.mark.django_db
def test_anonymous_is_sent_to_login_from_every_page_and_endpoint(llm_run):
    client = Client()
    for url in _urls(llm_run.pk):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.django_db
def test_outsider_gets_404_for_another_projects_run(clients, llm_run):
    for url in _urls(llm_run.pk)[2:]:
        assert clients["outsider"].get(url).status_code == 404, url


@pytest.mark.django_db
def test_missing_run_is_404(clients, llm_run):
    assert clients["owner"].get(reverse("run", args=[llm_run.pk + 1000])).status_code == 404


@pytest.mark.django_db
def test_outsider_does_not_see_another_projects_run_in_the_list(clients, llm_run, vision_run):
    page = clients["outsider"].get(reverse("runs")).content.decode()
    assert "vit-huge" in page
    assert "llama-8b-pretrain" not in page
    names = [row["name"] for row in clients["outsider"].get(reverse("runs_json")).json()["runs"]]
    assert names == ["vit-huge"]


@pytest.mark.django_db
def test_members_see_their_project_and_superusers_see_all(clients, llm_run, vision_run):
    for persona in ("owner", "member"):
        names = [r["name"] for r in clients[persona].get(reverse("runs_json")).json()["runs"]]
        assert names == ["llama-8b-pretrain"], persona
        assert clients[persona].get(reverse("run", args=[llm_run.pk])).status_code == 200
    names = {r["name"] for r in clients["admin"].get(reverse("runs_json")).json()["runs"]}
    assert names == {"llama-8b-pretrain", "vit-huge"}
    assert clients["admin"].get(reverse("run_series", args=[vision_run.pk])).status_code == 200


@pytest.mark.django_db
def test_logout_is_a_post_form_with_csrf(clients, llm_run):
    page = clients["owner"].get(reverse("runs")).content.decode()
    assert f'method="post" action="{reverse("logout")}"' in page
    assert "csrfmiddlewaretoken" in page
