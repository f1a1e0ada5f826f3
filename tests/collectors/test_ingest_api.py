"""POST /api/v1/ingest: what a sender sees for good and bad requests, and what reaches the queue.

The view only validates and enqueues; the queue here is the real Redis broker, so "nothing
written" means no message in it and no row in PostgreSQL."""

from __future__ import annotations

import gzip
import json

import pytest

from collectors.models import StepMetric
from tests.batches import step_batch
from trainer_plugin.protocol import MAX_BATCH_BYTES

URL = "/api/v1/ingest"


def post(client, body, token=None, gzipped=False, **headers):
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    if gzipped:
        body = gzip.compress(body)
        headers["HTTP_CONTENT_ENCODING"] = "gzip"
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client.post(URL, data=body, content_type="application/json", **headers)


def test_good_batch_is_accepted_and_queued_for_the_collectors(client, token, ingest_queue):
    batch = step_batch(count=20)

    response = post(client, batch, token)

    assert response.status_code == 202
    assert response.json() == {"batch_id": batch["batch_id"], "rows": 20}
    [message] = ingest_queue.messages()
    assert message["task"] == "collectors.ingest_batch"
    assert message["args"][0]["batch_id"] == batch["batch_id"]
    assert message["kwargs"] == {"token": token}


def test_gzip_body_is_accepted(client, token, ingest_queue):
    response = post(client, step_batch(), token, gzipped=True)

    assert response.status_code == 202
    assert len(ingest_queue) == 1


BAD_BODIES = {
    "not json": (b"{not json", "not valid JSON"),
    "not an object": ([1, 2, 3], "'batch' must be an object"),
    "unknown version": ({**step_batch(), "v": 2}, "unsupported wire format version 2"),
    "unequal columns": (
        lambda b: b["steps"]["duration_s"].pop(), "columns must have equal lengths"),
    "nan in a metric": (
        b'{"v": 1, "loss": NaN}', "NaN is not a valid JSON number"),
    "infinite timestamp": (lambda b: b["steps"]["ts"].__setitem__(0, 1e400), "steps.ts[0]"),
    "missing run": (lambda b: b.pop("run"), "'run' must be an object"),
    "rank outside world": (lambda b: b["source"].__setitem__("rank", 9), "below 'source.world_size'"),
    "bool as a step": (lambda b: b["steps"]["step"].__setitem__(0, True), "steps.step[0]"),
    "unknown event kind": (
        lambda b: b["events"].append({"kind": "explode", "ts": 1.0}), "events[0].kind"),
}


@pytest.mark.parametrize("case", BAD_BODIES, ids=list(BAD_BODIES))
def test_bad_body_gets_a_400_saying_what_is_wrong_and_queues_nothing(client, token, ingest_queue,
                                                                     case):
    body, expected = BAD_BODIES[case]
    if callable(body):
        batch = step_batch()
        body(batch)
        body = json.dumps(batch).encode().replace(b"1e+400", b"1e400")
        if b"Infinity" in body:
            body = body.replace(b"Infinity", b"1e400")

    response = post(client, body, token)

    assert response.status_code == 400
    assert expected in response.json()["error"]
    assert len(ingest_queue) == 0
    assert StepMetric.objects.count() == 0


def test_missing_token_is_401(client, ingest_queue, project):
    response = post(client, step_batch())

    assert response.status_code == 401
    assert "Authorization: Bearer" in response.json()["error"]
    assert response["WWW-Authenticate"] == "Bearer"
    assert len(ingest_queue) == 0


def test_wrong_token_is_401(client, token, ingest_queue):
    response = post(client, step_batch(), "rw_" + "x" * 43)

    assert response.status_code == 401
    assert "not valid" in response.json()["error"]
    assert len(ingest_queue) == 0


def test_token_of_another_project_is_403(client, token, other_token, ingest_queue):
    response = post(client, step_batch(project="llm"), other_token)

    assert response.status_code == 403
    assert "cannot write into project 'llm'" in response.json()["error"]
    assert len(ingest_queue) == 0


def test_unknown_project_is_403(client, token, ingest_queue):
    response = post(client, step_batch(project="no-such-project"), token)

    assert response.status_code == 403
    assert len(ingest_queue) == 0


def test_oversized_body_is_413(client, token, ingest_queue):
    response = post(client, b" " * (MAX_BATCH_BYTES + 1), token)

    assert response.status_code == 413
    assert "limit" in response.json()["error"]
    assert len(ingest_queue) == 0


def test_gzip_bomb_is_413_without_inflating_it(client, token, ingest_queue):
    bomb = gzip.compress(b" " * (MAX_BATCH_BYTES * 4))
    assert len(bomb) < 100_000

    response = client.post(URL, data=bomb, content_type="application/json",
                           HTTP_CONTENT_ENCODING="gzip", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert response.status_code == 413
    assert len(ingest_queue) == 0


def test_too_many_rows_is_413(client, token, ingest_queue):
    response = post(client, step_batch(count=100_001, extra_metric=False), token, gzipped=True)

    assert response.status_code == 413
    assert "at most 100000" in response.json()["error"]


def test_broken_gzip_is_400(client, token, ingest_queue):
    response = client.post(URL, data=b"\x1f\x8b garbage", content_type="application/json",
                           HTTP_CONTENT_ENCODING="gzip", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert response.status_code == 400
    assert "gzip" in response.json()["error"]


def test_get_is_405(client):
    response = client.get(URL)

    assert response.status_code == 405
    assert response["Allow"] == "POST"


def test_api_needs_no_csrf_token_but_a_bearer_token(token, ingest_queue):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    assert post(strict, step_batch(), token).status_code == 202


@pytest.fixture
def embedded_mode(monkeypatch):
    from collectors.tasks import ingest_batch

    monkeypatch.setitem(ingest_batch.app.conf, "task_always_eager", True)


def test_embedded_mode_stores_the_batch_before_answering(client, token, ingest_queue, embedded_mode):
    response = post(client, step_batch(count=12), token, gzipped=True)

    assert response.status_code == 202
    assert StepMetric.objects.count() == 12
    assert len(ingest_queue) == 0


def test_embedded_mode_answers_503_when_the_write_fails_so_the_sender_keeps_the_batch(
        client, token, embedded_mode, monkeypatch):
    from django.db import OperationalError

    from collectors import ingest

    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(ingest.bulk_write, "write_many", locked)

    response = post(client, step_batch(count=3), token)

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert StepMetric.objects.count() == 0
