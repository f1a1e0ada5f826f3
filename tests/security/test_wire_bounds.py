"""What the validator refuses because the database could not store it: each of these used to pass
validation and then fail the write (a 500 in the embedded mode, a lost task on a worker)."""

from __future__ import annotations

import pytest

from tests.batches import step_batch
from trainer_plugin.protocol import MAX_DEPTH, ProtocolError, validate_batch


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


CASES = {
    "step beyond int64": (lambda b: b["steps"]["step"].__setitem__(0, 2**63), "steps.step"),
    "tokens beyond int64": (lambda b: b["steps"]["tokens"].__setitem__(0, 2**64), "steps.tokens"),
    "integer metric beyond a double": (
        lambda b: b["steps"]["metrics"]["loss"].__setitem__(0, 10**400), "steps.metrics.loss"),
    "timestamp after year 9999": (lambda b: b["steps"]["ts"].__setitem__(0, 1e300), "steps.ts"),
    "rank beyond int32": (lambda b: b["source"].update(rank=2**31, world_size=2**31 + 1),
                          "source.rank"),
    "attempt beyond int32": (lambda b: b["run"].__setitem__("attempt", 2**40), "run.attempt"),
    "NUL in the host": (lambda b: b["source"].__setitem__("host", "node\x00"), "source.host"),
    "lone surrogate in the run name": (lambda b: b["run"].__setitem__("name", "run-\ud800"),
                                       "run.name"),
    "NUL in the config": (lambda b: b["run"]["config"].__setitem__("note", "a\x00b"), "run.config"),
    "config nested too deep": (
        lambda b: b["run"]["config"].__setitem__("deep", _nested(MAX_DEPTH + 5)), "run.config"),
    "NUL in an event payload": (
        lambda b: b["events"].append({"kind": "interruption", "ts": 1.7e9, "message": "\x00"}),
        "events[0]"),
    "event step beyond int64": (
        lambda b: b["events"].append({"kind": "checkpoint_save", "ts": 1.7e9, "step": 2**70}),
        "events[0]"),
    "trailing newline in the project": (lambda b: b["run"].__setitem__("project", "llm\n"),
                                        "run.project"),
    "trailing newline in a metric name": (
        lambda b: b["steps"]["metrics"].__setitem__("loss\n", b["steps"]["metrics"].pop("loss")),
        "steps.metrics"),
    "gpu index beyond smallint": (lambda b: b["gpus"]["gpu"].__setitem__(0, 40_000), "gpus.gpu"),
    "batch id nested 5000 deep": (lambda b: b.__setitem__("batch_id", _nested(5000)), "batch_id"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_values_the_database_cannot_hold_are_refused_naming_the_field(case):
    batch = step_batch(gpus=1)
    mutate, field = CASES[case]
    mutate(batch)

    with pytest.raises(ProtocolError) as refused:
        validate_batch(batch)

    assert refused.value.field == field
    assert refused.value.status == 400


def test_largest_storable_values_pass():
    batch = step_batch(gpus=1)
    batch["steps"]["step"][-1] = 2**63 - 1
    batch["gpus"]["gpu"][0] = 2**15 - 1
    batch["run"]["config"]["deep"] = _nested(MAX_DEPTH - 2)
    batch["run"]["name"] = "run-é-日本"

    assert validate_batch(batch) is batch
