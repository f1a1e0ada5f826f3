"""Slack through an incoming webhook (slack_sdk's WebhookClient), as a message with blocks."""

from __future__ import annotations

from typing import Any

from collectors.alerts.channels import TIMEOUT_S, DeliveryError, http_failure
from collectors.alerts.messages import AlertMessage
from collectors.alerts.models import Channel


def blocks(message: AlertMessage) -> list[dict[str, Any]]:
    fields = [
        {"type": "mrkdwn", "text": f"*Run*\n{message.run_label}"},
        {"type": "mrkdwn", "text": f"*When*\n{message.when}"},
        {"type": "mrkdwn", "text": f"*What*\n{message.what}"},
        {"type": "mrkdwn", "text": f"*Likely root cause*\n{message.root_cause or '—'}"},
    ]
    found: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": message.title[:150]}},
        {"type": "section", "fields": fields},
    ]
    if message.link:
        found.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Open the run"},
             "url": message.link},
        ]})
    found.append({"type": "context",
                  "elements": [{"type": "mrkdwn", "text": f"Rule: {message.rule}"}]})
    return found


def notify(channel: Channel, message: AlertMessage) -> None:
    from slack_sdk.webhook import WebhookClient

    if not channel.url:
        raise DeliveryError("the channel has no webhook URL", retryable=False)
    client = WebhookClient(channel.url, timeout=TIMEOUT_S)
    try:
        response = client.send(text=message.subject, blocks=blocks(message))
    except OSError as error:  # URLError, timeouts, refused connections
        raise DeliveryError(f"Slack webhook unreachable: {error}") from error
    if response.status_code != 200:
        raise http_failure(response.status_code, response.body or "")
