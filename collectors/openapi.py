"""The ingest API's OpenAPI 3.1 description, served at /api/v1/openapi.json.

Built from trainer_plugin.protocol's own constants (version, limits, column names, event kinds,
name patterns) so that it cannot drift from the validator the API runs. JSON Schema cannot say
everything the validator checks (columns of one table have equal lengths, rank < world_size,
strings without NUL characters), so the description is never stricter than the validator: what it
refuses, the API refuses too; a few batches it allows still get a 400 that names the field.
"""

from __future__ import annotations

from typing import Any

from trainer_plugin import protocol

INGEST_PATH = "/api/v1/ingest"

_NULL = {"type": "null"}


def _int(minimum: int = 0, maximum: int = protocol.MAX_INT64) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _number() -> dict[str, Any]:
    # JSON itself has no NaN or infinity; the bound keeps an integer convertible to a double.
    return {"type": "number", "minimum": -protocol.MAX_NUMBER, "maximum": protocol.MAX_NUMBER}


def _timestamp() -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "maximum": protocol.MAX_TIMESTAMP,
            "description": "Unix seconds, UTC."}


def _column(items: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": items, "maxItems": protocol.MAX_ROWS}
    if description:
        schema["description"] = description
    return schema


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, _NULL]}


def _string(max_length: int, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": max_length}
    if pattern:
        schema["pattern"] = pattern
    return schema


def batch_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of one v1 batch."""
    step_columns: dict[str, Any] = {
        "step": _column(_int(), "Step numbers."),
        "ts": _column(_timestamp(), "When each step ended."),
        "duration_s": _column(_nullable(_number()), "Seconds each step took, or null."),
        "tokens": _column(_nullable(_int()), "Tokens each step processed, or null."),
        "metrics": {
            "type": "object",
            "maxProperties": protocol.MAX_METRICS,
            "propertyNames": {"pattern": protocol.METRIC_NAME_PATTERN},
            "additionalProperties": _column(_nullable(_number())),
            "description": "One column per scalar (loss, lr, ...); null for a non-finite value.",
        },
    }
    assert set(step_columns) == {*protocol.STEP_COLUMNS, "metrics"}
    gpu_columns: dict[str, Any] = {
        "ts": _column(_timestamp()),
        "gpu": _column(_int(maximum=protocol.MAX_GPU_INDEX), "GPU index on the host."),
        **{name: _column(_nullable(_number()))
           for name in ("temp_c", "power_w", "util_pct", "mem_used_mb", "sm_clock_mhz")},
        "throttle": _column(_nullable(_int()), "NVML clock-throttle reason bits."),
    }
    assert set(gpu_columns) == set(protocol.GPU_COLUMNS)
    event = {
        "type": "object",
        "required": ["kind", "ts"],
        "properties": {
            "kind": {"enum": sorted(protocol.EVENT_KINDS)},
            "ts": _timestamp(),
        },
        "additionalProperties": True,
        "description": "Other keys are kept as the event's payload (exception, signal, step, ...).",
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Runwatch batch v{protocol.VERSION}",
        "type": "object",
        "required": ["v", "batch_id", "run", "source"],
        "additionalProperties": False,
        "properties": {
            "v": {"const": protocol.VERSION},
            "batch_id": {"type": "string", "format": "uuid",
                         "description": "Idempotency key: a batch id is stored once."},
            "run": {
                "type": "object",
                "required": ["project", "name", "attempt"],
                "properties": {
                    "project": _string(protocol.MAX_PROJECT_CHARS, protocol.SLUG_PATTERN),
                    "name": _string(protocol.MAX_RUN_NAME_CHARS),
                    "attempt": _int(maximum=protocol.MAX_INT32),
                    "config": {"type": "object", "description":
                               f"At most {protocol.MAX_CONFIG_BYTES} bytes, nested at most "
                               f"{protocol.MAX_DEPTH} deep."},
                },
            },
            "source": {
                "type": "object",
                "required": ["host", "rank", "local_rank", "world_size"],
                "properties": {
                    "host": _string(protocol.MAX_HOST_CHARS),
                    "rank": _int(maximum=protocol.MAX_INT32),
                    "local_rank": _int(maximum=protocol.MAX_INT32),
                    "world_size": _int(minimum=1, maximum=protocol.MAX_INT32),
                },
            },
            "steps": {"type": "object", "additionalProperties": False,
                      "properties": step_columns,
                      "description": "Columns of equal length, one row per step."},
            "gpus": {"type": "object", "additionalProperties": False,
                     "properties": {**gpu_columns, "simulated": {"type": "boolean"}},
                     "description": "Columns of equal length, one row per GPU sample."},
            "events": {"type": "array", "items": event, "maxItems": protocol.MAX_EVENTS},
        },
    }


def _error_response(description: str, **headers: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if headers:
        response["headers"] = headers
    return response


def description() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document."""
    retry_after = {"description": "Seconds to wait before sending the batch again.",
                   "schema": {"type": "integer", "minimum": 0}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Runwatch ingest API",
            "version": f"v{protocol.VERSION}",
            "description": (
                "Training processes send telemetry as batches in the v1 wire format "
                "(trainer_plugin.protocol). A batch is validated and queued, then written once per "
                "batch_id. Every refusal says what to fix in `error`, and names the field in "
                "`field` where there is one."
            ),
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": {
            INGEST_PATH: {
                "post": {
                    "operationId": "ingestBatch",
                    "summary": "Send one batch of steps, GPU samples and events",
                    "security": [{"ingestToken": []}],
                    "requestBody": {
                        "required": True,
                        "description": (
                            f"One batch, at most {protocol.MAX_BATCH_BYTES} bytes; it may be sent "
                            "with `Content-Encoding: gzip` (the limit holds after decompression "
                            "too). Beyond this schema: columns of one table have equal lengths, "
                            "source.rank < source.world_size, text holds no NUL character, "
                            "integers are written without a fraction (1, not 1.0), and run.config "
                            f"and event payloads nest at most {protocol.MAX_DEPTH} deep with "
                            "integers within 64 bits."),
                        "content": {"application/json": {
                            "schema": {"$ref": "#/components/schemas/Batch"}}},
                    },
                    "responses": {
                        "202": {
                            "description": "Queued; it will be stored once.",
                            "content": {"application/json": {
                                "schema": {"$ref": "#/components/schemas/Accepted"}}},
                        },
                        "400": _error_response("Not a valid v1 batch, or not valid JSON or gzip."),
                        "401": _error_response(
                            "No ingest token, or one that is unknown or revoked.",
                            **{"WWW-Authenticate": {"schema": {"type": "string"}}}),
                        "403": _error_response("The token belongs to another project."),
                        "405": _error_response("Only POST is allowed."),
                        "413": _error_response(
                            f"Over {protocol.MAX_BATCH_BYTES} bytes, {protocol.MAX_ROWS} rows or "
                            f"{protocol.MAX_EVENTS} events: send it again in smaller batches."),
                        "415": _error_response("A Content-Encoding other than gzip."),
                        "429": _error_response("Too many batches from this token: keep the batch "
                                               "and send it again after Retry-After seconds.",
                                               **{"Retry-After": retry_after}),
                        "503": _error_response("The collector cannot queue batches now; retry.",
                                               **{"Retry-After": retry_after}),
                    },
                },
            },
        },
        "components": {
            "securitySchemes": {
                "ingestToken": {
                    "type": "http", "scheme": "bearer",
                    "description": "An ingest token of the batch's project "
                                   "(`python manage.py createtoken PROJECT`). It can only write.",
                },
            },
            "schemas": {
                "Batch": batch_schema(),
                "Accepted": {
                    "type": "object", "required": ["batch_id", "rows"],
                    "properties": {"batch_id": {"type": "string", "format": "uuid"},
                                   "rows": {"type": "integer", "minimum": 0}},
                },
                "Error": {
                    "type": "object", "required": ["error"],
                    "properties": {
                        "error": {"type": "string", "minLength": 1,
                                  "description": "What was wrong and what to do, in one sentence."},
                        "field": {"type": "string",
                                  "description": "The batch field at fault, e.g. steps.ts."},
                    },
                },
            },
        },
    }
