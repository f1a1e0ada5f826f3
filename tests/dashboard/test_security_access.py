"""Access to every dashboard URL, enumerated from the URL resolver: a page or JSON endpoint added
later is covered without being listed here. Anonymous visitors (and ingest tokens, which can only
write) are sent to the login page; a signed-in user outside the run's project gets a 404; a member
gets the page. Every POST without a CSRF token is refused, admin included."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from collectors.alerts.models import AlertRule, Channel
from collectors.models import IngestToken, Interruption
from tests.security.urls import PUBLIC, Route, dashboard_routes, routes

SLACK_URL = "https://hooks.slack.com/services/T0SECRET/B0SECRET/abcdefSECRETxyz9876"


@pytest.fixture
def objects(llm_run, projects) -> dict[str, int]:
    """One object of the llm project for each kind of id a dashboard URL takes."""
    interruption = Interruption.objects.create(
        run=llm_run, attempt=llm_run.attempts.first(), ts=timezone.now(), rank=0,
        source=Interruption.Source.EXCEPTION)
    channel = Channel.objects.create(project=projects["llm"], kind=Channel.Kind.SLACK,
                                     name="oncall", config={"url": SLACK_URL})
    rule = AlertRule.objects.create(project=projects["llm"], name="any stop",
                                    kind=AlertRule.Kind.INTERRUPTION)
    rule.channels.add(channel)
    return {"run_id": llm_run.pk, "interruption_id": interruption.pk, "rule_id": rule.pk,
            "channel_id": channel.pk}


def _url(route: Route, objects: dict[str, int]) -> str:
    missing = [name for name in route.kwargs if name not in objects]
    if missing:
        pytest.fail(f"{route.route} takes {missing}: add an object for it to the `objects` "
                    "fixture of tests/dashboard/test_security_access.py, so its access is tested")
    return reverse(route.name, kwargs={name: objects[name] for name in route.kwargs})


def _get_or_post(client: Client, url: str, **headers):
    """GET, or POST where the view takes only POST (a 405 to GET)."""
    response = client.get(url, **headers)
    if response.status_code == 405:
        response = client.post(url, **headers)
    return response


def test_the_enumeration_finds_the_dashboard():
    names = {route.name for route in dashboard_routes()}
    assert {"runs", "runs_json", "run", "run_series", "run_failures", "alerts"} <= names
    assert len(names) >= 15


@pytest.mark.django_db
def test_every_dashboard_url_sends_anonymous_visitors_to_the_login_page(objects):
    client = Client()
    for route in dashboard_routes():
        url = _url(route, objects)
        for response in (client.get(url), client.post(url)):
            assert response.status_code == 302, (route.route, response.status_code)
            assert response["Location"] == f"{reverse('login')}?next={url}", route.route


@pytest.mark.django_db
def test_an_ingest_token_reads_nothing(objects, projects):
    _, plain = IngestToken.issue(projects["llm"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    for route in dashboard_routes():
        url = _url(route, objects)
        response = client.get(url)
        assert response.status_code in (302, 401), (route.route, response.status_code)
        assert plain not in response.content.decode(errors="replace")
    admin = client.get(reverse("admin:index"))
    assert admin.status_code == 302 and "/admin/login/" in admin["Location"]


@pytest.mark.django_db
def test_every_url_of_a_project_object_is_404_for_a_non_member(clients, objects):
    checked = 0
    for route in dashboard_routes():
        if not route.kwargs:
            continue
        response = _get_or_post(clients["outsider"], _url(route, objects))
        assert response.status_code == 404, (route.route, response.status_code)
        checked += 1
    assert checked >= 10


@pytest.mark.django_db
def test_every_dashboard_page_and_json_endpoint_answers_a_member(clients, objects):
    for route in dashboard_routes():
        url = _url(route, objects)
        response = clients["member"].get(url)
        if response.status_code == 405:  # POST-only actions; refused to outsiders above
            assert "POST" in response["Allow"], route.route
            continue
        assert response.status_code == 200, (route.route, response.status_code)


def _guess(route: Route, objects: dict[str, int]) -> str | None:
    values = {**objects, "app_label": "collectors", "object_id": "1", "id": "1",
              "content_type_id": "1"}
    try:
        return reverse(route.name, kwargs={name: values.get(name, "1") for name in route.kwargs})
    except NoReverseMatch:
        return None


@pytest.mark.django_db
def test_every_post_without_a_csrf_token_is_refused(objects, users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["admin"])  # a superuser: no view may refuse for lack of rights first
    refused, unreachable = [], []
    for route in routes():
        if route.name == "ingest":  # token-authenticated API, no cookies: CSRF does not apply
            continue
        url = _guess(route, objects)
        if url is None:
            unreachable.append(route.route)
            continue
        response = client.post(url, {"name": "x"})
        assert response.status_code == 403, (route.route, response.status_code)
        assert b"CSRF" in response.content, route.route
        refused.append(route.route)
    assert unreachable == []
    assert len(refused) >= 80  # the dashboard's forms and every admin form
    assert {r.name for r in routes()} - {"ingest"} - PUBLIC  # the enumeration is not empty


@pytest.mark.django_db
def test_the_csrf_protected_forms_work_with_their_token(users, projects):
    """The other side of the test above: a real browser flow with the token gets through."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["member"])
    page = client.get(reverse("alert_channel_new"))
    token = page.cookies["csrftoken"].value if "csrftoken" in page.cookies else None
    assert token and "csrfmiddlewaretoken" in page.content.decode()
    response = client.post(reverse("alert_channel_new"),
                           {"csrfmiddlewaretoken": token, "project": projects["llm"].pk,
                            "name": "mail", "kind": "email", "recipients": "ops@example.com"})
    assert response.status_code in (200, 302)
    assert Channel.objects.filter(name="mail").exists()
