"""What an alert says, built once and rendered by each channel: the run, what happened, the likely
root cause (category, confidence and the classifier's rule), when, and a link to the run."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.conf import settings
from django.urls import reverse

from collectors.alerts.models import Alert, AlertRule, Channel


@dataclass(frozen=True)
class AlertMessage:
    state: str  # firing | resolved | test
    subject: str
    title: str
    run_label: str
    what: str
    root_cause: str
    when: str
    link: str
    rule: str

    @property
    def text(self) -> str:
        lines = [self.title, "", f"Run: {self.run_label}", f"What: {self.what}",
                 f"Likely root cause: {self.root_cause or '—'}", f"When: {self.when}",
                 f"Rule: {self.rule}"]
        if self.link:
            lines.append(f"Link: {self.link}")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def run_link(run_id: int, kind: str = "") -> str:
    base = settings.RUNWATCH_PUBLIC_URL.rstrip("/")
    name = "run_failures" if kind == AlertRule.Kind.INTERRUPTION else "run"
    return f"{base}{reverse(name, args=[run_id])}" if base else ""


def for_alert(alert: Alert, state: str) -> AlertMessage:
    rule, run = alert.rule, alert.run
    when = alert.resolved_at if state == "resolved" and alert.resolved_at else alert.opened_at
    prefix = "[RESOLVED]" if state == "resolved" else "[FIRING]"
    what = alert.summary if state != "resolved" else f"Resolved: {alert.summary}"
    run_label = f"{run.project.slug}/{run.name}"
    return AlertMessage(
        state=state,
        subject=f"{prefix} {rule.get_kind_display()}: {run_label}",
        title=f"{prefix} {rule.name} — {run_label}",
        run_label=run_label, what=what, root_cause=alert.root_cause,
        when=f"{when:%Y-%m-%d %H:%M:%S} UTC", link=run_link(run.pk, rule.kind),
        rule=f"{rule.name} ({rule.get_kind_display()})",
    )


def channel_test_message(channel: Channel) -> AlertMessage:
    from django.utils import timezone

    return AlertMessage(
        state="test", subject=f"[TEST] Runwatch alerts: {channel.name}",
        title=f"[TEST] Runwatch can reach {channel.name}", run_label=channel.project.slug,
        what="A test message sent from the alerts page.", root_cause="",
        when=f"{timezone.now():%Y-%m-%d %H:%M:%S} UTC",
        link=settings.RUNWATCH_PUBLIC_URL.rstrip("/") + reverse("alerts")
        if settings.RUNWATCH_PUBLIC_URL else "",
        rule="send test",
    )
