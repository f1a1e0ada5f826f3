"""Event rules from ingest: a crash reported by two ranks is one alert, one email and one Slack
message with the root cause and a link; the restart resolves it; a second crash within the
cooldown sends nothing; a channel that is down never fails ingest and is retried with backoff."""

from __future__ import annotations

import random
import time

import pytest

from collectors.alerts import tasks
from collectors.alerts.models import Alert, Notification
from collectors.alerts.tasks import deliver, retry_countdown
from collectors.tasks import ingest_batch
from tests.batches import step_batch
from tests.collectors.alerts.conftest import (
    closed_port_url,
    email_channel,
    make_rule,
    slack_channel,
)

T0 = time.time() - 3600


def crash(rank: int, attempt: int, t0: float) -> dict:
    """Ten steps, then an XID 79 and the exception it caused."""
    return step_batch(rank=rank, attempt=attempt, t0=t0, events=[
        {"kind": "xid", "ts": t0 + 10, "xid": 79},
        {"kind": "interruption", "ts": t0 + 11, "exc_type": "RuntimeError",
         "message": "CUDA error: unspecified launch failure"},
    ])


def ingest(batches, token, capture):
    with capture(execute=True):
        return [ingest_batch(batch, token=token) for batch in batches]


def test_crash_notifies_once_with_root_cause_and_resolves_on_restart(
        project, token, smtp_server, webhook_server, public_url, eager,
        django_capture_on_commit_callbacks):
    make_rule(project, "interruption", [email_channel(project),
                                        slack_channel(project, webhook_server.url)])
    results = ingest([crash(0, 0, T0), crash(1, 0, T0)], token, django_capture_on_commit_callbacks)
    assert all(result["stored"] for result in results)

    [alert] = Alert.objects.all()
    assert alert.state == "firing" and alert.incident_key == "attempt:0"
    [(recipients, mail)] = smtp_server.messages
    assert recipients == ["oncall@example.org"]
    assert mail["Subject"] == "[FIRING] Interruption: llm/run-1"
    body = mail.get_content()
    link = f"https://runwatch.example.org/runs/{alert.run_id}/failures/"
    assert "RuntimeError" in body and "GPU hardware (unexpected; confidence" in body
    assert "rule xid-gpu-hardware" in body and link in body
    [slack] = webhook_server.requests
    blocks = str(slack["json"]["blocks"])
    for part in ("llm/run-1", "RuntimeError", "GPU hardware", "xid-gpu-hardware", link):
        assert part in blocks

    # The restart's first steps resolve it: one resolved message per channel.
    ingest([step_batch(rank=0, attempt=1, t0=T0 + 100)], token, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        tasks.evaluate_windows()
    alert.refresh_from_db()
    assert alert.state == "resolved"
    assert [m["Subject"] for _, m in smtp_server.messages] == [
        "[FIRING] Interruption: llm/run-1", "[RESOLVED] Interruption: llm/run-1"]
    assert len(webhook_server.requests) == 2
    assert Notification.objects.filter(status="sent").count() == 4


def test_second_crash_within_cooldown_sends_nothing(project, token, webhook_server, eager,
                                                    django_capture_on_commit_callbacks):
    make_rule(project, "interruption", [slack_channel(project, webhook_server.url)],
              cooldown_minutes=30)
    capture = django_capture_on_commit_callbacks
    ingest([crash(0, 0, T0)], token, capture)
    ingest([step_batch(rank=0, attempt=1, t0=T0 + 100)], token, capture)
    with capture(execute=True):
        tasks.evaluate_windows()
    ingest([crash(0, 1, T0 + 200)], token, capture)   # the same failure again, minutes later
    ingest([step_batch(rank=0, attempt=2, t0=T0 + 300)], token, capture)
    with capture(execute=True):
        tasks.evaluate_windows()

    assert [a.notified for a in Alert.objects.order_by("opened_at")] == [True, False]
    assert [r["json"]["text"].split()[0] for r in webhook_server.requests] == [
        "[FIRING]", "[RESOLVED]"]


def test_category_filter(project, token, webhook_server, eager,
                         django_capture_on_commit_callbacks):
    make_rule(project, "interruption", [slack_channel(project, webhook_server.url)],
              categories=["network"])
    ingest([crash(0, 0, T0)], token, django_capture_on_commit_callbacks)
    assert not Alert.objects.exists() and not webhook_server.requests


def test_channel_down_does_not_fail_ingest_and_is_retried(
        project, token, webhook_server, eager, monkeypatch, django_capture_on_commit_callbacks):
    channel = slack_channel(project, closed_port_url())
    make_rule(project, "interruption", [channel])
    [result] = ingest([crash(0, 0, T0)], token, django_capture_on_commit_callbacks)
    assert result["stored"] and result["steps"] == 10

    [notification] = Notification.objects.all()
    assert (notification.status, notification.attempts) == ("failed", 1)
    assert "unreachable" in notification.error

    # On a worker, the failure schedules a retry with backoff instead of giving up.
    scheduled = []

    class Retry(Exception):
        pass

    def fake_retry(*args, **kwargs):
        scheduled.append(kwargs)
        return Retry()

    task = deliver._get_current_object()
    monkeypatch.setattr(task, "retry", fake_retry)
    with pytest.raises(Retry):
        task.run(notification.pk)
    [retry] = scheduled
    assert 15 <= retry["countdown"] <= 30
    notification.refresh_from_db()
    assert (notification.status, notification.attempts) == ("failed", 2)

    # The channel is back: the retry delivers.
    channel.config = {"url": webhook_server.url}
    channel.save()
    task.run(notification.pk)
    notification.refresh_from_db()
    assert (notification.status, notification.attempts) == ("sent", 3)
    assert len(webhook_server.requests) == 1


def test_a_broken_alert_hook_never_fails_ingest(project, token, eager, monkeypatch,
                                               django_capture_on_commit_callbacks):
    def broken(run_id):
        raise RuntimeError("broker down")

    monkeypatch.setattr(tasks.evaluate_run_events, "delay", broken)
    [result] = ingest([crash(0, 0, T0)], token, django_capture_on_commit_callbacks)
    assert result["stored"]


def test_backoff_grows_with_jitter_and_a_cap():
    rng = random.Random(1)
    assert all(15 <= retry_countdown(0, rng) <= 30 for _ in range(20))
    assert 60 <= retry_countdown(2, rng) <= 120
    assert 900 <= retry_countdown(12, rng) <= 1800
