"""Interruptions grouped by root cause, like Table 5 of the Llama 3 paper: per category its
component, how many interruptions, their share of the unexpected ones, and the time they cost.

Pure: interruption facts (with an engineer's label already applied: the label wins) and the run's
goodput in, table rows out. Several reports of one failure (one per rank) count once: only the
first interruption of each attempt is counted, as in collectors.analysis.goodput.

**Time lost** by an interruption = what the goodput analysis booked to it: the lost progress and
the stall of the attempt it ended, the restart downtime after it, and the next attempt's startup.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from collectors.analysis.goodput import InterruptionFact, RunGoodput, primary_interruptions
from collectors.models import Category

# The part of the system each category points at, in the paper's words.
COMPONENTS: dict[str, str] = {
    Category.GPU_HARDWARE: "GPU",
    Category.GPU_MEMORY: "GPU",
    Category.GPU_OOM: "Software",
    Category.NETWORK: "Network",
    Category.NCCL_TIMEOUT: "Network",
    Category.HOST: "Host",
    Category.HOST_MAINTENANCE: "Host",
    Category.STORAGE: "Storage",
    Category.DATALOADER: "Software",
    Category.SOFTWARE_BUG: "Software",
    Category.NUMERICAL: "Software",
    Category.PLANNED: "Planned",
    Category.UNKNOWN: "Unknown",
}
LABELS = dict(Category.choices)


def component_of(category: str) -> str:
    return COMPONENTS.get(category, "Unknown")


@dataclass(frozen=True)
class RootCauseRow:
    category: str
    label: str
    component: str
    count: int
    unexpected: int
    pct_of_unexpected: float  # 0..100; 0 when there are no unexpected interruptions
    time_lost_s: float


@dataclass(frozen=True)
class RootCauseTable:
    rows: list[RootCauseRow]
    total: int
    unexpected: int
    time_lost_s: float


def interruption_costs(goodput: RunGoodput) -> dict[int, float]:
    """Seconds each interruption cost, by the number of the attempt it ended."""
    costs: dict[int, float] = {}
    attempts = goodput.attempts
    for i, attempt in enumerate(attempts):
        if attempt.interruption is None:
            continue
        cost = (attempt.badput.lost_progress + attempt.badput.stall
                + attempt.badput.restart_downtime)
        if i + 1 < len(attempts):
            cost += attempts[i + 1].badput.startup
        costs[attempt.number] = cost
    return costs


def root_cause_table(interruptions: Iterable[InterruptionFact],
                     costs: dict[int, float] | None = None) -> RootCauseTable:
    """Rows by count (then time lost), most frequent first."""
    costs = costs or {}
    counted = list(primary_interruptions(interruptions).values())
    unexpected_total = sum(1 for f in counted if not f.expected)
    groups: dict[str, list[InterruptionFact]] = {}
    for fact in counted:
        groups.setdefault(fact.category, []).append(fact)
    rows = []
    for category, facts in groups.items():
        unexpected = sum(1 for f in facts if not f.expected)
        rows.append(RootCauseRow(
            category=category, label=LABELS.get(category, category),
            component=component_of(category), count=len(facts), unexpected=unexpected,
            pct_of_unexpected=100.0 * unexpected / unexpected_total if unexpected_total else 0.0,
            time_lost_s=sum(costs.get(f.attempt, 0.0) for f in facts),
        ))
    rows.sort(key=lambda r: (-r.count, -r.time_lost_s, r.category))
    return RootCauseTable(rows=rows, total=len(counted), unexpected=unexpected_total,
                          time_lost_s=sum(r.time_lost_s for r in rows))
