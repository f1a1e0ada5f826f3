"""Alert channels: one module per kind, each with ``notify(channel, message) -> None`` that
raises DeliveryError on failure. Modules are imported when first used, so a server without
slack_sdk installed can still send email."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collectors.alerts.messages import AlertMessage
    from collectors.alerts.models import Channel

MODULES = {
    "email": "collectors.alerts.channels.email",
    "slack": "collectors.alerts.channels.slack",
    "webhook": "collectors.alerts.channels.webhook",
}
TIMEOUT_S = 10


class DeliveryError(Exception):
    """A message did not get through. ``retryable`` is False when trying again cannot help
    (a 4xx answer: a revoked webhook, a refused recipient)."""

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


def notifier(kind: str) -> Callable[[Channel, AlertMessage], None]:
    if kind not in MODULES:
        raise DeliveryError(f"unknown channel kind {kind!r}", retryable=False)
    return importlib.import_module(MODULES[kind]).notify


def notify(channel: Channel, message: AlertMessage) -> None:
    notifier(channel.kind)(channel, message)


def http_failure(status: int, body: str) -> DeliveryError:
    """429 and 5xx are worth another try; any other 4xx will answer the same next time."""
    retryable = status == 429 or status >= 500
    return DeliveryError(f"HTTP {status}: {body[:200]}", retryable=retryable)
