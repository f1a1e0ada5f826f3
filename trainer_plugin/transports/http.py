"""POST /api/v1/ingest with a gzip-compressed JSON body. Standard library only, so that the
plugin installs on training nodes with nothing but Python."""

from __future__ import annotations

import email.utils
import gzip
import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from trainer_plugin.transports import PermanentSendError, TransientSendError

INGEST_PATH = "/api/v1/ingest"
DEFAULT_TIMEOUT_S = 10.0
# 408 and 429 say "not now", not "never"; 5xx is the collector's problem, not the batch's.
TRANSIENT_STATUSES = frozenset({408, 429})
ACCEPTED_STATUSES = frozenset({200, 202})


class _KeepPost(urllib.request.HTTPRedirectHandler):
    """Follows no redirect. urllib turns a redirected POST into a GET without the body, which the
    collector refuses, and a refused batch is dropped; a collector that redirects (http → https
    behind RUNWATCH_HTTPS, a moved host) is a configuration to fix, while the batch is kept."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_KeepPost)


def ingest_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith(INGEST_PATH) else url + INGEST_PATH


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _server_message(body: bytes) -> str:
    try:
        message = json.loads(body.decode("utf-8")).get("error")
    except (ValueError, UnicodeDecodeError, AttributeError):
        message = None
    if isinstance(message, str) and message:
        return message
    text = body.decode("utf-8", "replace").strip()
    return text[:500] or "(no message)"


class HttpTransport:
    def __init__(self, url: str, token: str | None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.url = ingest_url(url)
        self.token = token
        self.timeout_s = timeout_s

    def encode(self, batch: dict[str, Any]) -> bytes:
        # allow_nan=False: a NaN that slipped through must fail here, loudly, not at the collector.
        raw = json.dumps(batch, separators=(",", ":"), allow_nan=False).encode("utf-8")
        # Level 1: on metric columns (random-looking floats) it compresses within ~5% of level 6
        # at a quarter of the CPU, and that CPU is the training process's.
        return gzip.compress(raw, compresslevel=1)

    def send(self, batch: dict[str, Any], timeout_s: float | None = None) -> None:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url, data=self.encode(batch), headers=headers,
                                         method="POST")
        timeout = self.timeout_s if timeout_s is None else max(0.1, min(timeout_s, self.timeout_s))
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                status = response.status
                body = response.read()
        except urllib.error.HTTPError as error:
            status = error.code
            try:
                body = error.read()
            except (OSError, http.client.HTTPException):
                body = b""
            retry_after = parse_retry_after(error.headers.get("Retry-After") if error.headers
                                            else None)
            message = _server_message(body)
            if 300 <= status < 400:
                location = error.headers.get("Location") if error.headers else None
                raise TransientSendError(
                    f"{self.url} answered {status}, redirecting to {location}: set RUNWATCH_URL "
                    "to that address (https?); batches are kept until then", retry_after) from None
            if status >= 500 or status in TRANSIENT_STATUSES:
                raise TransientSendError(f"{self.url} answered {status}: {message}",
                                         retry_after) from None
            raise PermanentSendError(status, message) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            # Connection refused, DNS failure, timeout, connection reset mid-answer.
            reason = getattr(error, "reason", error)
            raise TransientSendError(f"cannot reach {self.url}: {reason}") from None
        if status not in ACCEPTED_STATUSES:
            raise PermanentSendError(status, f"unexpected answer from {self.url}: "
                                             f"{_server_message(body)}")

    def close(self) -> None:
        # urllib opens one connection per request; nothing is held between sends.
        pass

