"""Workers that can decode zstd read the ``ingest.zstd`` queue beside ``ingest`` and keep a key
in Redis that says so; while it is there, the plugin's broker transport compresses its batches
with zstd and sends them to that queue (trainer_plugin/transports/broker.py).

Why a queue of its own: zstd costs the plugin 0.15 ms and the worker 0.06 ms less CPU per batch
than zlib and makes messages 14% smaller (bench/README.md), but a worker without zstd would have
to refuse such a batch as undecodable. Only workers that decode zstd read ``ingest.zstd``, so a
fleet halfway through an upgrade (or a worker without the package) is never handed one. When the
last of them stops, the key expires after ADVERTISE_TTL_S, plugins go back to zlib on ``ingest``
within their next look (a minute), and what is left in ``ingest.zstd`` waits there for the next
worker that reads it.
"""

from __future__ import annotations

import logging

from celery.signals import worker_ready
from django.conf import settings

from trainer_plugin.transports import broker, message_codec

log = logging.getLogger(__name__)

ADVERTISE_EVERY_S = 60
ADVERTISE_TTL_S = 300


@worker_ready.connect
def read_zstd_queue(sender=None, **_kwargs) -> None:
    """On a worker that reads ``ingest`` from Redis and decodes zstd: reads ``ingest.zstd`` too
    and keeps the key set while it runs (refreshed from the worker's own timer)."""
    consumer = sender
    task_consumer = getattr(consumer, "task_consumer", None)
    if (task_consumer is None or not settings.RUNWATCH_INGEST_ZSTD
            or message_codec.zstd_module() is None
            or not task_consumer.consuming_from(broker.QUEUE)
            or getattr(consumer.connection.transport, "driver_type", None) != "redis"):
        return
    consumer.add_task_queue(broker.ZSTD_QUEUE)

    def advertise() -> None:
        try:
            with consumer.connection.default_channel.conn_or_acquire() as client:
                client.set(broker.ZSTD_READERS_KEY, consumer.hostname, ex=ADVERTISE_TTL_S)
        except Exception:  # Redis down: the key expires and plugins fall back to zlib
            log.warning("could not tell plugins that this worker reads %s", broker.ZSTD_QUEUE,
                        exc_info=True)

    advertise()
    consumer.timer.call_repeatedly(ADVERTISE_EVERY_S, advertise)
