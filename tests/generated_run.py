"""A synthetic run whose interruptions, checkpoints and downtime are planted, so the goodput,
checkpoint and root-cause analyses can be checked against the exact truth.

The run is written the way a real one arrives: wire-format batches per rank through
``collectors.tasks.ingest_batch``, and the stall detector ticking while attempts go silent. Every
duration is planted; ``truth`` is worked out from the plan alone (never from the analysis code):

- attempt *i* starts at ``s``; its first step row comes ``startup_s`` later (startup);
- each further step takes ``step_s``; a save after step *k* (k % every == 0) blocks ``save_s``
  (rank 0's duration; rank 1 reports a little less) before step *k+1*;
- an attempt ends by ``finish`` (clean, the clock stops at its last step), ``exception`` (the
  plugin reports it ``tail_s`` after the last step), ``hang`` (heartbeats go on for ``hang_s``
  after the last step, then stop) or ``kill`` (steps and heartbeats stop together, the last
  heartbeat ``tail_s`` after the last step);
- the next attempt starts ``downtime_s`` after the interruption, restores the newest save and
  resumes at the step after it.

Rank 1 writes its rows ``RANK_SKEW_S`` after rank 0, like a rank that leaves the all-reduce last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from collectors.models import Attempt, Category, Interruption, Run
from collectors.stalls import detect_stalls
from collectors.tasks import ingest_batch
from trainer_plugin import protocol

RANK_SKEW_S = 0.005
HEARTBEAT_EVERY_S = 30.0
ROWS_PER_BATCH = 5000


@dataclass(frozen=True)
class PlannedAttempt:
    steps: int  # steps this attempt makes before it ends
    end: str  # finish | exception | hang | kill
    startup_s: float = 120.0
    tail_s: float = 0.0  # exception/kill: last step row → the failure
    hang_s: float = 0.0  # hang: last step row → heartbeats stop (a multiple of HEARTBEAT_EVERY_S)
    downtime_s: float = 0.0  # interruption → next attempt's start
    text: str = ""  # exception text for the classifier
    exc_type: str = ""
    category: str = Category.UNKNOWN  # what the interruption should be filed under
    expected: bool = False


@dataclass
class Truth:
    start: float
    end: float
    productive: float = 0.0
    startup: float = 0.0
    checkpoint_save: float = 0.0
    lost_progress: float = 0.0
    restart_downtime: float = 0.0
    stall: float = 0.0
    interruptions: int = 0
    saves: int = 0
    restores: list[dict] = field(default_factory=list)  # per restore: step, steps_lost, lost_s

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def ettr(self) -> float:
        return self.productive / self.wall


DEFAULT_PLAN = (
    PlannedAttempt(steps=173, end="exception", startup_s=120.0, tail_s=0.7, downtime_s=300.0,
                   text="CUDA error: an illegal memory access was encountered",
                   exc_type="RuntimeError", category=Category.GPU_HARDWARE),
    PlannedAttempt(steps=110, end="hang", startup_s=90.0, hang_s=600.0, downtime_s=200.0,
                   category=Category.NCCL_TIMEOUT),
    PlannedAttempt(steps=80, end="kill", startup_s=100.0, tail_s=0.4, downtime_s=150.0,
                   category=Category.HOST),
    PlannedAttempt(steps=140, end="finish", startup_s=80.0),
)


@dataclass
class GeneratedRun:
    run: Run
    truth: Truth
    plan: tuple[PlannedAttempt, ...]


def _epoch(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def generate_run(token: str, *, project: str = "llm", name: str = "generated-run",
                 start: float = 1_767_000_000.0, plan: tuple[PlannedAttempt, ...] = DEFAULT_PLAN,
                 step_s: float = 2.0, save_every: int = 50, save_s: float = 6.0,
                 save_bytes: int = 4 * 2**30, ranks: int = 2) -> GeneratedRun:
    """Ingests the planned run and returns it with its truth (seconds, counts)."""
    truth = Truth(start=start, end=start)
    t = start
    resume_from = 0  # the step restored at the start of the next attempt
    newest_save = 0
    for number, planned in enumerate(plan):
        s = t
        first_step = resume_from + 1
        steps, stamps, events = [], [], [{"kind": "start", "ts": s}]
        if number > 0:
            events.append({"kind": "checkpoint_load", "ts": s + planned.startup_s / 2,
                           "step": resume_from, "duration_s": planned.startup_s / 4,
                           "bytes": save_bytes // ranks, "path": f"/ckpt/step{resume_from}"})
        ts = s + planned.startup_s
        saves_here = []
        for step in range(first_step, first_step + planned.steps):
            if step > first_step:
                ts += step_s
                if (step - 1) % save_every == 0:
                    ts += save_s
            steps.append(step)
            stamps.append(ts)
            if step % save_every == 0 and step < first_step + planned.steps - 1:
                saves_here.append((step, ts))
        last_step, last_ts = steps[-1], stamps[-1]
        truth.startup += planned.startup_s
        truth.checkpoint_save += save_s * len(saves_here)
        truth.saves += len(saves_here)
        if saves_here:
            newest_save = saves_here[-1][0]
        kept = last_step if planned.end == "finish" else newest_save
        kept_in_here = max(kept, first_step)
        truth.productive += (kept_in_here - first_step) * step_s
        lost_steps = last_step - kept
        truth.lost_progress += (last_step - kept_in_here) * step_s
        for step, when in saves_here:
            events.append({"kind": "checkpoint_save", "ts": when + save_s, "step": step,
                           "duration_s": save_s, "bytes": save_bytes // ranks,
                           "path": f"/ckpt/step{step}"})
        beats = [b for b in _every(s, last_ts, HEARTBEAT_EVERY_S)]
        if planned.end == "finish":
            events.append({"kind": "finish", "ts": last_ts + 1.0, "status": "finished"})
            stop = last_ts
        elif planned.end == "exception":
            stop = last_ts + planned.tail_s
            truth.lost_progress += planned.tail_s
            events.append({"kind": "interruption", "ts": stop, "exc_type": planned.exc_type,
                           "message": planned.text, "traceback": planned.text})
        elif planned.end == "hang":
            stop = last_ts + planned.hang_s
            truth.stall += planned.hang_s
            beats += [b for b in _every(last_ts, stop, HEARTBEAT_EVERY_S) if b > last_ts]
        else:  # kill
            stop = last_ts + planned.tail_s
            truth.lost_progress += planned.tail_s
            beats.append(stop)
        events += [{"kind": "heartbeat", "ts": b} for b in beats]

        _ingest(token, project, name, number, ranks, steps, stamps, events, step_s, save_s)
        run = Run.objects.get(project__slug=project, name=name)
        attempt = Attempt.objects.get(run=run, number=number)
        if planned.end == "exception" and not attempt.interruptions.exists():
            # What collectors.interruptions does at ingest, where it is not wired in.
            Interruption.objects.create(
                run=run, attempt=attempt, ts=_epoch(stop), rank=1, host="node000",
                source=Interruption.Source.EXCEPTION, category=planned.category,
                expected=planned.expected, rule="generated",
                evidence={"text": planned.text, "exc_type": planned.exc_type},
            )
        if planned.end in ("hang", "kill"):
            # The detector ticks once the attempt has been silent long enough.
            detect_stalls(now=_epoch(stop + 3600.0))
        if planned.end == "finish":
            truth.end = last_ts
            break
        truth.interruptions += 1
        truth.restart_downtime += planned.downtime_s
        truth.restores.append({"step": kept, "steps_lost": lost_steps,
                               "lost_s": (last_step - kept_in_here) * step_s
                               + (planned.tail_s if planned.end != "hang" else 0.0)})
        resume_from = kept
        t = stop + planned.downtime_s
        truth.end = t
    run = Run.objects.get(project__slug=project, name=name)
    # The classifier files each interruption by its rules; the plan is the truth of this run.
    for number, planned in enumerate(plan):
        Interruption.objects.filter(run=run, attempt__number=number).update(
            category=planned.category, expected=planned.expected)
    return GeneratedRun(run=run, truth=truth, plan=tuple(plan))


def _every(a: float, b: float, every: float) -> list[float]:
    out, x = [], a + every
    while x <= b + 1e-9:
        out.append(x)
        x += every
    return out


def _ingest(token, project, name, number, ranks, steps, stamps, events, step_s, save_s) -> None:
    # Rank 0 last: its clean finish must be the attempt's final word, as it is in a real run
    # (every rank starts before rank 0 finishes).
    for rank in reversed(range(ranks)):
        skew = RANK_SKEW_S * rank
        for lo in range(0, max(len(steps), 1), ROWS_PER_BATCH):
            chunk = range(lo, min(lo + ROWS_PER_BATCH, len(steps)))
            rank_events = []
            if lo == 0:
                for event in events:
                    if event["kind"] == "interruption" and rank != 1:
                        continue  # one rank fails; the others are torn down by the launcher
                    if event["kind"] == "heartbeat" and rank != 0:
                        continue
                    copy = dict(event)
                    if copy["kind"] in ("checkpoint_save", "checkpoint_load"):
                        copy["path"] = f"{copy['path']}/rank{rank}.pt"  # each rank its shard
                    if copy["kind"] == "checkpoint_save" and rank:
                        copy["duration_s"] = save_s - 0.5  # rank 0 is the slowest writer
                    rank_events.append(copy)
            batch = protocol.make_batch(
                run={"project": project, "name": name, "attempt": number,
                     "config": {"model": "llama-1b", "global_batch": 256}},
                source={"host": f"node{rank // 8:03d}", "rank": rank, "local_rank": rank % 8,
                        "world_size": ranks},
                steps={"step": [steps[i] for i in chunk],
                       "ts": [stamps[i] + skew for i in chunk],
                       "duration_s": [step_s] * len(chunk),
                       "tokens": [4096] * len(chunk),
                       "metrics": {"loss": [2.0 + 8.0 / (1 + steps[i] / 50) for i in chunk]}},
                events=rank_events,
            )
            result = ingest_batch(batch, token=token)
            assert "rejected" not in result, result


def _crash(steps, category, text, exc_type="RuntimeError", *, downtime_s=420.0, tail_s=3.0,
           expected=False, startup_s=240.0):
    return PlannedAttempt(steps=steps, end="exception", startup_s=startup_s, tail_s=tail_s,
                          downtime_s=downtime_s, text=text, exc_type=exc_type,
                          category=category, expected=expected)


# About a day of a large job: 12 s steps, a 35 s save every 100 steps, ten interruptions of the
# kinds the Llama 3 report lists (GPU and HBM faults first), one hang and one silent kill.
REALISTIC_PLAN = (
    _crash(730, Category.GPU_HARDWARE, "CUDA error: an illegal memory access was encountered"),
    _crash(410, Category.GPU_MEMORY, "CUDA error: uncorrectable ECC error encountered"),
    PlannedAttempt(steps=520, end="hang", startup_s=260.0, hang_s=1800.0, downtime_s=300.0,
                   category=Category.NCCL_TIMEOUT),
    _crash(350, Category.GPU_HARDWARE, "CUDA error: unspecified launch failure"),
    _crash(640, Category.NETWORK, "NCCL WARN NET/IB : Got completion with error 12, opcode 0",
           exc_type="torch.distributed.DistBackendError"),
    PlannedAttempt(steps=280, end="kill", startup_s=230.0, tail_s=1.0, downtime_s=900.0,
                   category=Category.HOST),
    _crash(470, Category.PLANNED, "Received SIGTERM: preemption notice", exc_type="SystemExit",
           expected=True, downtime_s=1200.0),
    _crash(590, Category.GPU_MEMORY, "CUDA error: uncorrectable ECC error encountered"),
    _crash(300, Category.STORAGE, "[Errno 5] Input/output error: '/ckpt/step4200'",
           exc_type="OSError"),
    _crash(510, Category.SOFTWARE_BUG, "'NoneType' object has no attribute "
           "'grad'", exc_type="AttributeError", downtime_s=2400.0),
    PlannedAttempt(steps=800, end="finish", startup_s=250.0),
)
REALISTIC_STEP_S = 12.0
REALISTIC_SAVE_EVERY = 100
REALISTIC_SAVE_S = 35.0


def realistic_generated_run(token: str, *, project: str = "llm", name: str = "llama-70b-pretrain",
                            ends_at: float) -> GeneratedRun:
    """REALISTIC_PLAN ending about ``ends_at`` (Unix seconds)."""
    probe_wall = sum(p.startup_s + p.steps * REALISTIC_STEP_S + p.hang_s + p.downtime_s
                     + p.tail_s + p.steps / REALISTIC_SAVE_EVERY * REALISTIC_SAVE_S
                     for p in REALISTIC_PLAN)
    return generate_run(token, project=project, name=name, start=ends_at - probe_wall,
                        plan=REALISTIC_PLAN, step_s=REALISTIC_STEP_S,
                        save_every=REALISTIC_SAVE_EVERY, save_s=REALISTIC_SAVE_S,
                        save_bytes=140 * 2**30, ranks=2)
