"""Fixtures of the security and bad-input tests: the collectors' project and tokens, the dashboard's
personas, shared from their own suites (the end-to-end Celery worker comes from tests/conftest.py)."""

from __future__ import annotations

from tests.collectors.conftest import other_token, project, token  # noqa: F401
from tests.dashboard.conftest import (  # noqa: F401
    clients,
    fast_password_hashing,
    llm_run,
    now,
    projects,
    users,
    vision_run,
)
