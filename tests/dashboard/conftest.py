"""Personas and runs for the dashboard tests.

The `llm` project is seen by its members (owner, member) and by superusers; the outsider is a
member of `vision` only. Step rows are written straight through the ORM, as the collectors would.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from collectors.models import Attempt, Project, Run, StepMetric
from tests.collectors.alerts.conftest import webhook_server  # noqa: F401 (Slack stand-in)

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    # The default hasher is slow on purpose; four personas per test would dominate the run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def users(db) -> dict[str, User]:
    return {
        "owner": User.objects.create_user("olivia", password=PASSWORD),
        "member": User.objects.create_user("mateo", password=PASSWORD),
        "outsider": User.objects.create_user("oscar", password=PASSWORD),
        "admin": User.objects.create_superuser("ada", password=PASSWORD),
    }


@pytest.fixture
def projects(users) -> dict[str, Project]:
    llm = Project.objects.create(slug="llm", name="LLM pretraining")
    llm.members.add(users["owner"], users["member"])
    vision = Project.objects.create(slug="vision", name="Vision")
    vision.members.add(users["outsider"])
    return {"llm": llm, "vision": vision}


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def clients(users) -> dict[str, Client]:
    return {name: client_for(user) for name, user in users.items()}


def add_steps(
    run: Run,
    attempt: Attempt,
    *,
    ranks: int,
    steps: range,
    start: datetime,
    every_s: float,
    tokens: int | None = None,
    loss: Callable[[int, int], float | None] = lambda rank, step: 1.0 / (step + 1),
    duration: Callable[[int, int], float | None] | None = None,
) -> list[StepMetric]:
    """Step rows for ``ranks`` ranks, step n at start + n * every_s."""
    rows = [
        StepMetric(
            run=run,
            attempt=attempt,
            rank=rank,
            step=step,
            ts=start + timedelta(seconds=step * every_s),
            duration_s=duration(rank, step) if duration else every_s,
            tokens=tokens,
            loss=loss(rank, step),
        )
        for rank in range(ranks)
        for step in steps
    ]
    return StepMetric.objects.bulk_create(rows, batch_size=5000)


def make_run(
    project: Project, name: str, *, status: str = Run.Status.RUNNING, world_size: int = 2,
    last_seen_at: datetime | None = None, attempts: int = 1, config: dict | None = None,
) -> tuple[Run, list[Attempt]]:
    run = Run.objects.create(
        project=project, name=name, status=status, world_size=world_size,
        last_seen_at=last_seen_at, config=config or {},
    )
    made = [Attempt.objects.create(run=run, number=n) for n in range(1, attempts + 1)]
    return run, made


@pytest.fixture
def now() -> datetime:
    return timezone.now()


@pytest.fixture
def llm_run(projects, now) -> Run:
    """2 ranks, steps 1..200 every 0.5 s ending 5 s ago, 512 tokens per rank-step.

    The recent window is the last 60 s of rows, (t100 - 60, t100] = steps 81..200: 120 rows per
    rank, so 240 rows / 2 ranks / 60 s = 2.0 steps/s and 240 * 512 / 60 = 2048 tokens/s."""
    start = now - timedelta(seconds=105)
    run, attempts = make_run(
        projects["llm"], "llama-8b-pretrain", attempts=2, last_seen_at=now - timedelta(seconds=5),
        config={"lr": 3e-4, "batch_size": 512, "model": "llama-8b"},
    )
    add_steps(
        run, attempts[1], ranks=2, steps=range(1, 201), start=start, every_s=0.5, tokens=512,
        loss=lambda rank, step: 10.0 / step + rank * 0.01,
    )
    return run


@pytest.fixture
def vision_run(projects, now) -> Run:
    run, attempts = make_run(
        projects["vision"], "vit-huge", world_size=1, last_seen_at=now - timedelta(seconds=30)
    )
    add_steps(run, attempts[0], ranks=1, steps=range(1, 11), start=now - timedelta(seconds=40),
              every_s=1.0)
    return run


def realistic_run(project: Project, name: str, now: datetime, *, steps: int = 400,
                  status: str = Run.Status.RUNNING, seed: int = 7) -> Run:
    """Two ranks, a few hundred steps of a decreasing noisy loss, ~1.6 s steps with jitter and one
    slow step, 4096 tokens per rank-step: what a screenshot should show."""
    rng = random.Random(seed)
    run, attempts = make_run(
        project, name, status=status, world_size=2, attempts=2,
        last_seen_at=now - timedelta(seconds=3),
        config={"model": "llama-1b", "lr": 3e-4, "warmup_steps": 100, "global_batch": 256,
                "seq_len": 4096, "optimizer": "adamw", "precision": "bf16"},
    )
    start = now - timedelta(seconds=steps * 1.6 + 3)
    rows = []
    ts = start
    for step in range(1, steps + 1):
        # Ranks step in lockstep (the all-reduce waits for the slowest), so they share the step's
        # end time; each rank's own compute time differs a little.
        step_s = 1.6 + rng.gauss(0, 0.04) + (2.5 if step == steps // 2 else 0.0)  # a checkpoint
        ts += timedelta(seconds=step_s)
        for rank in range(2):
            duration = step_s + rng.gauss(0, 0.015)
            loss = 2.1 + 8.5 * math.exp(-step / 70) + rng.gauss(0, 0.08)
            rows.append(StepMetric(run=run, attempt=attempts[1], rank=rank, step=step, ts=ts,
                                   duration_s=duration, tokens=4096, loss=loss))
    StepMetric.objects.bulk_create(rows)
    return run
