"""The v1 wire format: what passes, and that each kind of bad batch is refused naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainer_plugin.protocol import (
    MAX_ROWS,
    BatchTooLarge,
    ProtocolError,
    make_batch,
    validate_batch,
)


def good_batch() -> dict[str, Any]:
    return make_batch(
        run={"project": "llm", "name": "llama-8b", "attempt": 0, "config": {"lr": 3e-4}},
        source={"host": "node017", "rank": 1, "local_rank": 1, "world_size": 8},
        steps={"step": [0, 1], "ts": [1.7e9, 1.7e9 + 1], "duration_s": [None, 1.0],
               "tokens": [4096, None], "metrics": {"loss": [2.5, None], "lr": [3e-4, 3e-4]}},
        events=[{"kind": "start", "ts": 1.7e9, "pid": 12}],
    )


def test_good_batch_passes() -> None:
    batch = good_batch()
    validated = validate_batch(copy.deepcopy(batch))
    assert validated["steps"] == batch["steps"]
    assert validated["gpus"]["simulated"] is False  # absent flags are filled in


def _broken(path: str, value: Any) -> dict[str, Any]:
    batch = good_batch()
    *parents, last = path.split(".")
    target = batch
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[last] = value
    return batch


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("v", 2, "v"),
        ("batch_id", "not-a-uuid", "batch_id"),
        ("batch_id", 12345, "batch_id"),
        ("steps.ts", [1.7e9], "steps.ts"),
        ("steps.metrics.loss", [float("nan"), 1.0], "steps.metrics.loss"),
        ("steps.duration_s", [float("inf"), 1.0], "steps.duration_s"),
        ("steps.ts", [1.7e9, float("nan")], "steps.ts"),
        ("steps.step", [True, 1], "steps.step"),
        ("steps.tokens", [False, None], "steps.tokens"),
        ("source.rank", 8, "source.rank"),
        ("run.project", "has space", "run.project"),
        ("run.attempt", -1, "run.attempt"),
    ],
)
def test_bad_batch_is_refused_naming_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        validate_batch(_broken(path, value))
    assert caught.value.field == field
    assert field.split(".")[-1] in str(caught.value)


def test_unknown_event_kind_is_refused() -> None:
    batch = good_batch()
    batch["events"][0]["kind"] = "explosion"
    with pytest.raises(ProtocolError, match="kind") as caught:
        validate_batch(batch)
    assert caught.value.field == "events[0].kind"


def test_too_many_rows_is_batch_too_large() -> None:
    n = MAX_ROWS + 1
    batch = good_batch()
    batch["steps"] = {"step": list(range(n)), "ts": [1.7e9] * n, "duration_s": [None] * n,
                      "tokens": [None] * n, "metrics": {}}
    with pytest.raises(BatchTooLarge, match=str(MAX_ROWS)) as caught:
        validate_batch(batch)
    assert caught.value.status == 413
    assert caught.value.field == "steps.step"


def test_ecc_event_from_the_gpu_sampler_passes() -> None:
    batch = good_batch()
    batch["events"].append({"kind": "ecc", "ts": 1.7e9 + 2, "gpu": 3, "volatile_sbe": 12,
                            "volatile_dbe": 1, "delta_sbe": 2, "delta_dbe": 1})
    assert validate_batch(batch)["events"][1]["kind"] == "ecc"
