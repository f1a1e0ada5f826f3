"""The stall detector: finds attempts that went silent without saying why (a SIGKILL, an OOM
killer, a node that lost power, an NCCL hang its watchdog ended) and records an interruption for
each, so they are seen within minutes even when the process could not report anything.

An attempt is silent when neither a step row nor a heartbeat arrived for ``stall_after_s`` =
max(RUNWATCH_STALL_AFTER_S, 10 × its median step time): a job taking 20 s steps is not called
stalled after a minute. Heartbeats are ``heartbeat`` events and GPU samples: the sampler thread
keeps sending while the training loop is stuck, so they tell "alive but not stepping" from "gone".

- **hang**: heartbeats went on for at least ``stall_after_s`` after the last step, then stopped:
  the processes were alive but made no progress (a collective that never completed), until
  something (NCCL's watchdog, the launcher, an engineer) ended them.
- **kill**: steps and heartbeats stopped together: the processes died at once.

The detector runs on Celery beat (``collectors.detect_stalls``). It records at most one
interruption per attempt, and none for an attempt that already has one or that ended, so every
tick after the first is a no-op for that attempt. The interruption's time is the attempt's last
sign of life, not the tick that noticed it, so the result does not depend on when beat ran.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone as django_tz

from collectors.models import Attempt, Event, GpuSample, Interruption, Run, StepMetric
from collectors.timestamps import to_epoch as _epoch

log = logging.getLogger(__name__)

StallKind = Literal["hang", "kill"]
# Step times a median is taken over: the newest ones, read backwards along the (run, ts) index.
MEDIAN_WINDOW_ROWS = 1000
STEP_TIME_FACTOR = 10.0


def stall_after_s(median_step_s: float | None, floor_s: float) -> float:
    """How long an attempt may stay silent: max(floor, 10 × median step time)."""
    if median_step_s is None or median_step_s <= 0:
        return float(floor_s)
    return max(float(floor_s), STEP_TIME_FACTOR * median_step_s)


def detect_stall(
    last_step_at: float | None,
    last_heartbeat_at: float | None,
    median_step_s: float | None,
    now: float,
    *,
    floor_s: float = 60.0,
    started_at: float | None = None,
) -> StallKind | None:
    """None while the attempt is alive (or has never said anything), else "hang" or "kill".

    Times are Unix seconds. Without a step row, progress is measured from ``started_at``."""
    last_progress = last_step_at if last_step_at is not None else started_at
    signs = [t for t in (last_progress, last_heartbeat_at) if t is not None]
    if not signs:
        return None
    threshold = stall_after_s(median_step_s, floor_s)
    if now - max(signs) < threshold:
        return None
    if last_heartbeat_at is not None and last_progress is not None \
            and last_heartbeat_at - last_progress >= threshold:
        return "hang"
    return "kill"


@dataclass(frozen=True)
class AttemptSilence:
    """What the detector reads of one open attempt."""

    attempt_id: int
    run_id: int
    number: int
    started_at: datetime | None
    last_step_at: datetime | None
    last_heartbeat_at: datetime | None
    median_step_s: float | None


def open_attempts() -> list[AttemptSilence]:
    """Attempts that could be silent: not ended, not interrupted, in a running run."""
    query = Attempt.objects.filter(ended_at__isnull=True, run__status=Run.Status.RUNNING).exclude(
        Exists(Interruption.objects.filter(attempt=OuterRef("pk")))
    )
    candidates = list(query.values_list("id", "run_id", "number", "started_at"))
    found = []
    for attempt_id, run_id, number, started_at in candidates:
        found.append(AttemptSilence(
            attempt_id=attempt_id, run_id=run_id, number=number, started_at=started_at,
            last_step_at=_newest(StepMetric, run_id, attempt_id),
            last_heartbeat_at=_newest_heartbeat(run_id, attempt_id),
            median_step_s=_median_step_s(run_id, attempt_id),
        ))
    return found


def _newest(model, run_id: int, attempt_id: int) -> datetime | None:
    return (model.objects.filter(run_id=run_id, attempt_id=attempt_id)
            .order_by("-ts").values_list("ts", flat=True).first())


def _newest_heartbeat(run_id: int, attempt_id: int) -> datetime | None:
    event = (Event.objects.filter(run_id=run_id, kind="heartbeat", attempt_id=attempt_id)
             .order_by("-ts").values_list("ts", flat=True).first())
    gpu = _newest(GpuSample, run_id, attempt_id)
    known = [t for t in (event, gpu) if t is not None]
    return max(known) if known else None


def _median_step_s(run_id: int, attempt_id: int) -> float | None:
    if connection.vendor != "postgresql":
        return _median_step_s_portable(run_id, attempt_id)
    sql = (
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d.duration_s) FROM ("
        f"SELECT duration_s FROM {StepMetric._meta.db_table} WHERE run_id = %s AND attempt_id = %s"
        f" AND duration_s IS NOT NULL ORDER BY ts DESC LIMIT {MEDIAN_WINDOW_ROWS}) d"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, attempt_id])
        row = cursor.fetchone()
    return float(row[0]) if row and row[0] is not None else None


def _median_step_s_portable(run_id: int, attempt_id: int) -> float | None:
    """The same median for databases without percentile_cont (the embedded mode's SQLite):
    statistics.median interpolates between the middle two as percentile_cont(0.5) does."""
    durations = list(
        StepMetric.objects.filter(run_id=run_id, attempt_id=attempt_id, duration_s__isnull=False)
        .order_by("-ts").values_list("duration_s", flat=True)[:MEDIAN_WINDOW_ROWS]
    )
    return float(statistics.median(durations)) if durations else None


def detect_stalls(now: datetime | None = None, floor_s: float | None = None) -> list[Interruption]:
    """Records an interruption for every open attempt that has gone silent; returns them."""
    now = now or django_tz.now()
    floor_s = settings.RUNWATCH_STALL_AFTER_S if floor_s is None else floor_s
    created = []
    for silence in open_attempts():
        kind = detect_stall(
            _epoch(silence.last_step_at), _epoch(silence.last_heartbeat_at),
            silence.median_step_s, now.timestamp(), floor_s=floor_s,
            started_at=_epoch(silence.started_at),
        )
        if kind is None:
            continue
        interruption = _record(silence, kind, now, floor_s)
        if interruption is not None:
            created.append(interruption)
    return created


def _record(silence: AttemptSilence, kind: StallKind, now: datetime,
            floor_s: float) -> Interruption | None:
    from collectors.classification import classify  # the classifier loads its rules lazily

    signs = [t for t in (silence.last_step_at, silence.last_heartbeat_at, silence.started_at)
             if t is not None]
    silent_since = max(signs)
    threshold = stall_after_s(silence.median_step_s, floor_s)
    evidence = {
        "source": "stall",
        "detector": kind,
        "heartbeat_lost": kind == "kill",
        "text": "",
        "last_step_at": silence.last_step_at.isoformat() if silence.last_step_at else None,
        "last_heartbeat_at": (silence.last_heartbeat_at.isoformat()
                              if silence.last_heartbeat_at else None),
        "median_step_s": silence.median_step_s,
        "stall_after_s": threshold,
        "detected_at": now.isoformat(),
        "silent_for_s": round((now - silent_since).total_seconds(), 3),
    }
    verdict = classify({"source": "stall", "heartbeat_lost": kind == "kill", "text": ""})
    with transaction.atomic():
        # The row lock makes two beat ticks racing on one attempt record it once.
        attempt = Attempt.objects.select_for_update().get(pk=silence.attempt_id)
        if attempt.ended_at is not None or Interruption.objects.filter(attempt=attempt).exists():
            return None
        interruption = Interruption.objects.create(
            run_id=silence.run_id, attempt=attempt, ts=silent_since,
            source=Interruption.Source.STALL if kind == "hang" else Interruption.Source.KILL,
            category=verdict.category, expected=verdict.expected, confidence=verdict.confidence,
            rule=verdict.rule, evidence=evidence,
        )
        Attempt.objects.filter(pk=attempt.pk).update(
            ended_at=silent_since,
            exit_reason="hang (no step, then no heartbeat)" if kind == "hang"
            else "killed (steps and heartbeats stopped at once)",
        )
        newest = (Attempt.objects.filter(run_id=silence.run_id).order_by("-number")
                  .values_list("number", flat=True).first())
        if newest == attempt.number:
            Run.objects.filter(pk=silence.run_id, status=Run.Status.RUNNING).update(
                status=Run.Status.INTERRUPTED)
    log.warning("attempt %s of run %s went silent: recorded a %s (%s)", attempt.number,
                silence.run_id, kind, verdict.category)
    return interruption

