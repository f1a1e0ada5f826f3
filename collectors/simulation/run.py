"""Runs a SimConfig: plans the run, sends its batches through the ingest task, returns the truth."""

from __future__ import annotations

from collections.abc import Callable

from collectors.simulation.config import GroundTruth, SimConfig


def run_simulation(config: SimConfig, *, token: str | None = None,
                   progress: Callable[[float], None] | None = None) -> GroundTruth:
    """Generates the run described by ``config`` and stores it through the real ingest path.

    Batches (wire format v1, one per rank per flush interval) go to
    ``collectors.tasks.ingest_batch``: called in-process, or ``.delay()``-ed to a running worker
    when ``config.via_broker``. The project and an ingest token are created when ``token`` is None;
    the run's timezone is set to ``config.site_timezone``. ``progress`` is called with the fraction
    of simulated time stored so far (0..1). Deterministic given ``config.seed`` (batch ids too).
    """
    raise NotImplementedError("the simulator's physics lands in the next commit")
