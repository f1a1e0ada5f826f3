"""Authenticates and stores one validated batch: the part of ingest shared by the HTTP API and the
broker path. The batch id is claimed first, in the same transaction as the rows, so a batch that
is delivered again (a retry, a redelivery after a killed worker) writes nothing the second time."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone as django_tz

from collectors import bulk_write
from collectors.interruptions import record_interruptions
from collectors.models import (
    Attempt,
    Checkpoint,
    Event,
    GpuSample,
    IngestedBatch,
    IngestToken,
    RejectedBatch,
    Run,
    StepMetric,
)
from collectors.timestamps import from_epoch as _when

log = logging.getLogger(__name__)

# Scalars with a column of their own; every other metric goes to StepMetric.extra.
COLUMN_METRICS = ("loss", "lr", "grad_norm")
TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)


class Refused(Exception):
    """The batch is well-formed but may not be written (bad token, wrong project)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StoreResult:
    stored: bool
    run_id: int
    steps: int = 0
    gpu_samples: int = 0
    events: int = 0


def authorize(token: str | None, project_slug: str) -> IngestToken:
    """The token, if it may write into ``project_slug``; raises Refused otherwise."""
    if not token:
        raise Refused(
            "missing ingest token: send 'Authorization: Bearer <token>' "
            "(create one with `python manage.py createtoken PROJECT`)",
            401,
        )
    found = IngestToken.objects.authenticate(token)
    if found is None:
        raise Refused("the ingest token is not valid or has been revoked", 401)
    if found.project.slug != project_slug:
        raise Refused(
            f"this token belongs to project '{found.project.slug}'; "
            f"it cannot write into project '{project_slug}'",
            403,
        )
    now = django_tz.now()
    if found.last_used_at is None or now - found.last_used_at > TOKEN_TOUCH_INTERVAL:
        IngestToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found


def record_rejection(batch: Any, reason: str, field: str | None = None) -> None:
    """Keeps a refused batch's id and reason where an admin can see them."""
    batch_id = project = ""
    if isinstance(batch, dict):
        batch_id = str(batch.get("batch_id", ""))[:64]
        run = batch.get("run")
        if isinstance(run, dict):
            project = str(run.get("project", ""))[:100]
    RejectedBatch.objects.create(
        batch_id=batch_id, project=project, reason=reason[:2000], field=(field or "")[:200],
        excerpt=repr(batch)[:1000],
    )


def _step_rows(batch: dict[str, Any], run_id: int, attempt_id: int, rank: int) -> list[tuple]:
    steps = batch["steps"]
    metrics: dict[str, list] = steps["metrics"]
    columns = [metrics.get(name) for name in COLUMN_METRICS]
    extra_names = [name for name in metrics if name not in COLUMN_METRICS]
    none_column = [None] * len(steps["step"])
    loss, lr, grad_norm = (column if column is not None else none_column for column in columns)
    rows = []
    for i, (step, ts, duration, tokens) in enumerate(
        zip(steps["step"], steps["ts"], steps["duration_s"], steps["tokens"], strict=True)
    ):
        extra = {name: metrics[name][i] for name in extra_names if metrics[name][i] is not None}
        rows.append((run_id, attempt_id, rank, step, _when(ts), duration, tokens,
                     loss[i], lr[i], grad_norm[i], extra))
    return rows


def _gpu_rows(batch: dict[str, Any], run_id: int, attempt_id: int, host: str) -> list[tuple]:
    gpus = batch["gpus"]
    simulated = gpus["simulated"]
    return [
        (run_id, attempt_id, host, gpu, _when(ts), temp, power, util, mem, clock, throttle,
         simulated)
        for ts, gpu, temp, power, util, mem, clock, throttle in zip(
            gpus["ts"], gpus["gpu"], gpus["temp_c"], gpus["power_w"], gpus["util_pct"],
            gpus["mem_used_mb"], gpus["sm_clock_mhz"], gpus["throttle"], strict=True,
        )
    ]


def _event_rows(batch, run_id: int, attempt_id: int, rank: int, host: str) -> list[tuple]:
    rows = []
    for event in batch["events"]:
        payload = {k: v for k, v in event.items() if k not in ("kind", "ts")}
        rows.append((run_id, attempt_id, rank, host, event["kind"], _when(event["ts"]), payload))
    return rows


def _checkpoints(batch, run: Run, attempt: Attempt, rank: int) -> list[Checkpoint]:
    def number(value):
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    found = []
    for event in batch["events"]:
        if event["kind"] not in ("checkpoint_save", "checkpoint_load"):
            continue
        step = number(event.get("step"))
        size = number(event.get("bytes"))
        found.append(Checkpoint(
            run=run, attempt=attempt, rank=rank,
            kind=Checkpoint.Kind.SAVE if event["kind"] == "checkpoint_save" else Checkpoint.Kind.LOAD,
            step=int(step) if step is not None else None,
            ts=_when(event["ts"]),
            duration_s=number(event.get("duration_s")),
            bytes=int(size) if size is not None else None,
            path=str(event.get("path", ""))[:4096],
        ))
    return found


def _update_run_and_attempt(batch: dict[str, Any], run: Run, attempt: Attempt, rank: int) -> None:
    """Folds what the batch says about progress and status into the run and attempt rows, with
    single UPDATEs so concurrent batches of other ranks never overwrite each other's progress."""
    steps, events = batch["steps"], batch["events"]
    times = list(steps["ts"]) + list(batch["gpus"]["ts"]) + [e["ts"] for e in events]
    if times:
        Run.objects.filter(pk=run.pk).update(
            last_seen_at=Greatest(Coalesce(F("last_seen_at"), Value(_when(max(times)))),
                                  Value(_when(max(times)))),
            first_seen_at=Least(Coalesce(F("first_seen_at"), Value(_when(min(times)))),
                                Value(_when(min(times)))),
        )
    if steps["step"]:
        last = max(steps["step"])
        Run.objects.filter(pk=run.pk).update(
            last_step=Greatest(Coalesce(F("last_step"), Value(last)), Value(last))
        )
    started = [e["ts"] for e in events if e["kind"] == "start"] or steps["ts"][:1]
    if started:
        Attempt.objects.filter(pk=attempt.pk).update(
            started_at=Least(Coalesce(F("started_at"), Value(_when(min(started)))),
                             Value(_when(min(started))))
        )

    # A start of the newest attempt means the run is going again, whatever it said before.
    newest = Attempt.objects.filter(run=run).order_by("-number").values_list("number", flat=True)[0]
    for event in sorted(events, key=lambda e: e["ts"]):
        kind = event["kind"]
        if kind == "start" and attempt.number >= newest:
            Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
        elif kind == "interruption":
            reason = str(event.get("exc_type") or event.get("reason") or "interruption")[:200]
            Attempt.objects.filter(pk=attempt.pk).update(
                ended_at=_when(event["ts"]), exit_reason=reason
            )
            if attempt.number >= newest:
                Run.objects.filter(pk=run.pk).update(status=Run.Status.INTERRUPTED)
        elif kind == "finish":
            failed = event.get("status") not in (None, "finished", "ok", "success")
            # Every rank finishes; rank 0 speaks for a clean end, any rank for a failure.
            if not failed and rank != 0:
                continue
            Attempt.objects.filter(pk=attempt.pk).update(
                ended_at=_when(event["ts"]),
                exit_reason=str(event.get("status") or "finished")[:200],
            )
            if attempt.number >= newest:
                status = Run.Status.FAILED if failed else Run.Status.FINISHED
                Run.objects.filter(pk=run.pk).update(status=status)


def _evaluate_alerts(run_id: int) -> None:
    """Event alert rules, after the batch is committed; never a reason to fail the batch."""
    try:
        from collectors.alerts.tasks import evaluate_run_events

        evaluate_run_events.delay(run_id)
    except Exception:
        log.exception("could not evaluate alert rules for run %s", run_id)


def store_batch(batch: dict[str, Any], project_id: int) -> StoreResult:
    """Writes a validated batch for ``project_id`` in one transaction, once per batch id."""
    run_info, source = batch["run"], batch["source"]
    rank, host = source["rank"], source["host"]
    with transaction.atomic():
        run, _ = Run.objects.get_or_create(
            project_id=project_id,
            name=run_info["name"],
            defaults={"config": run_info.get("config") or {}, "world_size": source["world_size"]},
        )
        try:
            with transaction.atomic():
                IngestedBatch.objects.create(
                    batch_id=batch["batch_id"], run=run, rank=rank, host=host,
                    local_rank=source.get("local_rank"),
                    steps=len(batch["steps"]["step"]), gpu_samples=len(batch["gpus"]["ts"]),
                    events=len(batch["events"]),
                )
        except IntegrityError:
            log.info("batch %s was already stored; skipping the redelivery", batch["batch_id"])
            return StoreResult(stored=False, run_id=run.pk)

        attempt, _ = Attempt.objects.get_or_create(run=run, number=run_info["attempt"])
        step_rows = _step_rows(batch, run.pk, attempt.pk, rank)
        gpu_rows = _gpu_rows(batch, run.pk, attempt.pk, host)
        event_rows = _event_rows(batch, run.pk, attempt.pk, rank, host)
        bulk_write.write(StepMetric, bulk_write.STEP_COLUMNS, step_rows)
        bulk_write.write(GpuSample, bulk_write.GPU_COLUMNS, gpu_rows)
        bulk_write.write(Event, bulk_write.EVENT_COLUMNS, event_rows)
        checkpoints = _checkpoints(batch, run, attempt, rank)
        if checkpoints:
            Checkpoint.objects.bulk_create(checkpoints)
        # After the events are written: an interruption's evidence includes this batch's XIDs.
        record_interruptions(run, attempt, rank, host, batch["events"])

        changes = {}
        if run_info.get("config") and not run.config:
            changes["config"] = run_info["config"]
        if source["world_size"] > run.world_size:
            changes["world_size"] = source["world_size"]
        if changes:
            Run.objects.filter(pk=run.pk).update(**changes)
        _update_run_and_attempt(batch, run, attempt, rank)
        if any(event["kind"] == "interruption" for event in batch["events"]):
            transaction.on_commit(lambda: _evaluate_alerts(run.pk))
    return StoreResult(stored=True, run_id=run.pk, steps=len(step_rows),
                       gpu_samples=len(gpu_rows), events=len(event_rows))

