"""A simulated GPU cluster that trains through the real ingest path.

``run_simulation(SimConfig(...))`` generates a whole training run — per-GPU temperature and power
following the site's day/night cycle, step times that slow with the heat, checkpoints, stalls,
interruptions at the Llama 3 rate and root-cause mix, restarts, slow ranks, hot GPUs — as wire
format v1 batches, stores them through ``collectors.tasks.ingest_batch`` and returns the
``GroundTruth`` it planted, so that analyses and pages can be checked against known answers.
"""

from __future__ import annotations

from collectors.simulation.config import GroundTruth, SimConfig
from collectors.simulation.run import run_simulation

__all__ = ["GroundTruth", "SimConfig", "run_simulation"]
