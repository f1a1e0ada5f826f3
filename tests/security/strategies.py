"""Hypothesis strategies for bad input: near-valid batches (one field of a real batch changed) find
more than random JSON, because they get past the first checks and reach the deep ones."""

from __future__ import annotations

import copy
import gzip
import json
from typing import Any

from hypothesis import strategies as st

from tests.batches import step_batch


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value} if depth % 2 else [value]
    return value


# Values that break naive code: wrong types, bounds of the database's integer types, non-finite
# numbers (sent as NaN/Infinity tokens), text PostgreSQL cannot hold, deep nesting.
EVIL_VALUES = [
    None, True, False, 0, -1, 1.5, -0.0, 2**15, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1,
    10**400, 1e308, -1e308, 1e300, float("nan"), float("inf"), float("-inf"),
    "", "x", "x" * 300, "\x00", "nul\x00byte", "\ud800", "é日本", "llm\n", "../../etc/passwd",
    "<script>alert(1)</script>", "' OR 1=1 --", [], {}, [1, 2, 3], [None], [[1]], {"a": 1},
    _nested(40), _nested(2000), [float("nan")], ["1"], [2**70], [True],
]


def _fresh(value: Any) -> Any:
    # The validator fills in absent columns, so a shared {} would carry one example's changes
    # into the next.
    try:
        return copy.deepcopy(value)
    except RecursionError:
        return value


evil_values = st.sampled_from(EVIL_VALUES).map(_fresh)


def _paths(batch: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key and list position in the batch (the first three items of a list)."""
    found = []
    if isinstance(batch, dict):
        for key, value in batch.items():
            found.append((*prefix, key))
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(batch, list):
        for index, value in enumerate(batch[:3]):
            found.append((*prefix, index))
            found.extend(_paths(value, (*prefix, index)))
    return found


def _parent(batch: Any, path: tuple) -> Any:
    target = batch
    for key in path[:-1]:
        target = target[key]
    return target


@st.composite
def valid_batches(draw, project: str = "llm") -> dict:
    batch = step_batch(
        project=project, run=draw(st.sampled_from(["fuzz-a", "fuzz-b"])),
        rank=draw(st.integers(0, 3)), world_size=4, attempt=draw(st.integers(0, 2)),
        count=draw(st.integers(0, 12)), gpus=draw(st.integers(0, 3)),
        events=draw(st.lists(st.sampled_from([
            {"kind": "heartbeat", "ts": 1.7e9, "step": 3},
            {"kind": "checkpoint_save", "ts": 1.7e9, "step": 5, "bytes": 1024,
             "duration_s": 1.5, "path": "/ckpt/5"},
            {"kind": "interruption", "ts": 1.7e9, "source": "exception",
             "exc_type": "RuntimeError", "message": "CUDA error: an illegal memory access"},
            {"kind": "xid", "ts": 1.7e9, "xid": 79, "gpu": 0},
        ]), max_size=3)),
    )
    batch["batch_id"] = str(draw(st.uuids(version=4)))
    return copy.deepcopy(batch)


@st.composite
def mutated_batches(draw, project: str = "llm") -> Any:
    """A valid batch with one thing changed: a value replaced, a key removed, an unknown key added,
    a column made shorter than its table; or a different top-level JSON value altogether."""
    batch = draw(valid_batches(project))
    operation = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "shorten",
                                      "whole"]))
    paths = _paths(batch)
    if operation == "whole":
        return draw(st.sampled_from([[], [batch], "batch", 1, None, True, {}]))
    if operation == "shorten":
        columns = [p for p in paths if isinstance(_parent(batch, p)[p[-1]], list)
                   and _parent(batch, p)[p[-1]] and p[0] in ("steps", "gpus")]
        if columns:
            path = draw(st.sampled_from(columns))
            _parent(batch, path)[path[-1]].pop()
            return batch
    path = draw(st.sampled_from(paths))
    parent = _parent(batch, path)
    if operation == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif operation == "add":
        target = parent if isinstance(parent, dict) else batch
        target[draw(st.sampled_from(["zz", "", "\x00", "metrics", "v2"]))] = draw(evil_values)
    else:
        parent[path[-1]] = draw(evil_values)
    return batch


def encode(batch: Any) -> bytes:
    """JSON as a careless sender would write it: NaN and Infinity as bare tokens, lone
    surrogates escaped. Deep nesting beyond the encoder's recursion is written by hand."""
    try:
        return json.dumps(batch, allow_nan=True).encode()
    except RecursionError:
        return b"[" * 100_000 + b"]" * 100_000


# Whole bodies that are not JSON, not UTF-8, or not gzip, with the Content-Encoding they claim.
RAW_BODIES = [
    (b"", None), (b"{", None), (b"\xff\xfe\x00{}", None), (b'{"v": 1, "batch_id": "\xc3\x28"}', None),
    (b"null", None), (b"[" * 100_000, None), (b'{"v": NaN}', None), (b"\x1f\x8b\x08garbage", "gzip"),
    (gzip.compress(b"{not json"), "gzip"), (gzip.compress(b"{}")[:-6], "gzip"),
    (b"{}", "br"), (b"{}", "deflate, gzip"),
    # A gzip bomb: 40 KB on the wire, 40 MB inflated, over the 16 MB limit.
    (gzip.compress(b" " * 40_000_000, compresslevel=9), "gzip"),
]
