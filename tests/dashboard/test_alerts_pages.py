"""The alerts pages: members manage their project's rules and channels, send a test, read the
history; outsiders get 404s; secrets are never rendered in full; forms need CSRF."""

from __future__ import annotations

import pytest
from django.test import Client

from collectors.alerts.models import AlertRule, Channel, Notification
from tests.collectors.alerts.conftest import closed_port_url

SECRET = "https://hooks.slack.com/services/T0AAA/B0BBB/s3cr3tS3cr3tS3cr3tWXYZ"


@pytest.fixture
def channel(projects) -> Channel:
    return Channel.objects.create(project=projects["llm"], kind="slack", name="llm-oncall",
                                  config={"url": SECRET})


@pytest.fixture
def rule(projects, channel) -> AlertRule:
    rule = AlertRule.objects.create(project=projects["llm"], name="slow", kind="stall",
                                    parameters={"minutes": 15})
    rule.channels.set([channel])
    return rule


def test_member_sees_rules_and_masked_channels(clients, rule, channel):
    page = clients["member"].get("/alerts/").content.decode()
    assert "slow" in page and "llm-oncall" in page
    assert "https://hooks.slack.com/…/XXXX…WXYZ" in page
    assert "s3cr3t" not in page
    edit = clients["member"].get(f"/alerts/channels/{channel.pk}/").content.decode()
    assert "s3cr3t" not in edit and "XXXX…WXYZ" in edit


def test_outsider_cannot_see_or_edit(clients, rule, channel):
    outsider = clients["outsider"]
    assert "llm-oncall" not in outsider.get("/alerts/").content.decode()
    assert outsider.get(f"/alerts/rules/{rule.pk}/").status_code == 404
    assert outsider.get(f"/alerts/channels/{channel.pk}/").status_code == 404
    assert outsider.post(f"/alerts/channels/{channel.pk}/test").status_code == 404
    response = outsider.post(f"/alerts/rules/{rule.pk}/", {"name": "mine"})
    assert response.status_code == 404
    rule.refresh_from_db()
    assert rule.name == "slow"


def test_outsider_cannot_create_in_another_project(clients, projects):
    response = clients["outsider"].post("/alerts/channels/new", {
        "project": projects["llm"].pk, "name": "x", "kind": "email", "recipients": "a@b.org"})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not Channel.objects.exists()


def test_login_required(rule):
    response = Client().get("/alerts/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_create_rule_validates_parameters_per_kind(clients, projects, channel):
    member = clients["member"]
    response = member.post("/alerts/rules/new", {
        "project": projects["llm"].pk, "name": "hot", "kind": "gpu_temperature",
        "max_temp_c": "500", "cooldown_minutes": 30, "enabled": "on"})
    assert "must be between 30 and 130" in response.content.decode()
    response = member.post("/alerts/rules/new", {
        "project": projects["llm"].pk, "name": "hot", "kind": "gpu_temperature",
        "max_temp_c": "88", "cooldown_minutes": 30, "enabled": "on", "channels": [channel.pk]})
    assert response.status_code == 302
    rule = AlertRule.objects.get(name="hot")
    assert rule.parameters == {"max_temp_c": 88.0} and list(rule.channels.all()) == [channel]


def test_create_interruption_rule_with_categories(clients, projects):
    response = clients["owner"].post("/alerts/rules/new", {
        "project": projects["llm"].pk, "name": "hw", "kind": "interruption",
        "categories": ["gpu_hardware", "network"], "cooldown_minutes": 10, "enabled": "on"})
    assert response.status_code == 302
    assert AlertRule.objects.get(name="hw").categories == ["gpu_hardware", "network"]


def test_edit_channel_keeps_the_secret_when_left_empty(clients, projects, channel):
    response = clients["member"].post(f"/alerts/channels/{channel.pk}/", {
        "project": projects["llm"].pk, "name": "renamed", "kind": "slack", "url": ""})
    assert response.status_code == 302
    channel.refresh_from_db()
    assert channel.name == "renamed" and channel.url == SECRET


def test_forms_need_csrf(users, projects, channel):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["member"])
    assert client.post(f"/alerts/channels/{channel.pk}/test").status_code == 403
    assert client.post("/alerts/rules/new", {"name": "x"}).status_code == 403


def test_send_test_records_and_shows_the_result(clients, projects, webhook_server):
    good = Channel.objects.create(project=projects["llm"], kind="slack", name="good",
                                  config={"url": webhook_server.url})
    down = Channel.objects.create(project=projects["llm"], kind="slack", name="down",
                                  config={"url": closed_port_url()})
    page = clients["member"].post(f"/alerts/channels/{good.pk}/test", follow=True)
    assert "Test message sent to good." in page.content.decode()
    assert webhook_server.requests[0]["json"]["text"].startswith("[TEST]")
    page = clients["member"].post(f"/alerts/channels/{down.pk}/test", follow=True)
    assert "Test message to down failed" in page.content.decode()
    assert [(n.channel.name, n.kind, n.status, n.attempts) for n in Notification.objects.all()] \
        == [("down", "test", "failed", 1), ("good", "test", "sent", 1)]
    history = clients["member"].get("/alerts/history/").content.decode()
    assert "good" in history and "down" in history and "unreachable" in history
    assert "good" not in clients["outsider"].get("/alerts/history/").content.decode()


def test_admin_shows_channels_masked(clients, channel):
    admin = clients["admin"]
    listing = admin.get("/admin/alerts/channel/").content.decode()
    change = admin.get(f"/admin/alerts/channel/{channel.pk}/change/").content.decode()
    assert "XXXX…WXYZ" in listing
    assert "s3cr3t" not in listing and "s3cr3t" not in change
