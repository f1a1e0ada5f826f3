from __future__ import annotations

# The real Celery worker (and the environment that points child processes at the test database)
# of the end-to-end tests, for the simulator's --via-broker and --live tests.
from tests.e2e.conftest import broker_url_session, celery_worker_process, worker_env  # noqa: F401
