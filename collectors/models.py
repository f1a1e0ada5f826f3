"""What the collectors store: projects and their ingest tokens, runs and attempts, and the
telemetry tables (steps, GPU samples, events, checkpoints) written in bulk from batches."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone as django_tz

TOKEN_PREFIX = "rw_"


def hash_token(token: str) -> str:
    # Tokens are 256-bit random strings, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


class Project(models.Model):
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="projects")
    created_at = models.DateTimeField(default=django_tz.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def visible_to(self, user) -> bool:
        return user.is_superuser or self.members.filter(pk=user.pk).exists()


class IngestTokenQuerySet(models.QuerySet):
    def authenticate(self, token: str | None) -> IngestToken | None:
        """The live token matching ``token``, or None. Compared in constant time."""
        if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        digest = hash_token(token)
        found = self.filter(hashed=digest, revoked_at__isnull=True).select_related("project").first()
        if found is None or not hmac.compare_digest(found.hashed, digest):
            return None
        return found


class IngestToken(models.Model):
    """A secret that lets a training job write into one project. Only its hash is kept."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, blank=True)
    # The first characters, to tell tokens apart in the admin without showing the secret.
    prefix = models.CharField(max_length=16, editable=False)
    hashed = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=django_tz.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = IngestTokenQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.project.slug})"

    @classmethod
    def issue(cls, project: Project, name: str = "") -> tuple[IngestToken, str]:
        """Creates a token and returns it with its plain text, which is not stored anywhere."""
        plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            project=project, name=name, prefix=plain[:10], hashed=hash_token(plain)
        )
        return token, plain


class Run(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"
        INTERRUPTED = "interrupted"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200)
    config = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # The cluster site's zone, for "throughput against the time of day".
    timezone = models.CharField(max_length=64, default="UTC")
    world_size = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=django_tz.now)
    first_seen_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="run_name_unique")]
        indexes = [models.Index(fields=["-last_seen_at"], name="run_last_seen")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"

    def is_stale(self, now=None) -> bool:
        """Running by its last word, but silent for longer than RUNWATCH_STALE_AFTER_S."""
        if self.status != self.Status.RUNNING or self.last_seen_at is None:
            return False
        now = now or django_tz.now()
        return now - self.last_seen_at > timedelta(seconds=settings.RUNWATCH_STALE_AFTER_S)


class Attempt(models.Model):
    """One start of the job (torchrun's restart count, or an explicit attempt id)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_number_unique")
        ]

    def __str__(self) -> str:
        return f"{self.run} #{self.number}"


class IngestedBatch(models.Model):
    """One row per stored batch: the primary key makes a redelivered batch a no-op."""

    batch_id = models.UUIDField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="batches")
    rank = models.PositiveIntegerField()
    # Where the rank ran: how stragglers and GPU health name a rank's host and GPU.
    host = models.CharField(max_length=255, blank=True)
    local_rank = models.PositiveIntegerField(null=True, blank=True)
    received_at = models.DateTimeField(default=django_tz.now)
    steps = models.PositiveIntegerField(default=0)
    gpu_samples = models.PositiveIntegerField(default=0)
    events = models.PositiveIntegerField(default=0)


class RejectedBatch(models.Model):
    """A batch the collectors refused, with why: the dead-letter list an admin can read."""

    batch_id = models.CharField(max_length=64, blank=True)
    project = models.CharField(max_length=100, blank=True)
    reason = models.TextField()
    field = models.CharField(max_length=200, blank=True)
    received_at = models.DateTimeField(default=django_tz.now)
    # The start of the payload, enough to see what the sender did wrong.
    excerpt = models.TextField(blank=True)

    class Meta:
        ordering = ["-received_at"]


class StepMetric(models.Model):
    # No database foreign keys on the raw telemetry: PostgreSQL checks each row's two keys at
    # COMMIT, about two thirds of the database's cost per batch (bench/README.md). Ingest reads
    # both ids inside the batch's own transaction, and Django still cascades a run's deletion.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, db_index=False,
                                db_constraint=False)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    ts = models.DateTimeField()
    duration_s = models.FloatField(null=True)
    tokens = models.BigIntegerField(null=True)
    loss = models.FloatField(null=True)
    lr = models.FloatField(null=True)
    grad_norm = models.FloatField(null=True)
    # Every other scalar the user logged, by name.
    extra = models.JSONField(default=dict)

    class Meta:
        # The run page reads a run's steps in time order; the runs list reads a run's latest ones.
        indexes = [models.Index(fields=["run", "ts"], name="step_run_ts")]


class GpuSample(models.Model):
    # No database foreign keys on the raw telemetry: PostgreSQL checks each row's two keys at
    # COMMIT, about two thirds of the database's cost per batch (bench/README.md). Ingest reads
    # both ids inside the batch's own transaction, and Django still cascades a run's deletion.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, db_index=False,
                                db_constraint=False)
    host = models.CharField(max_length=255)
    gpu = models.PositiveSmallIntegerField()
    ts = models.DateTimeField()
    temp_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    util_pct = models.FloatField(null=True)
    mem_used_mb = models.FloatField(null=True)
    sm_clock_mhz = models.FloatField(null=True)
    # NVML clock-throttle reason bits.
    throttle = models.BigIntegerField(null=True)
    simulated = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["run", "ts"], name="gpu_run_ts")]


# Rollups: one row per run, source and minute, kept up to date by the ingest transaction that writes
# the raw rows (collectors.rollups), so they count every stored batch exactly once. Long ranges and
# whole-run analyses (time of day, stragglers, GPU health, power overview) read these instead of the
# raw tables; sums and counts rather than averages so that later batches merge in exactly.


class StepMinute(models.Model):
    """A rank's steps that ended within one minute."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)
    rank = models.PositiveIntegerField()
    minute = models.DateTimeField()  # start of the minute, UTC
    steps = models.PositiveIntegerField(default=0)
    last_step = models.BigIntegerField(null=True)
    duration_n = models.PositiveIntegerField(default=0)  # steps that reported a duration
    duration_sum = models.FloatField(default=0.0)
    duration_max = models.FloatField(null=True)
    tokens = models.BigIntegerField(default=0)
    loss_n = models.PositiveIntegerField(default=0)
    loss_sum = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "minute", "rank"],
                                               name="step_minute_unique")]


class GpuMinute(models.Model):
    """One GPU's samples within one minute."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)
    host = models.CharField(max_length=255)
    gpu = models.PositiveSmallIntegerField()
    minute = models.DateTimeField()  # start of the minute, UTC
    samples = models.PositiveIntegerField(default=0)
    temp_n = models.PositiveIntegerField(default=0)
    temp_sum = models.FloatField(default=0.0)
    temp_max = models.FloatField(null=True)
    power_n = models.PositiveIntegerField(default=0)
    power_sum = models.FloatField(default=0.0)
    power_min = models.FloatField(null=True)
    power_max = models.FloatField(null=True)
    util_n = models.PositiveIntegerField(default=0)
    util_sum = models.FloatField(default=0.0)
    clock_n = models.PositiveIntegerField(default=0)
    clock_sum = models.FloatField(default=0.0)
    clock_min = models.FloatField(null=True)
    throttled = models.PositiveIntegerField(default=0)  # samples with a throttling reason bit set
    throttle_bits = models.BigIntegerField(default=0)  # OR of the reason bits seen

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "minute", "host", "gpu"],
                                               name="gpu_minute_unique")]


class _MinuteTotals(models.Model):
    """What HostMinute and ClusterMinute sum over GPUs with a power sample in one minute."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)
    minute = models.DateTimeField()  # start of the minute, UTC
    gpus = models.PositiveIntegerField(default=0)
    power_samples = models.PositiveIntegerField(default=0)
    power_mean_sum = models.FloatField(default=0.0)  # Σ over GPUs of power_sum / power_n
    power_min_sum = models.FloatField(default=0.0)
    power_max_sum = models.FloatField(default=0.0)
    temp_n = models.PositiveIntegerField(default=0)
    temp_sum = models.FloatField(default=0.0)

    class Meta:
        abstract = True


class HostMinute(_MinuteTotals):
    """One host's GpuMinute rows of one minute summed over its GPUs, kept from GpuMinute by ingest
    (collectors.rollups): whole-run cluster reads cost a row per host, not per GPU, a minute.
    ``gpus``, ``power_*`` and ``power_samples`` cover the GPUs with a power sample that minute."""

    host = models.CharField(max_length=255)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "minute", "host"],
                                               name="host_minute_unique")]


class ClusterMinute(_MinuteTotals):
    """A run's HostMinute rows of one minute summed over its hosts, kept from HostMinute by ingest
    (collectors.rollups): the Power page's whole-run series reads a row per minute, not one per
    host per minute (6.6k rows instead of 417k for 64 hosts over 4.6 days)."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "minute"],
                                               name="cluster_minute_unique")]


class GpuHour(models.Model):
    """One GPU's GpuMinute rows of one hour merged (sums and counts add, extremes compare), kept
    from GpuMinute by ingest. ``throttled`` counts only minutes whose bits include a throttling
    reason (collectors.analysis.gpu_health.THROTTLING_MASK), as GPU health reads it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)
    host = models.CharField(max_length=255)
    gpu = models.PositiveSmallIntegerField()
    hour = models.DateTimeField()  # start of the hour, UTC
    samples = models.PositiveIntegerField(default=0)
    temp_n = models.PositiveIntegerField(default=0)
    temp_sum = models.FloatField(default=0.0)
    temp_max = models.FloatField(null=True)
    power_n = models.PositiveIntegerField(default=0)
    power_sum = models.FloatField(default=0.0)
    power_min = models.FloatField(null=True)
    power_max = models.FloatField(null=True)
    util_n = models.PositiveIntegerField(default=0)
    util_sum = models.FloatField(default=0.0)
    clock_n = models.PositiveIntegerField(default=0)
    clock_sum = models.FloatField(default=0.0)
    clock_min = models.FloatField(null=True)
    throttled = models.PositiveIntegerField(default=0)
    throttle_bits = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "hour", "host", "gpu"],
                                               name="gpu_hour_unique")]


class StepQuarter(models.Model):
    """One rank's StepMinute rows of one quarter hour, kept from StepMinute by ingest: the run
    page of a run of days reads ~100 of these a day per rank instead of 1,440 minutes. Besides
    the sums, each chart's lowest and highest minute with where it sits on the chart's x axis
    (its last step, or its start), so that drawn from these the charts keep every minute's
    extreme that a min/max downsampling of the minutes would: a loss spike, a slow step, a
    throughput dip. A minute's value is what the minute charts plot: its mean loss, its slowest
    step, its tokens (or steps) over the time its steps took."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)
    rank = models.PositiveIntegerField()
    quarter = models.DateTimeField()  # start of the quarter hour, UTC
    minutes = models.PositiveIntegerField(default=0)  # StepMinute rows merged
    steps = models.PositiveIntegerField(default=0)
    last_step = models.BigIntegerField(null=True)
    duration_n = models.PositiveIntegerField(default=0)
    duration_sum = models.FloatField(default=0.0)
    tokens = models.BigIntegerField(default=0)
    loss_n = models.PositiveIntegerField(default=0)
    loss_sum = models.FloatField(default=0.0)
    loss_low = models.FloatField(null=True)
    loss_low_step = models.BigIntegerField(null=True)
    loss_high = models.FloatField(null=True)
    loss_high_step = models.BigIntegerField(null=True)
    slowest_low = models.FloatField(null=True)
    slowest_low_step = models.BigIntegerField(null=True)
    slowest_high = models.FloatField(null=True)
    slowest_high_step = models.BigIntegerField(null=True)
    token_rate_low = models.FloatField(null=True)
    token_rate_low_at = models.DateTimeField(null=True)
    token_rate_high = models.FloatField(null=True)
    token_rate_high_at = models.DateTimeField(null=True)
    step_rate_low = models.FloatField(null=True)
    step_rate_low_at = models.DateTimeField(null=True)
    step_rate_high = models.FloatField(null=True)
    step_rate_high_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "rank", "quarter"],
                                               name="step_quarter_unique")]


class Event(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False)
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, db_index=False)
    rank = models.PositiveIntegerField()
    host = models.CharField(max_length=255)
    kind = models.CharField(max_length=32)
    ts = models.DateTimeField()
    payload = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["run", "kind", "ts"], name="event_run_kind_ts")]


class Checkpoint(models.Model):
    class Kind(models.TextChoices):
        SAVE = "save"
        LOAD = "load"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="checkpoints")
    rank = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    step = models.BigIntegerField(null=True)
    ts = models.DateTimeField()
    duration_s = models.FloatField(null=True)
    bytes = models.BigIntegerField(null=True)
    path = models.TextField(blank=True)

    class Meta:
        ordering = ["ts"]


class Category(models.TextChoices):
    """Root-cause categories of DESIGN.md; the slugs are stable and used in the API."""

    GPU_HARDWARE = "gpu_hardware", "GPU hardware"
    GPU_MEMORY = "gpu_memory", "GPU memory (HBM/ECC)"
    GPU_OOM = "gpu_oom", "GPU out of memory"
    NETWORK = "network", "Network"
    NCCL_TIMEOUT = "nccl_timeout", "NCCL timeout / collective hang"
    HOST = "host", "Host (CPU, RAM, OS)"
    HOST_MAINTENANCE = "host_maintenance", "Host maintenance"
    STORAGE = "storage", "Storage"
    DATALOADER = "dataloader", "Dataloader"
    SOFTWARE_BUG = "software_bug", "Software bug"
    NUMERICAL = "numerical", "Numerical (NaN/Inf)"
    PLANNED = "planned", "Planned (preemption, stop)"
    UNKNOWN = "unknown", "Unknown"


class Interruption(models.Model):
    """One stop of an attempt: reported by the plugin or the launcher, or inferred by the stall
    detector. The classifier's verdict and an engineer's label are both kept; the label wins."""

    class Source(models.TextChoices):
        EXCEPTION = "exception"
        SIGNAL = "signal"
        LAUNCHER = "launcher"
        STALL = "stall"
        KILL = "kill"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="interruptions")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="interruptions")
    event = models.OneToOneField(Event, on_delete=models.SET_NULL, null=True, blank=True)
    ts = models.DateTimeField()
    rank = models.PositiveIntegerField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices)
    # What the classifier decided, and from what.
    category = models.CharField(max_length=32, choices=Category.choices, default=Category.UNKNOWN)
    expected = models.BooleanField(default=False)
    confidence = models.FloatField(default=0.0)
    rule = models.CharField(max_length=100, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    # An engineer's re-label; None means "as classified".
    label_category = models.CharField(max_length=32, choices=Category.choices, blank=True)
    label_expected = models.BooleanField(null=True, blank=True)
    labelled_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                    blank=True, related_name="+")
    labelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["ts"]
        indexes = [models.Index(fields=["run", "ts"], name="interruption_run_ts")]

    def __str__(self) -> str:
        return f"{self.run} {self.effective_category} at {self.ts:%Y-%m-%d %H:%M:%S}"

    @property
    def effective_category(self) -> str:
        return self.label_category or self.category

    @property
    def effective_expected(self) -> bool:
        return self.expected if self.label_expected is None else self.label_expected


class ClassificationRule(models.Model):
    """One root-cause rule: when ``pattern`` matches the evidence ``field``, the interruption is
    ``category``. Shipped rules come from collectors/classification/rules_v1.json (origin "file");
    a rule saved in the admin becomes origin "admin" and wins over the file for its slug (see
    collectors.classification.rules)."""

    class Field(models.TextChoices):
        TEXT = "text", "Exception text / traceback / launcher stderr"
        EXC_TYPE = "exc_type", "Exception type"
        EXIT_CODE = "exit_code", "Exit code"
        SIGNAL = "signal", "Signal name (SIGTERM…)"
        XID = "xid", "XID as CODE:category"
        ECC_DBE = "ecc_dbe", "Double-bit ECC count"
        HEARTBEAT = "heartbeat", "Stall: source:alive|lost"

    class Origin(models.TextChoices):
        FILE = "file"
        ADMIN = "admin"

    slug = models.SlugField(max_length=100, unique=True)
    version = models.PositiveIntegerField(default=1)
    # Highest first; the first rule that matches decides.
    priority = models.IntegerField(default=50)
    category = models.CharField(max_length=32, choices=Category.choices)
    expected = models.BooleanField(default=False)
    confidence = models.FloatField(default=0.5)
    field = models.CharField(max_length=16, choices=Field.choices, default=Field.TEXT)
    pattern = models.TextField(help_text="Python regular expression, searched case-insensitively.")
    enabled = models.BooleanField(default=True)
    description = models.TextField(blank=True)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.ADMIN)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-priority", "slug"]

    def __str__(self) -> str:
        return f"{self.slug} → {self.category}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from collectors.classification.rules import rule_problems

        problems = rule_problems({"slug": self.slug, "category": self.category, "field": self.field,
                                  "pattern": self.pattern, "confidence": self.confidence,
                                  "priority": self.priority})
        if problems:
            raise ValidationError(problems)
