"""Celery tasks of alerts: event rules after ingest, window rules on beat, one delivery per
notification with retries. Nothing here can fail ingest: the hook in collectors.ingest only
enqueues, and delivery failures are recorded and retried, never raised to the caller."""

from __future__ import annotations

import logging
import random
from typing import Any

from celery import shared_task
from django.utils import timezone as django_tz

from collectors.alerts.channels import DeliveryError

log = logging.getLogger(__name__)

MAX_DELIVERY_RETRIES = 6
BACKOFF_BASE_S = 30
BACKOFF_MAX_S = 1800


def retry_countdown(retries: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: half of 30 s·2^retries (capped at 30 min) plus a random
    share of the other half, so a channel's outage does not make every retry land at once."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** retries)
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


@shared_task(name="alerts.evaluate_run_events", ignore_result=True)
def evaluate_run_events(run_id: int) -> None:
    """Event rules (interruption) of one run, right after a batch with an interruption landed."""
    from collectors.alerts.evaluate import evaluate_run
    from collectors.alerts.models import AlertRule
    from collectors.models import Run

    run = Run.objects.filter(pk=run_id).select_related("project").first()
    if run is not None:
        evaluate_run(run, kinds=[AlertRule.Kind.INTERRUPTION])


@shared_task(name="alerts.evaluate_windows", ignore_result=True)
def evaluate_windows() -> None:
    """Beat task: every rule on every run it covers (window rules, and the resolution of all)."""
    from collectors.alerts.evaluate import evaluate_windows as evaluate

    evaluate()


def attempt_delivery(notification) -> DeliveryError | None:
    """Sends one notification once and records the attempt; returns the error, if any."""
    from collectors.alerts import channels, messages

    notification.attempts += 1
    notification.last_attempt_at = django_tz.now()
    if notification.alert_id:
        message = messages.for_alert(notification.alert, notification.kind)
    else:
        message = messages.channel_test_message(notification.channel)
    failure = None
    try:
        channels.notify(notification.channel, message)
    except DeliveryError as error:
        failure = error
    except Exception as error:  # a bug in a channel module is a failed delivery, not a crash
        log.exception("channel %s raised", notification.channel_id)
        failure = DeliveryError(f"{type(error).__name__}: {error}", retryable=False)
    if failure is None:
        notification.status, notification.error = notification.Status.SENT, ""
        notification.sent_at = notification.last_attempt_at
    else:
        notification.status, notification.error = notification.Status.FAILED, str(failure)[:2000]
    notification.save(update_fields=["attempts", "last_attempt_at", "status", "error", "sent_at"])
    return failure


@shared_task(bind=True, name="alerts.deliver", ignore_result=True, acks_late=True,
             max_retries=MAX_DELIVERY_RETRIES)
def deliver(self, notification_id: int) -> dict[str, Any]:
    from collectors.alerts.models import Notification

    notification = (Notification.objects.select_related("channel__project", "alert__rule",
                                                        "alert__run__project")
                    .filter(pk=notification_id).first())
    if notification is None or notification.status == Notification.Status.SENT:
        return {"skipped": notification_id}
    failure = attempt_delivery(notification)
    if failure is None:
        return {"sent": notification_id, "attempts": notification.attempts}
    log.warning("notification %s via %s failed (attempt %s): %s", notification_id,
                notification.channel.kind, notification.attempts, failure)
    # Embedded mode has no worker to retry later; an inline retry would only block the caller.
    if failure.retryable and not self.request.is_eager and self.request.retries < self.max_retries:
        raise self.retry(countdown=retry_countdown(self.request.retries), exc=failure)
    return {"failed": notification_id, "attempts": notification.attempts}
