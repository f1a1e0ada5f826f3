"""The ingest API: authenticate, check, enqueue, answer. The write happens in the Celery task.

POST /api/v1/ingest with `Authorization: Bearer <token>`, a JSON body in the v1 wire format
(trainer_plugin.protocol), optionally `Content-Encoding: gzip`. Answers 202 when the batch is
queued, or a 4xx with {"error": "...", "field": "..."} saying what to fix.
"""

from __future__ import annotations

import json
import logging
import zlib

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from kombu.exceptions import OperationalError as BrokerError

from collectors import openapi, ratelimit
from collectors.ingest import Refused, authorize
from collectors.models import IngestToken
from collectors.tasks import enqueue_batch
from trainer_plugin.protocol import MAX_BATCH_BYTES, ProtocolError, row_count, validate_batch

log = logging.getLogger(__name__)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


def _error(message: str, status: int, field: str | None = None, **headers) -> JsonResponse:
    body = {"error": message}
    if field:
        body["field"] = field
    response = JsonResponse(body, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _read_body(request: HttpRequest) -> bytes:
    declared = request.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > MAX_BATCH_BYTES:
        raise BadRequest(f"body of {int(declared)} bytes is over the {MAX_BATCH_BYTES}-byte limit; "
                         "send smaller batches", 413)
    # request.read() bypasses DATA_UPLOAD_MAX_MEMORY_SIZE, so the limit above is the only one.
    body = request.read(MAX_BATCH_BYTES + 1)
    if len(body) > MAX_BATCH_BYTES:
        raise BadRequest(f"body is over the {MAX_BATCH_BYTES}-byte limit; send smaller batches", 413)
    encoding = request.headers.get("Content-Encoding", "identity").lower()
    if encoding == "gzip":
        # Bounded decompression: a small gzip bomb must not become gigabytes in memory.
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, MAX_BATCH_BYTES + 1)
        except zlib.error as error:
            raise BadRequest(f"body is not valid gzip: {error}") from None
        if len(body) > MAX_BATCH_BYTES or inflater.unconsumed_tail:
            raise BadRequest(f"decompressed body is over the {MAX_BATCH_BYTES}-byte limit; "
                             "send smaller batches", 413)
        if not inflater.eof:
            raise BadRequest("body is truncated gzip")
    elif encoding not in ("identity", ""):
        raise BadRequest(f"Content-Encoding '{encoding}' is not supported; use gzip or none", 415)
    return body


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a valid JSON number; send finite numbers or null")


def _decode(body: bytes):
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"body is not valid JSON: {error}") from None
    except RecursionError:
        raise BadRequest("body is not valid JSON: nested too deeply") from None


@csrf_exempt
def ingest(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return _error("use POST with a JSON batch", 405, Allow="POST")
    token = _bearer_token(request)
    if token is None:
        return _error("missing ingest token: send 'Authorization: Bearer <token>' "
                      "(create one with `python manage.py createtoken PROJECT`)", 401,
                      WWW_Authenticate="Bearer")
    # Before the body is read: an unknown token costs one indexed lookup and a throttled one a
    # counter increment, never the parse of up to 16 MiB.
    try:
        known = IngestToken.objects.authenticate(token) is not None
    except DatabaseError:
        log.exception("ingest token could not be checked")
        return _error("the collector is unavailable; retry later", 503, Retry_After="5")
    if not known:
        return _error("the ingest token is not valid or has been revoked", 401, "token",
                      WWW_Authenticate="Bearer")
    wait_s = ratelimit.retry_after(token)
    if wait_s is not None:
        return _error(f"too many batches from this token; keep the batch and send it again in "
                      f"{wait_s} s (limit RUNWATCH_INGEST_RATE_LIMIT)", 429, Retry_After=str(wait_s))
    try:
        batch = validate_batch(_decode(_read_body(request)))
        # Again, with the project: the one place that decides who may write where.
        authorize(token, batch["run"]["project"])
    except BadRequest as error:
        return _error(str(error), error.status, error.field)
    except ProtocolError as error:
        return _error(str(error), error.status, error.field)
    except Refused as error:
        return _error(str(error), error.status, "token")

    try:
        enqueue_batch(batch, token)
    except (BrokerError, DatabaseError):
        log.exception("batch %s could not be queued", batch["batch_id"])
        # The plugin keeps (and spools) what gets no 202, so an outage loses nothing.
        return _error("the collector is unavailable; retry later", 503, Retry_After="5")
    return JsonResponse({"batch_id": batch["batch_id"], "rows": row_count(batch)}, status=202)




@require_GET
@cache_control(max_age=300)
def openapi_description(request: HttpRequest) -> JsonResponse:
    """The ingest API's OpenAPI 3.1 description; public, like any API's documentation."""
    return JsonResponse(openapi.description())
