"""kombu's Redis transport with two changes for a worker that receives many messages a second:

- a channel keeps one ``redis.Redis`` client for its commands instead of building a new one for
  every command;
- ``acks_together(channel)`` sends the acknowledgements made inside it in one round trip.

Why: kombu 5.7 builds a client (``Channel.conn_or_acquire`` → ``_create_client``) for each
publish, each copy of a received message into the unacked hash and each acknowledgement. A
``redis.Redis.__init__`` costs ~0.1 ms of Python (its callback tables are rebuilt every time),
which was a sixth of the plugin's send and ~5% of a worker's main process (py-spy,
bench/README.md). A client is only a handle on the channel's connection pool and is safe to share
between threads, so reusing it changes nothing else: connections still come from, and go back to,
the same pool.

Acknowledging is two commands per message (ZREM and HDEL of the unacked copy), each pair its own
round trip; a worker that stores 32 messages in one transaction (collectors/drain.py) acknowledges
them together, so it now pays one round trip for all 64 commands. A failed round trip is logged
and leaves the messages' unacked copies in Redis, where kombu restores them after the visibility
timeout, exactly as when a single acknowledgement fails; the batch ids make the second delivery a
no-op.

Used for ``redis://`` broker URLs by the plugin's broker transport and by the collectors' Celery
app (``CELERY_BROKER_TRANSPORT``). Anything else keeps kombu's own transport, ``rediss://``
included: kombu turns TLS on from the scheme's name only when it picks the transport itself.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

log = logging.getLogger(__name__)

# What Celery's broker_transport / kombu's Connection(transport=...) take: "module:Class".
TRANSPORT = f"{__name__}:Transport"
SCHEMES = ("redis://",)


def transport_for(url: str) -> str | None:
    """This transport for a Redis broker URL, None (kombu's choice by scheme) for any other."""
    return TRANSPORT if url.startswith(SCHEMES) else None


@contextmanager
def acks_together(channel):
    """Within this block, this thread's acknowledgements on ``channel`` (a channel of this
    transport; any other acknowledges one by one as usual) go to Redis in one round trip, at the
    end of the block."""
    qos = getattr(channel, "qos", None)
    if not isinstance(qos, QoS):
        yield
        return
    with qos.pipe_or_acquire() as pipe:
        qos._together.pipe = pipe
        try:
            yield
        finally:
            qos._together.pipe = None
            try:
                pipe.execute()
            except Exception:
                log.exception("acknowledgements not sent to Redis; the messages will be "
                              "delivered again after the visibility timeout")


class QoS(kombu_redis.QoS):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Per thread: with a thread pool, tasks acknowledge from their own threads.
        self._together = threading.local()

    def ack(self, delivery_tag):
        pipe = getattr(self._together, "pipe", None)
        if pipe is None:
            return super().ack(delivery_tag)
        self._remove_from_indices(delivery_tag, pipe)
        virtual.QoS.ack(self, delivery_tag)


class Channel(kombu_redis.Channel):
    QoS = QoS
    _command_client = None

    def _create_client(self, asynchronous=False):
        if asynchronous:  # the BRPOP/LISTEN client, which kombu already keeps per channel
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._command_client
        # kombu drops its pool after a connection error (_disconnect_pools): follow it.
        if client is None or client.connection_pool is not pool:
            client = self._command_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
