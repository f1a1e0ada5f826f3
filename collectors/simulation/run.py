"""Runs a SimConfig: plans the run, sends its batches through the ingest task, returns the truth."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from django.db import transaction

from collectors.models import IngestToken, Project, Run
from collectors.simulation.batches import BatchMaker
from collectors.simulation.config import GroundTruth, SimConfig
from collectors.simulation.plan import build_plan
from collectors.simulation.truth import ground_truth
from trainer_plugin import protocol

#: Window of a live stream's batches, seconds: the plugin's own flush cadence.
LIVE_FLUSH_S = 10.0


class SimulationError(Exception):
    """The simulation cannot run as asked; the message says why and what to do."""


def check_config(config: SimConfig) -> None:
    """Raises SimulationError for a config that cannot be simulated (before anything is written)."""
    problems = []
    if config.gpus < 1:
        problems.append("--gpus must be at least 1")
    if not 0 < config.days <= 400:
        problems.append("--days must be more than 0 and at most 400")
    if not 0.5 <= config.sample_interval_s <= 3600:
        problems.append("--sample-interval must be between 0.5 and 3600 seconds")
    if config.step_time_s <= 0 or config.checkpoint_every_steps < 1:
        problems.append("the step time must be positive and checkpoints at least every step")
    if config.flush_interval_s <= 0:
        problems.append("the flush interval must be positive")
    if not 0 <= config.diurnal_slowdown_pct <= 50:
        problems.append("--diurnal-slowdown must be between 0 and 50 percent")
    if config.interruptions is not None and config.interruptions < 0:
        problems.append("--interruptions cannot be negative")
    if config.start is not None and config.start.tzinfo is None:
        problems.append("the start must be a timezone-aware datetime")
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(config.site_timezone)
    except Exception:
        problems.append(f"unknown time zone {config.site_timezone!r} (use an IANA name such as "
                        "America/Chicago)")
    if config.interruption_mix and sum(config.interruption_mix.values()) <= 0:
        problems.append("the interruption mix needs at least one positive weight")
    try:
        protocol.validate_batch(protocol.make_batch(
            run={"project": config.project, "name": config.run_name, "attempt": 0},
            source={"host": "node000", "rank": 0, "local_rank": 0, "world_size": 1}))
    except protocol.ProtocolError as error:
        problems.append(f"the project or run name cannot be sent: {error}")
    if problems:
        raise SimulationError("; ".join(problems))


def _windows(start: float, end: float, flush_s: float, live_from: float | None
             ) -> Iterator[tuple[float, float]]:
    """Consecutive [w0, w1) covering the run; after ``live_from`` (now), live-sized windows."""
    w0 = start
    stop = end + 1e-3  # the last step and the finish event are sent too
    while w0 < stop:
        if live_from is not None and w0 >= live_from:
            w1 = w0 + LIVE_FLUSH_S
        else:
            w1 = w0 + flush_s
            if live_from is not None and w0 < live_from < w1:
                w1 = live_from
        w1 = min(w1, stop)
        yield w0, w1
        w0 = w1


def _prepare_run(config: SimConfig, token: str | None, run_config: dict) -> tuple[Run, str]:
    with transaction.atomic():
        project, _ = Project.objects.get_or_create(slug=config.project,
                                                   defaults={"name": config.project})
        if Run.objects.filter(project=project, name=config.run_name).exists():
            raise SimulationError(f"run {config.run_name!r} already exists in project "
                                  f"{config.project!r}; choose another --run-name")
        if token is None:
            _, token = IngestToken.issue(project, name="simulator")
        elif (found := IngestToken.objects.authenticate(token)) is None \
                or found.project_id != project.pk:
            raise SimulationError(f"the token given is not a live ingest token of project "
                                  f"{config.project!r}")
        # Created here rather than by the first batch so that it carries the site's time zone.
        run = Run.objects.create(project=project, name=config.run_name, timezone=config.site_timezone,
                                 world_size=config.world_size, config=run_config)
    return run, token


def run_simulation(config: SimConfig, *, token: str | None = None,
                   progress: Callable[[float], None] | None = None) -> GroundTruth:
    """Generates the run described by ``config`` and stores it through the real ingest path.

    Batches (wire format v1, one per sending rank per flush interval) go to
    ``collectors.tasks.ingest_batch``: called in-process, or ``.delay()``-ed to a running worker
    when ``config.via_broker``. The project and an ingest token are created when ``token`` is None;
    the run is created first with its timezone set to ``config.site_timezone`` (an existing run of
    that name is refused). ``progress`` is called with the fraction of simulated time sent so far
    (0..1). With ``config.live`` the part of the run before now is sent at once and the rest as
    the wall clock reaches it. Deterministic given ``config.seed`` (batch ids too).
    """
    from collectors.tasks import ingest_batch

    check_config(config)
    now = time.time()
    start = config.resolved_start(datetime.fromtimestamp(now, tz=UTC)).timestamp()
    plan = build_plan(config, start)
    maker = BatchMaker(plan)
    run, token = _prepare_run(config, token, maker.run_config)

    rows = {"batches": 0, "steps": 0, "gpu_samples": 0, "events": 0}

    def send(batch: dict) -> None:
        rows["batches"] += 1
        rows["steps"] += len(batch["steps"]["step"])
        rows["gpu_samples"] += len(batch["gpus"]["ts"])
        rows["events"] += len(batch["events"])
        if config.via_broker:
            protocol.validate_batch(batch)
            ingest_batch.delay(batch, token=token)
        else:
            result = ingest_batch(batch, token=token)
            if "rejected" in result:
                raise SimulationError(f"the collectors rejected a simulated batch: "
                                      f"{result['rejected']}")

    span = max(plan.end - plan.start, 1e-9)
    live_from = now if config.live else None
    sent_until = plan.start
    try:
        for index, (w0, w1) in enumerate(_windows(plan.start, plan.end, config.flush_interval_s,
                                                  live_from)):
            if live_from is not None and w1 > live_from:
                # The plugin sends a window once it has passed.
                delay = w1 - time.time()
                if delay > 0:
                    time.sleep(delay)
            for batch in maker.window(w0, w1, index):
                send(batch)
            sent_until = w1
            if progress is not None:
                progress(min(1.0, (w1 - plan.start) / span))
    except KeyboardInterrupt:
        if sent_until < plan.end:
            # Stopped by hand: the job finishes where it was, as a stopped training job's plugin
            # says, so the run does not look hung (nor get flagged by the stall detector).
            for batch in maker.finish(sent_until):
                send(batch)
        raise
    return ground_truth(plan, run.pk, rows)
