"""Shared fixtures. The suite runs against the real PostgreSQL and Redis named by DATABASE_URL and
CELERY_BROKER_URL (`make test` sets both); it refuses to run on SQLite rather than pass on a
stand-in."""

from __future__ import annotations

import os

import pytest
from django.conf import settings


def pytest_configure(config):
    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine:
        pytest.exit(
            "the test suite needs PostgreSQL: run `make test`, or set "
            "DATABASE_URL=postgres://postgres@127.0.0.1:5432/runwatch",
            returncode=3,
        )
    if not os.environ.get("CELERY_BROKER_URL", "").startswith("redis://"):
        pytest.exit(
            "the test suite needs Redis: run `make test`, or set "
            "CELERY_BROKER_URL=redis://127.0.0.1:6379/14",
            returncode=3,
        )


@pytest.fixture
def broker_url() -> str:
    return os.environ["CELERY_BROKER_URL"]
