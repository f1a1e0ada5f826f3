"""Column validation takes a whole-column shortcut (C-level builtins) before the value-by-value
check; both must reach the same verdict, and the same error message, on every kind of column."""

from __future__ import annotations

import enum
import random

import pytest

from trainer_plugin import protocol
from trainer_plugin.protocol import ProtocolError


class Rank(enum.IntEnum):
    TWO = 2


SPECIAL = [None, True, False, 0, -1, 1, 2**15 - 1, 2**15, 2**31, 2**63 - 1, 2**63, 10**400,
           0.0, -0.0, -1.5, 1.5, 1e308, -1e308, float("inf"), float("-inf"), float("nan"),
           protocol.MAX_TIMESTAMP, protocol.MAX_TIMESTAMP + 1, "1", [], Rank.TWO, 3.0]
KINDS = [("ts", protocol.MAX_INT64), ("int", protocol.MAX_INT64), ("int", protocol.MAX_GPU_INDEX),
         ("int?", protocol.MAX_INT64), ("number?", protocol.MAX_INT64)]


def verdict(values: list, kind: str, maximum: int) -> str:
    try:
        protocol._check_column(values, "gpus.x", kind, None, maximum=maximum)
    except ProtocolError as error:
        return str(error)
    return "ok"


def columns(rng: random.Random):
    for _ in range(400):
        size = rng.randint(1, 6)
        base = [rng.choice([1.0, 2, 1.7e9, 0, None, 5]) for _ in range(size)]
        if rng.random() < 0.7:
            base[rng.randrange(size)] = rng.choice(SPECIAL)
        yield base


@pytest.mark.parametrize(("kind", "maximum"), KINDS)
def test_the_shortcut_agrees_with_the_value_by_value_check(kind, maximum, monkeypatch):
    rng = random.Random(f"{kind}{maximum}")
    cases = [*columns(rng), [], [None] * 3, [0] * 3, [Rank.TWO], [True, 1]]
    fast = [verdict(values, kind, maximum) for values in cases]
    monkeypatch.setattr(protocol, "_column_is_valid", lambda *args: False)
    slow = [verdict(values, kind, maximum) for values in cases]

    assert fast == slow
    # Both verdicts occur, so the comparison means something.
    assert "ok" in fast and any(v != "ok" for v in fast)


def test_a_bad_value_deep_in_a_long_column_is_named_by_its_index():
    values = [1.7e9 + i for i in range(50_000)]
    values[31_337] = float("nan")

    with pytest.raises(ProtocolError, match=r"'gpus.x\[31337\]' must be a finite"):
        protocol._check_column(values, "gpus.x", "ts", None)
