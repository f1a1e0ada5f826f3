"""Each channel delivers a real message: email to an SMTP server on loopback, Slack blocks and a
JSON webhook to an HTTP server on loopback."""

from __future__ import annotations

import pytest

from collectors.alerts import channels
from collectors.alerts.channels import DeliveryError
from collectors.alerts.messages import AlertMessage
from collectors.alerts.models import Channel, mask_url
from tests.collectors.alerts.conftest import closed_port_url, email_channel, slack_channel

MESSAGE = AlertMessage(
    state="firing", subject="[FIRING] Interruption: llm/run-1", title="[FIRING] crash — llm/run-1",
    run_label="llm/run-1", what="Attempt 0 stopped on node000 rank 3: RuntimeError",
    root_cause="GPU hardware (unexpected; confidence 90%, rule xid-79)",
    when="2026-01-01 03:00:00 UTC", link="https://runwatch.example.org/runs/1/failures/",
    rule="crash (Interruption)",
)


def test_email_reaches_the_smtp_server(project, smtp_server):
    channels.notify(email_channel(project), MESSAGE)
    [(recipients, mail)] = smtp_server.messages
    assert recipients == ["oncall@example.org"]
    assert mail["Subject"] == "[FIRING] Interruption: llm/run-1"
    body = mail.get_content()
    assert "GPU hardware (unexpected; confidence 90%, rule xid-79)" in body
    assert "https://runwatch.example.org/runs/1/failures/" in body


def test_slack_gets_blocks_with_run_what_cause_and_link(project, webhook_server):
    channels.notify(slack_channel(project, webhook_server.url), MESSAGE)
    [request] = webhook_server.requests
    assert request["path"] == "/services/T000/B000/abcdefghijklmnopqrstWXYZ"
    payload = request["json"]
    assert payload["text"] == MESSAGE.subject
    text = str(payload["blocks"])
    for part in ("llm/run-1", "RuntimeError", "GPU hardware", MESSAGE.link):
        assert part in text
    assert payload["blocks"][0]["type"] == "header"


def test_json_webhook_posts_the_message(project, webhook_server):
    channel = Channel.objects.create(project=project, kind="webhook", name="pager",
                                     config={"url": webhook_server.url})
    channels.notify(channel, MESSAGE)
    [request] = webhook_server.requests
    assert request["content_type"] == "application/json"
    assert request["json"]["root_cause"] == MESSAGE.root_cause
    assert request["json"]["link"] == MESSAGE.link


def test_unreachable_slack_is_a_retryable_error(project):
    with pytest.raises(DeliveryError) as error:
        channels.notify(slack_channel(project, closed_port_url()), MESSAGE)
    assert error.value.retryable


def test_a_4xx_answer_is_not_retried(project, webhook_server):
    webhook_server.status = 404
    with pytest.raises(DeliveryError) as error:
        channels.notify(slack_channel(project, webhook_server.url), MESSAGE)
    assert not error.value.retryable


def test_webhook_urls_are_masked():
    masked = mask_url("https://hooks.slack.com/services/T0/B0/secretsecretabcd")
    assert masked == "https://hooks.slack.com/…/XXXX…abcd"
    assert "secretsecret" not in masked
