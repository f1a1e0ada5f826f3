"""Effective training time (ETTR) of a run and where the rest of the wall clock went (badput).

Pure functions: per-attempt step spans, checkpoints and interruptions in, seconds out. Times are
Unix seconds. The buckets below partition the run's wall clock exactly, so they always add up to
it and ETTR = productive / wall clock.

The wall clock runs from the first attempt's start to the last thing known about the last attempt
(its interruption, else its newest step row). A running run is judged up to its newest step: the
step in progress and any silence after it are not judged until something ends them. After a
clean finish the clock stops at the last step (a final save and teardown cost no training).

For attempt *i* (start ``s``, first step row at ``f``, last step row at ``l``, stop ``x``, next
attempt's start ``n``), in time order, each interval clipped so no second is counted twice:

startup
    ``s → f``: process start, initialisation, checkpoint load, and the first step itself (its row
    is written when it ends; the first step carries compilation and warm-up). Counted for every
    attempt, including restarts.
checkpoint save
    the blocking part of every save made between ``f`` and ``l`` (the max over ranks for one
    save: the job waits for the slowest rank). A save at step *k* blocks between the rows of steps
    *k* and *k+1* (the plugin's hook order: step, then save).
lost progress
    steps of an attempt that ended (interrupted, or followed by another attempt) done after the
    point training resumed from: the time from the row of the kept step *k* to ``l``, less the
    saves in it, plus, for an interruption that is not a hang, the partial step from ``l`` to the
    interruption ``x``. The kept step is, in order of preference: the step the next attempt
    restored (its first checkpoint load), else the newest save at or before ``l``, else the next
    attempt's first step − 1; with none of these nothing is counted as lost.
stalls
    for an interruption the stall detector classed as a hang (source ``stall``): ``l → x``, the
    time the job sat without progress before its processes went silent.
restart downtime
    ``x → n``: from the interruption (or the last step of an attempt that ended without one) to
    the next attempt's start. DESIGN.md's "interruption to the next attempt's first step" is
    restart downtime + the next attempt's startup; they are kept apart so an attempt's own
    initialisation shows in its own row and nothing is counted twice.
productive
    everything else between ``f`` and ``l``: steps whose progress was kept.

Per attempt, the wall clock is ``s → n`` (its downtime after it belongs to it), so the attempts'
walls add up to the run's. Mean time between interruptions (MTBI) = run wall clock / number of
interruptions (one per attempt: several ranks reporting the same failure are one interruption).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

BUCKETS = ("productive", "startup", "checkpoint_save", "lost_progress", "restart_downtime", "stall")
BADPUT_BUCKETS = BUCKETS[1:]
BUCKET_LABELS = {
    "productive": "Productive",
    "startup": "Startup",
    "checkpoint_save": "Checkpoint save",
    "lost_progress": "Lost progress",
    "restart_downtime": "Restart downtime",
    "stall": "Stalls",
}
# Sources whose tail (last step → interruption) is a hang rather than a partial step.
HANG_SOURCES = frozenset({"stall"})


@dataclass(frozen=True)
class AttemptSpan:
    """One attempt reduced to what goodput needs: its bounds and its first and last step rows."""

    number: int
    started_at: float | None
    first_step_at: float | None = None
    last_step_at: float | None = None
    first_step: int | None = None
    last_step: int | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class CheckpointFact:
    """One save or load, already merged over ranks (max duration, summed bytes, first ts)."""

    attempt: int
    kind: str  # "save" | "load"
    ts: float
    step: int | None = None
    duration_s: float | None = None
    bytes: int | None = None


@dataclass(frozen=True)
class InterruptionFact:
    attempt: int
    ts: float
    source: str
    category: str = "unknown"
    expected: bool = False
    id: int | None = None


@dataclass
class Badput:
    productive: float = 0.0
    startup: float = 0.0
    checkpoint_save: float = 0.0
    lost_progress: float = 0.0
    restart_downtime: float = 0.0
    stall: float = 0.0

    @property
    def wall(self) -> float:
        return sum(getattr(self, name) for name in BUCKETS)

    @property
    def badput(self) -> float:
        return sum(getattr(self, name) for name in BADPUT_BUCKETS)

    @property
    def ettr(self) -> float | None:
        wall = self.wall
        return self.productive / wall if wall > 0 else None

    def add(self, bucket: str, seconds: float) -> None:
        setattr(self, bucket, getattr(self, bucket) + seconds)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in BUCKETS}


@dataclass
class AttemptGoodput:
    number: int
    start: float
    end: float
    badput: Badput
    interruption: InterruptionFact | None
    kept_step: int | None
    steps_lost: int
    # Labelled intervals (bucket, start, end) in time order, for the timeline chart.
    segments: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass
class RunGoodput:
    start: float | None
    end: float | None
    total: Badput
    attempts: list[AttemptGoodput]
    interruptions: int
    unexpected_interruptions: int

    @property
    def ettr(self) -> float | None:
        return self.total.ettr

    @property
    def mtbi_s(self) -> float | None:
        """Mean time between interruptions: wall clock / interruptions; None without any."""
        wall = self.total.wall
        return wall / self.interruptions if self.interruptions else None

    @property
    def mtbi_unexpected_s(self) -> float | None:
        wall = self.total.wall
        return wall / self.unexpected_interruptions if self.unexpected_interruptions else None


def primary_interruptions(interruptions: Iterable[InterruptionFact]) -> dict[int, InterruptionFact]:
    """The first interruption of each attempt (several ranks may report one failure)."""
    first: dict[int, InterruptionFact] = {}
    for fact in sorted(interruptions, key=lambda f: (f.ts, f.id or 0)):
        first.setdefault(fact.attempt, fact)
    return first


def _ordered(attempts: Iterable[AttemptSpan]) -> list[AttemptSpan]:
    # An attempt with neither a start nor a step row left nothing to measure.
    known = [a for a in attempts if a.started_at is not None or a.first_step_at is not None]
    return sorted(known, key=lambda a: a.number)


def _start(attempt: AttemptSpan) -> float:
    if attempt.started_at is None:
        return attempt.first_step_at  # type: ignore[return-value]
    if attempt.first_step_at is None:
        return attempt.started_at
    return min(attempt.started_at, attempt.first_step_at)


def kept_steps(
    attempts: Iterable[AttemptSpan],
    checkpoints: Iterable[CheckpointFact],
    interruptions: Iterable[InterruptionFact],
) -> dict[int, int]:
    """For each attempt whose later steps will be (or were) redone, the last step kept: see the
    module docstring. Attempts without an entry lost nothing."""
    ordered = _ordered(attempts)
    checkpoints = list(checkpoints)
    interrupted = primary_interruptions(interruptions)
    kept: dict[int, int] = {}
    for i, attempt in enumerate(ordered):
        following = ordered[i + 1] if i + 1 < len(ordered) else None
        if following is None and attempt.number not in interrupted:
            continue
        if attempt.last_step is None:
            continue
        step: int | None = None
        if following is not None:
            loads = sorted((c for c in checkpoints
                            if c.kind == "load" and c.attempt == following.number
                            and c.step is not None), key=lambda c: c.ts)
            if loads:
                step = loads[0].step
        if step is None:
            saves = [c.step for c in checkpoints
                     if c.kind == "save" and c.step is not None and c.attempt <= attempt.number
                     and c.step <= attempt.last_step]
            if saves:
                step = max(saves)
        if step is None and following is not None and following.first_step is not None:
            step = following.first_step - 1
        if step is not None:
            kept[attempt.number] = step
    return kept


def run_goodput(
    attempts: Iterable[AttemptSpan],
    checkpoints: Iterable[CheckpointFact],
    interruptions: Iterable[InterruptionFact],
    kept_step_at: Mapping[int, float | None] | None = None,
) -> RunGoodput:
    """ETTR and badput of a run, in total and per attempt.

    ``kept_step_at`` maps an attempt number to the time of its newest step row at or before its
    kept step (``kept_steps``), None when the attempt has no such row (everything it did is lost).
    Without an entry for an attempt in ``kept_steps``, nothing of it counts as lost."""
    ordered = _ordered(attempts)
    checkpoints = list(checkpoints)
    interruptions = list(interruptions)
    primary = primary_interruptions(interruptions)
    kept = kept_steps(ordered, checkpoints, interruptions)
    kept_step_at = kept_step_at or {}
    saves_by_attempt: dict[int, list[CheckpointFact]] = {}
    for checkpoint in checkpoints:
        if checkpoint.kind == "save" and checkpoint.duration_s:
            saves_by_attempt.setdefault(checkpoint.attempt, []).append(checkpoint)

    total = Badput()
    results: list[AttemptGoodput] = []
    clock = None  # nothing before this instant may be counted again
    for i, attempt in enumerate(ordered):
        following = ordered[i + 1] if i + 1 < len(ordered) else None
        start = _start(attempt)
        interruption = primary.get(attempt.number)
        first, last = attempt.first_step_at, attempt.last_step_at
        if interruption is not None:
            stop = interruption.ts
        elif following is not None:
            stop = last if last is not None else (attempt.ended_at or start)
        else:
            stop = last if last is not None else start
        end = _start(following) if following is not None else stop
        if following is None and last is not None:
            end = max(end, last)

        if clock is None or start > clock:
            clock = start
        # The next attempt's start bounds everything of this one.
        ledger = _Ledger(clock, end)
        put = ledger.put
        kept_step = kept.get(attempt.number)
        steps_lost = 0
        if first is None:
            put("startup", start, stop)
        else:
            put("startup", start, first)
            lost_from = last  # the time steps start being redone
            if kept_step is not None and attempt.last_step is not None \
                    and kept_step < attempt.last_step:
                lost_from = kept_step_at.get(attempt.number) or first
                lost_from = min(max(lost_from, first), last)
                steps_lost = attempt.last_step - max(kept_step, (attempt.first_step or 0) - 1)
            saves = [s for s in saves_by_attempt.get(attempt.number, ()) if first < s.ts <= last]
            kept_saves = sum(s.duration_s for s in saves if not _after(s, kept_step, lost_from))
            lost_saves = sum(s.duration_s for s in saves if _after(s, kept_step, lost_from))
            # Productive and save time share first → lost_from; lost and save time lost_from → last.
            _split(put, first, lost_from, "productive", kept_saves)
            _split(put, lost_from, last, "lost_progress", lost_saves)
            if interruption is not None:
                put("stall" if interruption.source in HANG_SOURCES else "lost_progress", last, stop)
        put("restart_downtime", stop, end)
        clock = ledger.clock
        badput = ledger.badput
        for bucket in BUCKETS:
            total.add(bucket, getattr(badput, bucket))
        results.append(AttemptGoodput(
            number=attempt.number, start=start, end=max(end, start), badput=badput,
            interruption=interruption, kept_step=kept_step, steps_lost=max(steps_lost, 0),
            segments=ledger.segments,
        ))
    counted = list(primary.values())
    return RunGoodput(
        start=results[0].start if results else None,
        end=results[-1].end if results else None,
        total=total,
        attempts=results,
        interruptions=len(counted),
        unexpected_interruptions=sum(1 for f in counted if not f.expected),
    )


class _Ledger:
    """Books labelled intervals of one attempt, clipped to [clock, cut] and never overlapping."""

    def __init__(self, clock: float, cut: float):
        self.clock, self.cut = clock, cut
        self.badput = Badput()
        self.segments: list[tuple[str, float, float]] = []

    def put(self, bucket: str, a: float | None, b: float | None) -> None:
        if a is None or b is None:
            return
        a, b = max(a, self.clock), min(b, self.cut)
        if b <= a:
            return
        self.badput.add(bucket, b - a)
        last = self.segments[-1] if self.segments else None
        if last is not None and last[0] == bucket and last[2] == a:
            self.segments[-1] = (bucket, last[1], b)
        else:
            self.segments.append((bucket, a, b))
        self.clock = b


def _after(save: CheckpointFact, kept_step: int | None, lost_from: float) -> bool:
    """Whether a save was made inside the lost window (at or after the kept step)."""
    if kept_step is not None and save.step is not None:
        return save.step >= kept_step
    return save.ts > lost_from


def _split(put, a: float, b: float, bucket: str, save_s: float) -> None:
    """Puts a → b as ``bucket`` with ``save_s`` of it as checkpoint save. The saves are drawn as
    one block at the end of the interval: the timeline shows how much, not exactly when."""
    if b <= a:
        return
    save_s = min(save_s, b - a)
    put(bucket, a, b - save_s)
    put("checkpoint_save", b - save_s, b)


def ettr_of(spans: Sequence[AttemptGoodput]) -> float | None:
    total = Badput()
    for attempt in spans:
        for bucket in BUCKETS:
            total.add(bucket, getattr(attempt.badput, bucket))
    return total.ettr
