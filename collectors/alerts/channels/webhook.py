"""A generic JSON webhook: one POST of the message as a JSON object."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from collectors.alerts.channels import TIMEOUT_S, DeliveryError, http_failure
from collectors.alerts.messages import AlertMessage
from collectors.alerts.models import Channel


def notify(channel: Channel, message: AlertMessage) -> None:
    if not channel.url.startswith(("http://", "https://")):
        raise DeliveryError("the webhook URL must start with http:// or https://",
                            retryable=False)
    request = urllib.request.Request(
        channel.url, data=json.dumps(message.as_dict()).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "runwatch-alerts"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            response.read()
    except urllib.error.HTTPError as error:
        raise http_failure(error.code, error.read().decode(errors="replace")) from error
    except OSError as error:
        raise DeliveryError(f"webhook unreachable: {error}") from error
