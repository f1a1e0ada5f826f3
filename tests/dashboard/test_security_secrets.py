"""Secrets are never rendered in full: webhook URLs (a Slack webhook URL is a credential), ingest
tokens (only their hash is stored) and the SMTP password, on every dashboard page and on every
admin list and form, read as a superuser who may see everything else."""

from __future__ import annotations

import hashlib

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import RequestFactory
from django.urls import reverse

from collectors.alerts.models import Channel
from collectors.models import IngestToken
from tests.dashboard.test_security_access import _get_or_post, _url, objects  # noqa: F401
from tests.security.urls import dashboard_routes

WEBHOOK_URL = "https://alerts.example.com/hook/WEBHOOKSECRET0123456789abcd"
SMTP_PASSWORD = "SMTP-pa55word-SECRET-42"
SLACK_SECRET = "abcdefSECRETxyz9876"


@pytest.fixture
def secrets(objects, projects, settings) -> list[str]:  # noqa: F811
    settings.EMAIL_HOST_PASSWORD = SMTP_PASSWORD
    Channel.objects.create(project=projects["llm"], kind=Channel.Kind.WEBHOOK, name="pager",
                           config={"url": WEBHOOK_URL})
    _, plain = IngestToken.issue(projects["llm"], name="cluster-a")
    return [SLACK_SECRET, "WEBHOOKSECRET0123456789abcd", SMTP_PASSWORD, plain, plain[10:]]


def _superuser_request():
    request = RequestFactory().get("/")
    request.user = User.objects.filter(is_superuser=True).first()
    return request


def _admin_urls() -> list[str]:
    urls = [reverse("admin:index")]
    for model, model_admin in admin.site._registry.items():
        base = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        urls.append(reverse(f"{base}_changelist"))
        if model_admin.has_add_permission(_superuser_request()):
            urls.append(reverse(f"{base}_add"))
        for obj in model.objects.all()[:3]:
            urls.append(reverse(f"{base}_change", args=[obj.pk]))
    return urls


def _assert_no_secret(response, secrets: list[str], where: str) -> None:
    body = response.content.decode(errors="replace")
    for secret in secrets:
        assert secret not in body, f"{where} shows a secret in full"


@pytest.mark.django_db
def test_no_dashboard_page_shows_a_secret(clients, objects, secrets):  # noqa: F811
    for route in dashboard_routes():
        for persona in ("member", "admin"):
            response = _get_or_post(clients[persona], _url(route, objects))
            _assert_no_secret(response, secrets, route.route)


@pytest.mark.django_db
def test_no_admin_list_or_form_shows_a_secret(clients, secrets):
    urls = _admin_urls()
    assert any("/alerts/channel/" in url and url.rstrip("/").split("/")[-2].isdigit()
               for url in urls)  # a channel's change form is among them
    for url in urls:
        response = clients["admin"].get(url)
        assert response.status_code == 200, url
        _assert_no_secret(response, secrets, url)


@pytest.mark.django_db
def test_channel_forms_show_the_webhook_url_masked(clients, objects):  # noqa: F811
    channel = Channel.objects.get(pk=objects["channel_id"])
    for url in (reverse("alert_channel_edit", args=[channel.pk]),
                reverse("admin:alerts_channel_change", args=[channel.pk])):
        html = clients["admin"].get(url).content.decode()
        assert channel.masked_target in html  # recognisable: host and last four characters
        assert SLACK_SECRET not in html


@pytest.mark.django_db
def test_ingest_tokens_are_stored_only_as_a_hash(projects):
    token, plain = IngestToken.issue(projects["llm"])

    assert token.hashed == hashlib.sha256(plain.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {IngestToken._meta.db_table}")
        stored = " ".join(str(value) for row in cursor.fetchall() for value in row)
    assert plain not in stored and plain[10:] not in stored
    assert token.prefix == plain[:10]  # enough to tell tokens apart, far too little to use
