"""How a batch leaves the training process. One module per transport, chosen by URL scheme.

Every transport has one method, ``send(batch, timeout_s=None)``, that returns when the batch is
accepted and otherwise raises one of the two errors below; the sender decides from the type alone
whether to try again. Transports are imported lazily so that an HTTP user never imports Celery.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import urlsplit


class SendError(Exception):
    """A batch was not accepted."""


class TransientSendError(SendError):
    """Worth another try later: the collector is down, overloaded or slow.

    ``retry_after`` is the server's Retry-After in seconds, when it sent one.
    """

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class PermanentSendError(SendError):
    """Never worth retrying: the collector refused this batch (a bad token, a bad batch) or the
    transport cannot work at all. ``message`` is the server's own explanation when it gave one."""

    def __init__(self, status: int | None, message: str):
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.status = status
        self.message = message


class Transport(Protocol):
    def send(self, batch: dict[str, Any], timeout_s: float | None = None) -> None: ...

    def close(self) -> None: ...


def transport_for(url: str, token: str | None) -> Transport:
    """Returns the transport for ``url``'s scheme; raises ValueError for a scheme it does not
    know, with the schemes it does."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        from trainer_plugin.transports.http import HttpTransport

        return HttpTransport(url, token)
    if scheme in ("redis", "rediss"):
        from trainer_plugin.transports.broker import BrokerTransport

        return BrokerTransport(url, token)
    raise ValueError(
        f"RUNWATCH_URL must start with http://, https://, redis:// or rediss:// (got {url!r})"
    )
