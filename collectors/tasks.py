"""Celery tasks of the collectors. Ingest is idempotent (see collectors.ingest), which is what
makes late acknowledgement and redelivery safe."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import DataError, InterfaceError, OperationalError

from collectors.ingest import Refused, authorize, record_rejection, store_batch
from trainer_plugin.protocol import ProtocolError, validate_batch

log = logging.getLogger(__name__)

# Errors worth another try: the database restarting or unreachable. A bad batch or a bad token is
# never retried; it goes to the dead-letter list (RejectedBatch) instead.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)
RETRY_POLICY: dict[str, Any] = {
    "autoretry_for": TRANSIENT_ERRORS,
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    # ~1 hour of retries at the capped backoff: a database outage longer than that is an incident
    # someone is already handling, and the broker still holds everything behind this message.
    "max_retries": 60,
}


@shared_task(name="collectors.ingest_batch", acks_late=True, reject_on_worker_lost=True,
             ignore_result=True, **RETRY_POLICY)
def ingest_batch(batch: Any, token: str | None = None) -> dict[str, Any]:
    """Validates, authorizes and stores one batch. Returns what happened, for logs and tests."""
    # The broker path reaches here with no HTTP layer in front, so everything is checked again.
    try:
        batch = validate_batch(batch)
        project_id = authorize(token, batch["run"]["project"]).project_id
    except ProtocolError as error:
        log.warning("rejected batch: %s", error)
        record_rejection(batch, str(error), error.field)
        return {"rejected": str(error)}
    except Refused as error:
        log.warning("refused batch: %s", error)
        record_rejection(batch, str(error), "token")
        return {"rejected": str(error)}
    except RecursionError:
        # Only the broker path can deliver this: the HTTP API's JSON parser refuses it first.
        reason = "batch is nested too deeply to be a v1 batch"
        record_rejection(batch, reason, "batch")
        return {"rejected": reason}
    try:
        result = store_batch(batch, project_id)
    except DataError as error:
        # A value the validator let through but the database refuses: a validator gap, kept in the
        # dead-letter list for an admin to see rather than lost in a failed task's log.
        log.exception("batch %s refused by the database", batch["batch_id"])
        reason = f"the database refused a value of this batch: {str(error).splitlines()[0]}"
        record_rejection(batch, reason, None)
        return {"rejected": reason}
    return {"stored": result.stored, "run_id": result.run_id, "steps": result.steps,
            "gpu_samples": result.gpu_samples, "events": result.events}


def enqueue_batch(batch: dict[str, Any], token: str) -> None:
    """Hands a checked batch to the collectors. Raises when it could not be queued (or, embedded,
    stored), so that the sender gets no 202 and keeps the batch."""
    if ingest_batch.app.conf.task_always_eager:
        # Embedded mode: write in this request. A direct call raises the error itself instead of
        # Celery's eager retries, which would replay a locked SQLite write back to back.
        ingest_batch(batch, token=token)
    else:
        ingest_batch.apply_async(args=[batch], kwargs={"token": token})


@shared_task(name="collectors.detect_stalls", ignore_result=True, **RETRY_POLICY)
def detect_stalls() -> dict[str, Any]:
    """Beat task: records an interruption for every attempt that went silent (collectors.stalls).
    Safe to run on any schedule: each silent attempt is recorded once."""
    from collectors import stalls

    created = stalls.detect_stalls()
    return {"interruptions": [i.pk for i in created]}


@shared_task(name="collectors.ensure_partitions", ignore_result=True, **RETRY_POLICY)
def ensure_partitions() -> dict[str, Any]:
    """Beat task: today's and the next days' partitions of the step and GPU-sample tables, so
    ingest never has to create one on its hot path (collectors.partitions)."""
    from collectors import partitions

    return {"created": partitions.ensure_ahead()}
