"""Celery tasks of the collectors. Ingest is idempotent (see collectors.ingest), which is what
makes late acknowledgement and redelivery safe."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import DataError, InterfaceError, OperationalError, connection

from collectors.drain import DrainedTask
from collectors.ingest import (
    Refused,
    StoreResult,
    authorize,
    record_rejection,
    store_batch,
    store_batches,
)
from trainer_plugin.protocol import ProtocolError, validate_batch
from trainer_plugin.transports import message_codec

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


class IngestTask(DrainedTask):
    """The ingest task: one message is one batch. A worker stores the batches it received
    together in one transaction (collectors.drain); called directly, it stores one."""

    drain_max = settings.RUNWATCH_INGEST_DRAIN_MAX
    drain_wait_s = settings.RUNWATCH_INGEST_DRAIN_WAIT_S

    def drain(self, messages: list[tuple[str, tuple, dict]],
              undecodable: list[tuple[str, str]]) -> list[str]:
        for _, reason in undecodable:
            log.warning("rejected message: %s", reason)
            record_rejection(None, reason, "message")
        return store_drained([(message_id, *_arguments(args, kwargs))
                              for message_id, args, kwargs in messages])


def _arguments(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """(batch, token) of a message, however its sender spread them over args and kwargs; what is
    missing is None (and refused as such), extra arguments are ignored: a malformed message must
    not fail the whole drain, which would send it back to the queue again and again."""
    batch = args[0] if args else kwargs.get("batch")
    token = args[1] if len(args) > 1 else kwargs.get("token")
    return batch, token if isinstance(token, str) else None


@shared_task(name="collectors.ingest_batch", base=IngestTask, acks_late=True,
             reject_on_worker_lost=True, ignore_result=True, **RETRY_POLICY)
def ingest_batch(batch: Any, token: str | None = None) -> dict[str, Any]:
    """Validates, authorizes and stores one batch. Returns what happened, for logs and tests."""
    checked = _checked(batch, token)
    if "rejected" in checked:
        return checked
    return _stored_or_refused(checked["batch"], checked["project_id"])


def _checked(batch: Any, token: str | None,
             projects: dict[tuple[str | None, Any], int] | None = None) -> dict[str, Any]:
    """{"batch", "project_id"} of a batch that may be stored, or {"rejected": why} of one that was
    refused and recorded in the dead-letter list. ``projects`` remembers tokens already
    authorized (within one drain: a token is checked once, not once per batch)."""
    # The broker path reaches here with no HTTP layer in front, so everything is checked again.
    try:
        batch = validate_batch(batch)
        key = (token, batch["run"]["project"])
        if projects is not None and key in projects:
            project_id = projects[key]
        else:
            project_id = authorize(token, batch["run"]["project"]).project_id
            if projects is not None:
                projects[key] = project_id
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
    return {"batch": batch, "project_id": project_id}


def _stored_or_refused(batch: dict[str, Any], project_id: int) -> dict[str, Any]:
    try:
        result = store_batch(batch, project_id)
    except DataError as error:
        # A value the validator let through but the database refuses: a validator gap, kept in the
        # dead-letter list for an admin to see rather than lost in a failed task's log.
        log.exception("batch %s refused by the database", batch["batch_id"])
        reason = f"the database refused a value of this batch: {str(error).splitlines()[0]}"
        record_rejection(batch, reason, None)
        return {"rejected": reason}
    return _described(result)


def _described(result: StoreResult) -> dict[str, Any]:
    return {"stored": result.stored, "run_id": result.run_id, "steps": result.steps,
            "gpu_samples": result.gpu_samples, "events": result.events}


# While the database is down, a drain waits this long in all (1 + 2 + 4 + 8 + 16 s) before its
# messages go back to the queue: long enough to ride out a restart, short enough that a worker
# shutting down is not held for minutes.
DRAIN_RETRY_DELAYS_S = (1, 2, 4, 8, 16)


def store_drained(messages: list[tuple[str, Any, str | None]]) -> list[str]:
    """Stores the batches of (message id, batch, token) that a worker received together, in one
    transaction; returns the ids of the messages to put back in the queue (the database stayed
    down). A batch refused (bad, unauthorized, a value the database refuses) is recorded in the
    dead-letter list and its message acknowledged, as when it is stored."""
    checked: dict[int, dict[str, Any]] = {}  # kept across tries: a refusal is recorded once
    for attempt, delay in enumerate((*DRAIN_RETRY_DELAYS_S, None)):
        try:
            _store_drained_once(messages, checked)
            refused = sum("rejected" in found for found in checked.values())
            log.info("drained %d ingest messages in one transaction (%d refused)", len(messages),
                     refused)
            return []
        except TRANSIENT_ERRORS as error:
            connection.close()  # a broken session is not reused by the next try
            if delay is None:
                log.error("the database is still down after %d tries; %d batches go back to the "
                          "queue: %s", attempt + 1, len(messages), error)
                return [message_id for message_id, _, _ in messages]
            log.warning("storing %d batches failed on the database (%s); Retry in %d s",
                        len(messages), str(error).strip().splitlines()[0] if str(error) else
                        type(error).__name__, delay)
            time.sleep(delay)
    return []  # not reached


def _store_drained_once(messages: list[tuple[str, Any, str | None]],
                        checked: dict[int, dict[str, Any]]) -> None:
    projects: dict[tuple[str | None, Any], int] = {}
    for i, (_, batch, token) in enumerate(messages):
        if i not in checked:
            checked[i] = _checked(batch, token, projects)
    accepted = [(found["batch"], found["project_id"]) for found in checked.values()
                if "rejected" not in found]
    if not accepted:
        return
    try:
        store_batches(accepted)
    except TRANSIENT_ERRORS:
        raise
    except Exception:
        # One batch the database refuses (or a fault in one) must not sink the others stored
        # with it: the whole transaction rolled back, so each is stored again on its own.
        log.exception("storing %d batches together failed; storing them one by one",
                      len(accepted))
        for batch, project_id in accepted:
            try:
                _stored_or_refused(batch, project_id)
            except TRANSIENT_ERRORS:
                raise
            except Exception as error:
                log.exception("batch %s could not be stored", batch["batch_id"])
                record_rejection(batch, f"the batch could not be stored: {error!r}", None)


def enqueue_batch(batch: dict[str, Any], token: str) -> None:
    """Hands a checked batch to the collectors. Raises when it could not be queued (or, embedded,
    stored), so that the sender gets no 202 and keeps the batch."""
    if ingest_batch.app.conf.task_always_eager:
        # Embedded mode: write in this request. A direct call raises the error itself instead of
        # Celery's eager retries, which would replay a locked SQLite write back to back.
        ingest_batch(batch, token=token)
    else:
        ingest_batch.apply_async(args=[batch], kwargs={"token": token}, **message_codec.options())


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
