"""Builders of wire-format batches for tests, as the plugin would send them."""

from __future__ import annotations

import time

from trainer_plugin import protocol


def step_batch(project: str = "llm", run: str = "run-1", *, rank: int = 0, world_size: int = 2,
               attempt: int = 0, first_step: int = 0, count: int = 10, t0: float | None = None,
               events: list[dict] | None = None, gpus: int = 0, extra_metric: bool = True) -> dict:
    t0 = t0 if t0 is not None else time.time() - count
    steps = list(range(first_step, first_step + count))
    metrics = {"loss": [2.0 - 0.01 * s for s in steps], "lr": [3e-4] * count}
    if extra_metric:
        metrics["accuracy"] = [0.5 + 0.001 * s for s in steps]
    gpu_table = protocol.empty_gpus()
    for g in range(gpus):
        for column, value in (("ts", t0 + g), ("gpu", g), ("temp_c", 60.0 + g), ("power_w", 350.0),
                              ("util_pct", 99.0), ("mem_used_mb", 40000.0),
                              ("sm_clock_mhz", 1980.0), ("throttle", 0)):
            gpu_table[column].append(value)
    return protocol.make_batch(
        run={"project": project, "name": run, "attempt": attempt, "config": {"lr": 3e-4}},
        source={"host": f"node{rank // 8:03d}", "rank": rank, "local_rank": rank % 8,
                "world_size": world_size},
        steps={"step": steps, "ts": [t0 + i for i in range(count)], "duration_s": [0.5] * count,
               "tokens": [4096] * count, "metrics": metrics},
        gpus=gpu_table,
        events=events or [],
    )
