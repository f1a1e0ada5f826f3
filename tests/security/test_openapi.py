"""/api/v1/openapi.json: served without a login, a valid OpenAPI 3.1 document whose batch schema
accepts what the real plugin sends and holds the same limits as trainer_plugin.protocol."""

from __future__ import annotations

import gzip
import json

import jsonschema
import pytest
from jsonschema import Draft202012Validator

from collectors import openapi
from tests.batches import step_batch
from trainer_plugin import Monitor, protocol

URL = "/api/v1/openapi.json"


@pytest.fixture
def served(client):
    response = client.get(URL)
    assert response.status_code == 200
    return response.json()


def _validator(document: dict) -> Draft202012Validator:
    """The Batch schema, with the document's $refs resolvable."""
    schema = {**document["components"]["schemas"]["Batch"], "components": document["components"]}
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_description_is_served_without_a_login_as_openapi_3_1(served):
    assert served["openapi"] == "3.1.0"
    operation = served["paths"]["/api/v1/ingest"]["post"]
    assert operation["security"] == [{"ingestToken": []}]
    assert served["components"]["securitySchemes"]["ingestToken"] == {
        **served["components"]["securitySchemes"]["ingestToken"], "type": "http", "scheme": "bearer"}
    for status in ("202", "400", "401", "403", "413", "415", "429"):
        assert status in operation["responses"], status
    assert operation["responses"]["429"]["headers"]["Retry-After"]
    Draft202012Validator.check_schema(served["components"]["schemas"]["Batch"])


def test_batches_the_real_plugin_wrote_validate_against_the_schema(served, tmp_path, monkeypatch):
    # Offline mode: the plugin writes its batches, exactly as it would send them, to the spool.
    monkeypatch.setenv("RUNWATCH_MODE", "offline")
    monitor = Monitor(project="llm", run="schema-check", spool_dir=tmp_path, attempt=2,
                      config={"lr": 3e-4, "layers": [32, 32]}, gpu_sampling="simulated",
                      capture_signals=False)
    for step in range(50):
        monitor.step(step, loss=2.0 - step * 0.01, lr=3e-4, tokens=4096, grad_norm=None)
    with monitor.checkpoint_save(49, tmp_path / "ckpt.pt"):
        (tmp_path / "ckpt.pt").write_bytes(b"x" * 1000)
    monitor.close()

    batches = [json.loads(gzip.decompress(path.read_bytes()))
               for path in sorted(tmp_path.rglob("*")) if path.is_file() and path.name != "ckpt.pt"]
    validator = _validator(served)
    assert batches, "the plugin spooled nothing"
    kinds = {event["kind"] for batch in batches for event in batch["events"]}
    assert {"start", "finish", "checkpoint_save"} <= kinds
    assert sum(len(batch["steps"]["step"]) for batch in batches) == 50
    for batch in batches:
        errors = [error.message for error in validator.iter_errors(batch)]
        assert errors == [], errors


def test_schema_holds_the_validators_limits_and_names():
    schema = openapi.batch_schema()
    props = schema["properties"]
    steps, gpus = props["steps"]["properties"], props["gpus"]["properties"]
    assert props["v"] == {"const": protocol.VERSION}
    assert set(steps) == {*protocol.STEP_COLUMNS, "metrics"}
    assert set(gpus) == {*protocol.GPU_COLUMNS, "simulated"}
    assert props["events"]["maxItems"] == protocol.MAX_EVENTS
    assert props["events"]["items"]["properties"]["kind"]["enum"] == sorted(protocol.EVENT_KINDS)
    for column in (*steps.values(), *(v for k, v in gpus.items() if k != "simulated")):
        if column.get("type") == "array":
            assert column["maxItems"] == protocol.MAX_ROWS
    assert steps["metrics"]["maxProperties"] == protocol.MAX_METRICS
    assert steps["metrics"]["propertyNames"]["pattern"] == protocol.METRIC_NAME_PATTERN
    assert props["run"]["properties"]["project"]["pattern"] == protocol.SLUG_PATTERN
    assert props["run"]["properties"]["project"]["maxLength"] == protocol.MAX_PROJECT_CHARS
    assert props["source"]["properties"]["host"]["maxLength"] == protocol.MAX_HOST_CHARS
    assert gpus["gpu"]["items"]["maximum"] == protocol.MAX_GPU_INDEX
    assert steps["ts"]["items"]["maximum"] == protocol.MAX_TIMESTAMP
    assert steps["step"]["items"]["maximum"] == protocol.MAX_INT64
    described = openapi.description()["paths"]["/api/v1/ingest"]["post"]["responses"]["413"]
    assert str(protocol.MAX_BATCH_BYTES) in described["description"]


@pytest.mark.parametrize("mutate", [
    lambda b: b.__setitem__("v", 2),
    lambda b: b["steps"]["step"].__setitem__(0, -1),
    lambda b: b["steps"]["step"].__setitem__(0, 2**63),
    lambda b: b["steps"]["ts"].__setitem__(0, "yesterday"),
    lambda b: b["gpus"]["gpu"].__setitem__(0, 2**15),
    lambda b: b["events"].append({"kind": "explode", "ts": 1.0}),
    lambda b: b.__setitem__("extra", 1),
    lambda b: b["run"].__setitem__("project", "has space"),
    lambda b: b["steps"]["metrics"].__setitem__("9bad", [1.0] * 10),
    lambda b: b["source"].__setitem__("world_size", 0),
])
def test_what_the_schema_refuses_the_validator_refuses_too(mutate):
    batch = step_batch(gpus=1)
    mutate(batch)
    validator = _validator(openapi.description())

    with pytest.raises(jsonschema.ValidationError):
        validator.validate(batch)
    with pytest.raises(protocol.ProtocolError):
        protocol.validate_batch(batch)
