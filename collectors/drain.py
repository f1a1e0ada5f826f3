"""A Celery task that a worker runs once for every few messages it has received, not once per
message: the ingest task stores the batches that arrived together in one transaction, so the fixed
cost of a transaction (a round trip per statement, the COPY set-up, the commit) is paid once for
up to ``drain_max`` batches instead of once each (bench/README.md, "End-to-end ingest").

How: ``start_strategy`` (Celery's hook for how a worker handles a task's messages) buffers the
messages in the worker's main process instead of sending each to the pool; the buffer goes to one
pool process when it holds ``drain_max`` messages or ``drain_wait_s`` after its first one. The
main process never decodes a body and builds no Celery Request (so no ``task_received`` signal
and no task-received event for these messages): it only moves bytes. Each
message keeps its own fate: it is acknowledged once its batch is stored or refused, put back in
the queue (``reject(requeue=True)``) when the pool process died or the database stayed down, and
a message nobody acknowledged (the whole worker died) is delivered again by the broker, as with
``acks_late``. ``drain_max`` of 1 or less gives Celery's own strategy: one task per message.

celery-batches does the same in general but pins Celery below 5.7, and acknowledges every message
of a batch whatever became of it, so a pool process killed mid-batch would lose its messages.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
from celery import Task, signals
from celery.worker.strategy import hybrid_to_proto2, proto1_to_proto2
from kombu.serialization import loads, prepare_accept_content

from trainer_plugin.transports import kombu_redis

log = logging.getLogger(__name__)

# One drained message as the pool process receives it: (message id, body, content type,
# content encoding, whether the body is decoded already).
Drained = tuple[str, Any, str, str, bool]


class DrainedTask(Task):
    """A task whose worker hands ``drain(messages, undecodable)`` the messages received together:
    (message id, args, kwargs) of each, and (message id, why) of those that could not be decoded.
    It returns the ids to put back in the queue; every other message is acknowledged. Called
    directly (``task(...)``) it runs ``run`` as any task."""

    abstract = True
    drain_max = 32
    drain_wait_s = 0.25

    def drain(self, messages: list[tuple[str, tuple, dict]],
              undecodable: list[tuple[str, str]]) -> list[str]:
        raise NotImplementedError

    def start_strategy(self, app, consumer, **kwargs):
        if self.drain_max <= 1:
            return super().start_strategy(app, consumer, **kwargs)
        return _DrainStrategy(self, app, consumer).on_message


class _Received:
    """One message waiting in the buffer: what the pool process needs of it and how to settle it.
    Not a Celery Request: Celery 5.7's Request decodes the whole body when it is built, which in
    this one process took a fifth of its time (py-spy, bench/README.md). Settled through the
    message itself, in the consumer's thread (``_settle``), so that a drain's acknowledgements
    can share one round trip to the broker."""

    __slots__ = ("id", "body", "decoded", "message", "_connection_errors", "settled")

    def __init__(self, message, message_id: str, body, decoded: bool, connection_errors):
        self.id, self.body, self.decoded = message_id, body, decoded
        self.message, self._connection_errors = message, connection_errors
        self.settled = False

    def acknowledge(self) -> None:
        if not self.settled:
            self.settled = True
            self.message.ack_log_error(log, self._connection_errors)

    def requeue(self) -> None:
        if not self.settled:
            self.settled = True
            self.message.reject_log_error(log, self._connection_errors, requeue=True)


class _DrainStrategy:
    """The worker main process's side: buffers messages, sends each full or timed-out buffer to
    the pool, and acknowledges or requeues each message when the pool answers."""

    def __init__(self, task: DrainedTask, app, consumer):
        self.task, self.app, self.consumer = task, app, consumer
        self.pool = consumer.pool
        self.buffer: list[_Received] = []
        self.in_pool = 0  # messages handed to the pool and not yet acknowledged or requeued
        self.lock = threading.Lock()  # the consumer's thread and the timer's (non-hub pools)
        self.timer_entry = None

    def _cannot_grow(self) -> bool:
        """Whether the buffer has all the messages the broker will let this worker hold (its
        prefetch count, less those in the pool): waiting for more would only add latency, and
        with a prefetch of 1 would cap the worker at one batch per drain wait."""
        limit = getattr(getattr(self.consumer, "qos", None), "value", 0) or 0
        return bool(limit) and len(self.buffer) + self.in_pool >= limit

    def on_message(self, message, body, ack, reject, callbacks, **_kwargs) -> None:
        if body is None and "task" in (message.headers or {}):
            # Protocol 2 (what the plugin and the API send): the body stays encoded here and is
            # decoded once, in the pool process. Celery's own strategy tests `"args" in
            # message.payload` first, which parses every ~40 KB body in this one process.
            body, headers, decoded = message.body, message.headers, False
        elif body is None and "args" not in message.payload:
            body, headers, decoded = message.body, message.headers, False
        elif "args" in message.payload:
            body, headers, decoded, _utc = hybrid_to_proto2(message, message.payload)
        else:
            body, headers, decoded, _utc = proto1_to_proto2(message, body)
        received = _Received(message, headers.get("id"), body, decoded,
                             self.consumer.connection_errors)
        with self.lock:
            self.buffer.append(received)
            full = len(self.buffer) >= self.task.drain_max or self._cannot_grow()
            if not full and self.timer_entry is None:
                self.timer_entry = self.consumer.timer.call_after(self.task.drain_wait_s,
                                                                   self.flush)
        if full:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            received, self.buffer = self.buffer, []
            if self.timer_entry is not None:
                self.timer_entry.cancel()
                self.timer_entry = None
            self.in_pool += len(received)
        if not received:
            return

        def settled() -> None:
            with self.lock:
                self.in_pool -= len(received)

        # The body goes to the pool process as it came (bytes pickle cheaply); it is decoded there,
        # as Celery's own strategy does, so this process only moves messages.
        messages = [(r.id, r.body, r.message.content_type, r.message.content_encoding, r.decoded)
                    for r in received]

        def on_return(requeue: list[str] | None) -> None:
            settled()
            self._settle(received, set(requeue or ()))

        def on_error(error) -> None:
            # The pool process died (a SIGKILL, the OOM killer) or the drain raised: nothing of
            # this buffer is known to be stored, so all of it goes back for another worker.
            cause = getattr(error, "exception", error)  # billiard's ExceptionInfo ...
            cause = getattr(cause, "exc", cause)  # ... around an ExceptionWithTraceback
            log.error("%d messages of %s go back to the queue: %r", len(received), self.task.name,
                      cause)
            settled()
            self._settle(received, {one.id for one in received})

        self.pool.apply_async(run_drained, (self.task.name, messages), callback=on_return,
                              error_callback=on_error)

    def _settle(self, received: list[_Received], requeue: set[str]) -> None:
        """Acknowledges the messages (requeues those in ``requeue``) where Celery acknowledges
        its own, in the consumer's thread (``call_soon_ack``), all in one call so that
        ``acks_together`` sends the acknowledgements in one round trip instead of one each."""

        def settle() -> None:
            with kombu_redis.acks_together(received[0].message.channel):
                for one in received:
                    if one.id in requeue:
                        one.requeue()
                    else:
                        one.acknowledge()

        # Celery 5.7 has call_soon_ack; older versions only call_soon, which defers the same way.
        getattr(self.consumer, "call_soon_ack", self.consumer.call_soon)(settle)


def run_drained(task_name: str, messages: list[Drained]) -> list[str]:
    """In the pool process: decodes the messages and runs the task's ``drain`` on them, between
    the prerun and postrun signals (the database connection handling hangs on those)."""
    from celery import current_app

    task = current_app.tasks[task_name]
    accept = prepare_accept_content(current_app.conf.accept_content)
    decoded, undecodable = [], []
    for message_id, body, content_type, content_encoding, is_decoded in messages:
        try:
            payload = body if is_decoded else _decoded(body, content_type, content_encoding,
                                                       accept)
            args, kwargs = payload[0], payload[1]
            decoded.append((message_id, tuple(args), dict(kwargs)))
        except Exception as error:  # a message no retry can read: refused, not requeued
            undecodable.append((message_id, f"the message could not be decoded: {error!r}"))
    signals.task_prerun.send(sender=task, task_id=messages[0][0], task=task, args=(), kwargs={})
    try:
        return task.drain(decoded, undecodable)
    finally:
        signals.task_postrun.send(sender=task, task_id=messages[0][0], task=task, args=(),
                                  kwargs={}, retval=None, state=None)


def _decoded(body: Any, content_type: str, content_encoding: str, accept: set[str]) -> Any:
    """The message body decoded. JSON (what the plugin and the API send) by orjson where it can:
    a batch is ~40 KB of numbers, and the standard library's parser took a tenth of a worker's CPU
    per batch, about four times orjson's. Anything orjson refuses (NaN, integers beyond 64 bits,
    ...) is decoded by kombu, as it would have been."""
    if content_type == "application/json" and content_type in accept:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return loads(body, content_type, content_encoding, accept=accept)
