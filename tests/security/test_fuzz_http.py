"""Property-based fuzzing of POST /api/v1/ingest with near-valid batches and broken bodies.

Tasks run in the request here (Celery eager, as in the embedded mode), so one request goes all the
way to PostgreSQL: for any input the answer is a 202 (and the batch is stored) or a 4xx with a
message (and no table changed). Never a 5xx. 150 mutated batches per run, plus every raw body."""

from __future__ import annotations

import copy
import gzip
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.models import IngestedBatch, RejectedBatch
from collectors.tasks import ingest_batch
from tests.reliability_report import record
from tests.security.strategies import RAW_BODIES, encode, mutated_batches
from tests.security.tables import changed, table_counts
from trainer_plugin.protocol import row_count, validate_batch

URL = "/api/v1/ingest"
EXAMPLES = 150
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture
def eager():
    conf = ingest_batch.app.conf
    before = conf.task_always_eager
    conf.task_always_eager = True
    yield
    conf.task_always_eager = before


def _post(client, body: bytes, token: str, encoding: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if encoding:
        headers["HTTP_CONTENT_ENCODING"] = encoding
    return client.post(URL, data=body, content_type="application/json", **headers)


def _check(response, before: dict[str, int], batch_id: str | None, batch) -> str:
    """Asserts the answer and what it wrote; returns 'stored' or 'refused'."""
    assert response.status_code < 500, response.content[:500]
    after = table_counts()
    if response.status_code == 202:
        assert IngestedBatch.objects.filter(batch_id=batch_id).exists()
        return "stored"
    assert 400 <= response.status_code < 500
    message = response.json()["error"]
    assert isinstance(message, str) and len(message) > 10
    assert changed(before, after) == {}, f"refused with {response.status_code} but wrote rows"
    return "refused"


class Tally:
    def __init__(self):
        self.outcomes: dict[str, int] = {"stored": 0, "refused": 0}


@pytest.mark.django_db
def test_mutated_batches_get_a_202_or_a_clear_4xx_and_refusals_write_nothing(
        client, token, eager):
    tally = Tally()

    @FUZZ
    @given(batch=mutated_batches(), gzipped=st.booleans())
    def run(batch, gzipped):
        batch_id = batch.get("batch_id") if isinstance(batch, dict) else None
        was_stored = IngestedBatch.objects.filter(
            batch_id=batch_id).exists() if _is_uuid(batch_id) else False
        body = encode(batch)
        before = table_counts()
        response = _post(client, gzip.compress(body) if gzipped else body, token,
                         "gzip" if gzipped else None)
        outcome = _check(response, before, batch_id, batch)
        if outcome == "stored" and not was_stored:
            # A 202 stored the whole batch: every row the sender counted.
            assert response.json()["rows"] == row_count(validate_batch(copy.deepcopy(batch)))
        tally.outcomes[outcome] += 1

    run()
    print(f"fuzz http: {EXAMPLES} mutated batches: {tally.outcomes}")
    assert tally.outcomes["refused"] > EXAMPLES // 3  # the strategy really produces bad input
    assert RejectedBatch.objects.count() == 0  # the API answers refusals; only tasks dead-letter
    record("fuzz-http", fault="fuzzed batches through the HTTP API (hypothesis)",
           action=f"{EXAMPLES} near-valid batches (one field changed) and {len(RAW_BODIES)} "
                  f"broken bodies; {tally.outcomes['refused']} refused with a 4xx, 0 with a 5xx, "
                  "0 partial writes",
           sent=tally.outcomes["stored"], stored=tally.outcomes["stored"], unit="valid batches")


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return isinstance(value, str)


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "encoding"), RAW_BODIES,
                         ids=[f"body{i}-{e or 'identity'}" for i, (_, e) in enumerate(RAW_BODIES)])
def test_broken_bodies_get_a_clear_4xx_and_write_nothing(client, token, eager, body, encoding):
    before = table_counts()

    response = _post(client, body, token, encoding)

    assert 400 <= response.status_code < 500, response.content[:300]
    assert _check(response, before, None, None) == "refused"


@pytest.mark.django_db
def test_gzip_bomb_is_refused_as_too_large(client, token, eager):
    body, encoding = RAW_BODIES[-1]
    assert len(body) < 100_000

    response = _post(client, body, token, encoding)

    assert response.status_code == 413
    assert "over the" in response.json()["error"]
