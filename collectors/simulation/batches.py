"""Wire-format v1 batches, window by window: what each rank's plugin would have sent.

Who sends: local rank 0 of each host (its GPU sampler reads the host's 8 GPUs, and it reports
steps), every other rank in ``plan.step_ranks`` (steps, checkpoint events), and a failing rank
(its interruption). Within a window the samplers' batches go first, so an XID is stored before
the interruption it explains, as it is in a real run where the sampler reports it at once.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

from collectors.simulation.config import GPUS_PER_HOST
from collectors.simulation.plan import CHECKPOINT_BYTES, RANK_JITTER, Plan
from collectors.simulation.telemetry import window_samples
from trainer_plugin import protocol

_NAMESPACE = uuid.UUID("5f0c61c2-9d55-4c55-8f57-6b1d7f3f1e0a")


def batch_id(plan: Plan, rank: int, attempt: int, w0: float) -> str:
    """Deterministic per run, rank, attempt and window: a rerun is recognised as a redelivery."""
    config = plan.config
    return str(uuid.uuid5(_NAMESPACE, f"{config.project}/{config.run_name}/{config.seed}/"
                                      f"{rank}/{attempt}/{w0:.3f}"))


def run_config(plan: Plan) -> dict[str, Any]:
    config = plan.config
    return {"simulated": True, "seed": config.seed, "gpus": config.gpus,
            "step_time_s": config.step_time_s, "checkpoint_every_steps": config.checkpoint_every_steps,
            "tokens_per_step": config.tokens_per_step, "site_timezone": config.site_timezone}


def rank_events(plan: Plan) -> dict[int, list[tuple[float, int, dict[str, Any]]]]:
    """Every event each rank sends over the whole run, as (ts, attempt, event) in time order."""
    events: dict[int, list[tuple[float, int, dict[str, Any]]]] = defaultdict(list)
    senders = sorted({h * GPUS_PER_HOST for h in range(plan.hosts)} | set(plan.step_ranks))
    savers = plan.step_ranks
    for attempt in plan.attempts:
        for rank in senders:
            events[rank].append((attempt.start, attempt.number,
                                 {"kind": "start", "pid": 4000 + rank, "simulated": True}))
    share = CHECKPOINT_BYTES // len(savers)
    run_dir = f"/lustre/ckpt/{plan.config.run_name}"
    for checkpoint in plan.checkpoints:
        for i, rank in enumerate(savers):
            # Rank 0 is the slowest writer (it also writes the metadata): the job waits for it.
            duration = checkpoint.duration_s * (1.0 if rank == 0 else 0.9 + 0.1 * ((i * 37) % 10) / 10)
            kind = "checkpoint_save" if checkpoint.kind == "save" else "checkpoint_load"
            events[rank].append((checkpoint.ts, checkpoint.attempt, {
                "kind": kind, "step": checkpoint.step, "duration_s": round(duration, 3),
                "bytes": share, "path": f"{run_dir}/step_{checkpoint.step:08d}/rank_{rank:05d}",
            }))
    for interruption in plan.interruptions:
        fields = dict(interruption.variant.fields)
        if interruption.variant.ecc_dbe:
            fields["ecc_dbe"] = 1
        events[interruption.rank].append((interruption.ts, interruption.attempt,
                                          {"kind": "interruption", **fields}))
    for host, host_events in plan.host_events.items():
        for ts, attempt, event in host_events:
            if attempt < 0:
                state, running = plan.state_at(np.array([ts]))
                if state[0] == 5:  # DOWN: nobody was sampling
                    continue
                attempt = int(running[0])
            events[host * GPUS_PER_HOST].append((ts, attempt, event))
    last = plan.attempts[-1]
    for rank in senders:
        events[rank].append((plan.end, last.number, {"kind": "finish", "status": "finished"}))
    for rank_list in events.values():
        rank_list.sort(key=lambda item: item[0])
    return events


class BatchMaker:
    """Builds the batches of consecutive windows [w0, w1)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.events = rank_events(plan)
        self._event_ts = {rank: np.array([e[0] for e in items]) for rank, items in self.events.items()}
        self.senders = sorted({h * GPUS_PER_HOST for h in range(plan.hosts)}
                              | set(plan.step_ranks) | set(self.events))
        self.step_ranks = set(plan.step_ranks)
        self.run_config = run_config(plan)
        # Tokens: each reporting rank carries an equal share of the global batch, so the tokens
        # summed over the rows of one step are the job's.
        self.tokens_per_row = plan.config.tokens_per_step // len(plan.step_ranks)

    def window(self, w0: float, w1: float, window_index: int) -> Iterator[dict[str, Any]]:
        plan = self.plan
        samples = window_samples(plan, w0, w1, window_index)
        i0, i1 = np.searchsorted(plan.step_end, [w0, w1], side="left")
        rng = np.random.default_rng([plan.noise_seed, window_index, 1])
        step_slice = slice(int(i0), int(i1))
        n_steps = int(i1 - i0)
        ordered = ([r for r in self.senders if r % GPUS_PER_HOST == 0]
                   + [r for r in self.senders if r % GPUS_PER_HOST != 0])
        for rank in ordered:
            host, local = divmod(rank, GPUS_PER_HOST)
            by_attempt: dict[int, dict[str, Any]] = {}

            def table(attempt: int, by_attempt=by_attempt) -> dict[str, Any]:
                if attempt not in by_attempt:
                    by_attempt[attempt] = {"steps": None, "gpus": None, "events": []}
                return by_attempt[attempt]

            if rank in self.step_ranks and n_steps:
                attempts = plan.step_attempt[step_slice]
                slowdown = 1.0 + plan.stragglers.get(rank, 0.0)
                durations = (plan.step_duration[step_slice] * slowdown
                             * (1.0 + rng.normal(0.0, RANK_JITTER, size=n_steps)))
                ends = plan.step_end[step_slice] + rng.normal(0.0, 0.002, size=n_steps)
                numbers = plan.step_no[step_slice]
                loss = (1.65 + 6.0 / np.sqrt(1.0 + numbers / 250.0)
                        + rng.normal(0.0, 0.015, size=n_steps))
                lr = 3e-4 * np.minimum(1.0, numbers / 2000.0 + 1e-3)
                for attempt in np.unique(attempts):
                    mask = attempts == attempt
                    table(int(attempt))["steps"] = {
                        "step": numbers[mask].tolist(),
                        "ts": np.round(ends[mask], 3).tolist(),
                        "duration_s": np.round(durations[mask], 4).tolist(),
                        "tokens": [self.tokens_per_row] * int(mask.sum()),
                        "metrics": {"loss": np.round(loss[mask], 4).tolist(),
                                    "lr": lr[mask].tolist()},
                    }
            if local == 0 and host in samples:
                host_samples = samples[host]
                for attempt in np.unique(host_samples.attempt):
                    mask = host_samples.attempt == attempt
                    gpus: dict[str, Any] = {name: column[mask].tolist()
                                            for name, column in host_samples.columns.items()}
                    gpus["simulated"] = True
                    table(int(attempt))["gpus"] = gpus
            if rank in self._event_ts:
                ts = self._event_ts[rank]
                e0, e1 = np.searchsorted(ts, [w0, w1], side="left")
                for event_ts, attempt, event in self.events[rank][int(e0):int(e1)]:
                    table(attempt)["events"].append({**event, "ts": round(event_ts, 3)})
            for attempt in sorted(by_attempt):
                tables = by_attempt[attempt]
                if not (tables["steps"] or tables["gpus"] or tables["events"]):
                    continue
                yield protocol.make_batch(
                    batch_id=batch_id(plan, rank, attempt, w0),
                    run={"project": plan.config.project, "name": plan.config.run_name,
                         "attempt": attempt, "config": self.run_config},
                    source={"host": plan.host_name(host), "rank": rank, "local_rank": local,
                            "world_size": plan.world_size},
                    steps=tables["steps"], gpus=tables["gpus"], events=tables["events"],
                )

    def finish(self, ts: float) -> Iterator[dict[str, Any]]:
        """A ``finish`` event from every sending rank at ``ts``: the run was stopped there."""
        plan = self.plan
        state, attempt = plan.state_at(np.array([ts]))
        number = int(attempt[0])
        for rank in self.senders:
            host, local = divmod(rank, GPUS_PER_HOST)
            yield protocol.make_batch(
                batch_id=batch_id(plan, rank, number, -ts),
                run={"project": plan.config.project, "name": plan.config.run_name,
                     "attempt": number, "config": self.run_config},
                source={"host": plan.host_name(host), "rank": rank, "local_rank": local,
                        "world_size": plan.world_size},
                events=[{"kind": "finish", "ts": round(ts, 3), "status": "finished"}],
            )
