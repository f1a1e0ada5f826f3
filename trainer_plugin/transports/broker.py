"""Hands batches straight to the collectors' Celery queue through the broker (redis://).

For clusters where the training nodes reach Redis but not the web tier. The collectors' task
validates and authorizes again, so this path is no more trusted than HTTP. Celery is imported only
here, and only when the first batch goes out.

Batches are compressed with zlib and go to the ``ingest`` queue, which every collectors worker
reads. Where workers that decode zstd are running (they read the ``ingest.zstd`` queue too and
keep ZSTD_READERS_KEY set in Redis: collectors/zstd_ingest.py), batches are compressed with zstd,
which costs this process and the worker less CPU, and go to ``ingest.zstd``: a worker that cannot
decode zstd (an older version, mid-upgrade) never reads that queue, so it is never handed one.
"""

from __future__ import annotations

import math
import time
from typing import Any

from trainer_plugin.transports import PermanentSendError, TransientSendError, message_codec

TASK_NAME = "collectors.ingest_batch"
QUEUE = "ingest"
ZSTD_QUEUE = "ingest.zstd"
# Set, with an expiry, by the workers that read ZSTD_QUEUE; looked up at most once a minute.
ZSTD_READERS_KEY = "runwatch:ingest:zstd-readers"
ZSTD_CHECK_INTERVAL_S = 60.0
# Celery's own retries cover a blip of a second; longer outages are the sender's business, which
# keeps the batch and backs off instead of blocking inside send_task.
RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
INSTALL_HINT = ("the redis:// transport needs Celery, which is not installed: "
                "pip install 'runwatch[broker]'")


class BrokerTransport:
    def __init__(self, url: str, token: str | None):
        self.url = url
        self.token = token
        self._app: Any = None
        self._connection: Any = None
        self._producer: Any = None
        self._connection_errors: tuple[type[BaseException], ...] = (OSError,)
        self._zstd_readers = False
        self._zstd_checked_at = -math.inf

    def _celery(self) -> Any:
        if self._app is not None:
            return self._app
        try:
            from celery import Celery
            from kombu.exceptions import OperationalError

            from trainer_plugin.transports import kombu_redis
        except ImportError:
            raise PermanentSendError(None, INSTALL_HINT) from None
        # set_as_current=False: the training script may have a Celery app of its own.
        app = Celery("runwatch-plugin", broker=self.url, set_as_current=False)
        app.conf.update(
            task_serializer="json",
            accept_content=["json"],
            broker_connection_timeout=5,
            # A Redis that accepts the connection and then hangs must not hold the sender forever.
            broker_transport_options={"socket_timeout": 10, "socket_connect_timeout": 5},
        )
        # Our own connection to *this* URL: Celery's default connection prefers the environment's
        # CELERY_BROKER_URL over the app's broker, which on a node that also runs Celery for
        # something else would send our batches there. Connecting is lazy (first publish).
        self._connection = app.connection_for_write(
            self.url, transport=kombu_redis.transport_for(self.url))
        self._producer = app.amqp.Producer(self._connection)
        self._connection_errors = (OperationalError, OSError,
                                   *self._connection.connection_errors)
        self._app = app
        return app

    def _zstd(self) -> bool:
        """Whether workers that read zstd batches are running, as Redis said at the last look."""
        if message_codec.zstd_module() is None:
            return False
        now = time.monotonic()
        if now - self._zstd_checked_at >= ZSTD_CHECK_INTERVAL_S:
            self._zstd_checked_at = now
            try:
                with self._connection.default_channel.conn_or_acquire() as client:
                    self._zstd_readers = bool(client.exists(ZSTD_READERS_KEY))
            except Exception:  # Redis unreachable: send() says so; zlib meanwhile
                self._zstd_readers = False
        return self._zstd_readers

    def send(self, batch: dict[str, Any], timeout_s: float | None = None) -> None:
        app = self._celery()
        zstd = self._zstd()
        try:
            app.send_task(TASK_NAME, args=[batch], kwargs={"token": self.token},
                          queue=ZSTD_QUEUE if zstd else QUEUE,
                          producer=self._producer, retry=True, retry_policy=RETRY_POLICY,
                          **message_codec.options(zstd),
                          # Shown in worker logs and Flower: the batch id, never the token.
                          argsrepr=f"[<batch {batch.get('batch_id')}>]",
                          kwargsrepr="{'token': '***'}")
        except self._connection_errors as error:
            raise TransientSendError(f"cannot reach the broker at {_redacted(self.url)}: "
                                     f"{_redacted(str(error))}") from None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.release()
            self._connection = None
        if self._app is not None:
            self._app.close()
            self._app = None


def _redacted(url: str) -> str:
    """The URL without its password, for log lines."""
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not at:
        return url
    user = credentials.partition(":")[0]
    return f"{scheme}{sep}{user}:***@{location}" if user else f"{scheme}{sep}***@{location}"
