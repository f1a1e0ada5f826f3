"""schemathesis against the ingest API's served OpenAPI description, on a live server with a valid
ingest token: for generated requests, schema-valid (positive) and schema-violating (negative), no
5xx, every answer is a documented status with a documented body, and what the schema refuses the
API refuses.

Tasks run in the request (Celery eager), so a 202 has written the batch to PostgreSQL: a write
that fails shows up as a 5xx here. 60 positive and 60 negative requests per run. (Cases are drawn
with the operation's Hypothesis strategy rather than `schemathesis.pytest.from_fixture`, which
does not run under pytest 9.)"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from collectors.models import IngestedBatch, IngestToken, Project
from collectors.tasks import ingest_batch
from tests.reliability_report import record

EXAMPLES = 60
# What the validator checks beyond JSON Schema (the description says so): a schema-valid batch may
# still get a 400, but only for one of these.
# JSON Schema counts 1.0 as an integer; the wire format wants integers written as integers.
BEYOND_THE_SCHEMA = ("columns must have equal lengths", "must be below 'source.world_size'",
                     "NUL character", "not valid text", "must be an integer", "beyond 64 bits",
                     "nested deeper than")


@pytest.fixture
def eager():
    conf = ingest_batch.app.conf
    before = conf.task_always_eager
    conf.task_always_eager = True
    yield
    conf.task_always_eager = before


def _within_the_rules(batch: dict) -> None:
    """Repairs a schema-valid batch where it breaks a rule JSON Schema cannot state, so that it
    gets past validation and authorization and on to the write: the token's project, a fresh
    batch id (generated ones repeat), a rank inside the world, columns of equal length."""
    batch["run"]["project"] = "llm"
    batch["batch_id"] = str(uuid.uuid4())
    source = batch["source"]
    source["rank"] = min(source["rank"], source["world_size"] - 1)
    for table in ("steps", "gpus"):
        columns = batch.get(table) or {}
        lists = [v for v in columns.values() if isinstance(v, list)]
        lists += [v for v in (columns.get("metrics") or {}).values() if isinstance(v, list)]
        shortest = min((len(v) for v in lists), default=0)
        for column in lists:
            del column[shortest:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE,
                                  schemathesis.GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_ingest_api_conforms_to_its_description(live_server, transactional_db, eager, mode):
    token = IngestToken.issue(Project.objects.create(slug="llm"))[1]
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/v1/openapi.json")
    operation = schema["/api/v1/ingest"]["POST"]
    statuses: dict[int, int] = {}
    accepted: set[str] = set()  # distinct batch ids: generated ids repeat, and are stored once

    # No shrinking: over HTTP it takes minutes, and derandomize makes a failure reproducible.
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        body = case.body
        if mode == schemathesis.GenerationMode.POSITIVE and isinstance(body, dict):
            _within_the_rules(body)
        response = case.call_and_validate(base_url=live_server.url,
                                          headers={"Authorization": f"Bearer {token}"},
                                          excluded_checks=[positive_data_acceptance])
        if mode == schemathesis.GenerationMode.POSITIVE and response.status_code == 400:
            error = response.json()["error"]
            assert any(rule in error for rule in BEYOND_THE_SCHEMA), error
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code == 202:
            accepted.add(response.json()["batch_id"])

    run()
    print(f"schemathesis {mode.value}: {sum(statuses.values())} requests, statuses {statuses}")
    assert not any(status >= 500 for status in statuses)
    if mode == schemathesis.GenerationMode.NEGATIVE:
        assert set(statuses) <= {400, 401, 403, 413, 415}
    else:
        assert 202 in statuses  # schema-valid batches really reach the database
    record(f"schemathesis-{mode.value}",
           fault=f"schemathesis, {mode.value} cases from the served OpenAPI description",
           action=f"{sum(statuses.values())} generated requests on a live server; answers "
                  f"{dict(sorted(statuses.items()))}; 0 5xx, every answer as documented",
           sent=len(accepted), stored=IngestedBatch.objects.filter(batch_id__in=accepted).count(),
           unit="distinct accepted batches")
