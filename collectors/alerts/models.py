"""Alert rules, the channels they notify, the alerts they open and every notification attempt.

One open Alert per (rule, run, incident key) is the deduplication: however many ranks report the
same stop and however often beat looks, one incident is one Alert and one thread of messages."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.db import models
from django.utils import timezone as django_tz

from collectors.models import Category, Project, Run


def mask_url(url: str) -> str:
    """A webhook URL is a credential: keep its host and last four characters only."""
    if not url:
        return ""
    parts = urlsplit(url)
    tail = url.rstrip("/")[-4:]
    return f"{parts.scheme}://{parts.netloc}/…/XXXX…{tail}" if parts.netloc else f"XXXX…{tail}"


class Channel(models.Model):
    class Kind(models.TextChoices):
        EMAIL = "email", "Email"
        SLACK = "slack", "Slack"
        WEBHOOK = "webhook", "JSON webhook"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_channels")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=100)
    # {"recipients": [...]} for email, {"url": "..."} for Slack and webhooks. Secret: shown masked.
    config = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=django_tz.now)

    class Meta:
        ordering = ["project", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()}, {self.project.slug})"

    @property
    def recipients(self) -> list[str]:
        return list(self.config.get("recipients") or [])

    @property
    def url(self) -> str:
        return str(self.config.get("url") or "")

    @property
    def masked_target(self) -> str:
        if self.kind == self.Kind.EMAIL:
            return ", ".join(self.recipients)
        return mask_url(self.url)


class AlertRule(models.Model):
    class Kind(models.TextChoices):
        INTERRUPTION = "interruption", "Interruption"
        STALL = "stall", "Stall (no progress)"
        THROUGHPUT_DROP = "throughput_drop", "Throughput drop"
        GPU_TEMPERATURE = "gpu_temperature", "GPU temperature / throttling"
        POWER_SWING = "power_swing", "Power swing"
        ETTR_BELOW = "ettr_below", "ETTR below target"
        CHECKPOINT_OVERDUE = "checkpoint_overdue", "Checkpoint overdue"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_rules")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, null=True, blank=True,
                            related_name="alert_rules",
                            help_text="Empty: every run of the project.")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    # Per kind, validated by collectors.alerts.forms.validate_parameters.
    parameters = models.JSONField(default=dict, blank=True)
    # Interruption rules only; empty means any category.
    categories = models.JSONField(default=list, blank=True)
    cooldown_minutes = models.PositiveIntegerField(
        default=30, help_text="No new firing message for this rule and run within this time.")
    enabled = models.BooleanField(default=True)
    channels = models.ManyToManyField(Channel, blank=True, related_name="rules")
    created_at = models.DateTimeField(default=django_tz.now)

    class Meta:
        ordering = ["project", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()}, {self.project.slug})"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from collectors.alerts.forms import validate_parameters

        problems = validate_parameters(self.kind, self.parameters, self.categories)
        if problems:
            # Not keyed by field: the admin edits the parameters as one JSON object.
            raise ValidationError(list(problems.values()))
        if self.run_id and self.project_id and self.run.project_id != self.project_id:
            raise ValidationError("The run must belong to the rule's project.")

    def category_labels(self) -> list[str]:
        labels = dict(Category.choices)
        return [labels.get(slug, slug) for slug in self.categories]


class Alert(models.Model):
    class State(models.TextChoices):
        FIRING = "firing"
        RESOLVED = "resolved"

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alerts")
    incident_key = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=State.choices, default=State.FIRING)
    opened_at = models.DateTimeField(default=django_tz.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    # Whether a firing message went out: only then does the resolution get one (a suppressed
    # incident inside the cooldown stays silent from start to end).
    notified = models.BooleanField(default=False)
    summary = models.TextField(blank=True)
    root_cause = models.TextField(blank=True)

    class Meta:
        ordering = ["-opened_at"]
        constraints = [
            # Dedup in the schema: two evaluations racing on one incident open it once.
            models.UniqueConstraint(fields=["rule", "run", "incident_key"],
                                    condition=models.Q(state="firing"), name="one_open_alert"),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} on {self.run} [{self.state}]"


class Notification(models.Model):
    class Kind(models.TextChoices):
        FIRING = "firing"
        RESOLVED = "resolved"
        TEST = "test"

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, null=True, blank=True,
                              related_name="notifications")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=django_tz.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.kind} → {self.channel.name} [{self.status}]"
