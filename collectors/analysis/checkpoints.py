"""Checkpoint history of a run: every save with its interval and blocking time, every restore
with the steps and wall time it cost. Pure: merged checkpoint facts and the run's goodput in.

- **interval**: wall-clock time and steps since the previous save of the same attempt (the first
  save of an attempt has none: the time before it is a restart, not a checkpoint interval);
- **blocking**: the save's duration as reported, the slowest rank's (training waits for it);
- **size**: the bytes reported, summed over the ranks' shard paths (ranks naming one shared
  path count once: see collectors.reliability);
- per **restore** (a load at an attempt's start): the step restored, the steps lost (the previous
  attempt's last step − the restored step) and the wall time lost, which is the previous attempt's
  lost progress as collectors.analysis.goodput defines it (steps redone, and the partial step
  before a crash).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from collectors.analysis.goodput import CheckpointFact, RunGoodput


@dataclass(frozen=True)
class SaveRow:
    attempt: int
    step: int | None
    ts: float
    duration_s: float | None
    bytes: int | None
    interval_s: float | None
    interval_steps: int | None


@dataclass(frozen=True)
class RestoreRow:
    attempt: int
    step: int | None
    ts: float
    duration_s: float | None
    bytes: int | None
    steps_lost: int | None
    lost_s: float | None
    downtime_s: float | None  # the restart downtime before this attempt


@dataclass(frozen=True)
class CheckpointSummary:
    saves: int
    restores: int
    median_interval_s: float | None
    median_blocking_s: float | None
    max_blocking_s: float | None
    total_blocking_s: float
    median_bytes: float | None
    total_steps_lost: int
    total_lost_s: float


@dataclass(frozen=True)
class CheckpointHistory:
    saves: list[SaveRow]
    restores: list[RestoreRow]
    summary: CheckpointSummary


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def checkpoint_history(checkpoints: Iterable[CheckpointFact],
                       goodput: RunGoodput | None = None) -> CheckpointHistory:
    facts = sorted(checkpoints, key=lambda c: c.ts)
    saves: list[SaveRow] = []
    previous: dict[int, CheckpointFact] = {}
    for fact in facts:
        if fact.kind != "save":
            continue
        before = previous.get(fact.attempt)
        interval_s = fact.ts - before.ts if before is not None else None
        interval_steps = (fact.step - before.step if before is not None and fact.step is not None
                          and before.step is not None else None)
        saves.append(SaveRow(attempt=fact.attempt, step=fact.step, ts=fact.ts,
                             duration_s=fact.duration_s, bytes=fact.bytes, interval_s=interval_s,
                             interval_steps=interval_steps))
        previous[fact.attempt] = fact

    attempts = {a.number: a for a in goodput.attempts} if goodput else {}
    order = sorted(attempts)
    restores: list[RestoreRow] = []
    seen: set[int] = set()
    for fact in facts:
        if fact.kind != "load" or fact.attempt in seen:
            continue
        seen.add(fact.attempt)  # the first load of an attempt is its restore
        earlier = [n for n in order if n < fact.attempt]
        before = attempts[earlier[-1]] if earlier else None
        restores.append(RestoreRow(
            attempt=fact.attempt, step=fact.step, ts=fact.ts, duration_s=fact.duration_s,
            bytes=fact.bytes,
            steps_lost=before.steps_lost if before is not None else None,
            lost_s=before.badput.lost_progress if before is not None else None,
            downtime_s=before.badput.restart_downtime if before is not None else None,
        ))

    blocking = [s.duration_s for s in saves if s.duration_s is not None]
    summary = CheckpointSummary(
        saves=len(saves),
        restores=len(restores),
        median_interval_s=_median([s.interval_s for s in saves if s.interval_s is not None]),
        median_blocking_s=_median(blocking),
        max_blocking_s=max(blocking) if blocking else None,
        total_blocking_s=sum(blocking),
        median_bytes=_median([float(s.bytes) for s in saves if s.bytes is not None]),
        total_steps_lost=sum(r.steps_lost or 0 for r in restores),
        total_lost_s=sum(r.lost_s or 0.0 for r in restores),
    )
    return CheckpointHistory(saves=saves, restores=restores, summary=summary)
