"""Shared fixtures. The suite runs against the real PostgreSQL and Redis named by DATABASE_URL and
CELERY_BROKER_URL (`make test` sets both); it refuses to run on SQLite rather than pass on a
stand-in."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.e2e import conftest as e2e


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


@pytest.fixture
def ingest_queue(broker_url):
    """The broker's `ingest` queue, emptied before and after the test. kombu's Redis transport
    keeps a queue's messages in a list of the same name."""
    import redis

    client = redis.Redis.from_url(broker_url)
    client.delete("ingest")
    yield IngestQueue(client)
    client.delete("ingest")


class IngestQueue:
    def __init__(self, client):
        self.client = client

    def __len__(self) -> int:
        return self.client.llen("ingest")

    def messages(self) -> list[dict]:
        import base64
        import json

        from kombu.compression import decompress

        found = []
        for raw in self.client.lrange("ingest", 0, -1):
            envelope = json.loads(raw)
            body = base64.b64decode(envelope["body"])
            if "compression" in envelope["headers"]:  # what ingest messages carry
                body = decompress(body, envelope["headers"]["compression"])
            body = json.loads(body)
            found.append({"task": envelope["headers"]["task"], "args": body[0], "kwargs": body[1]})
        return found


# The end-to-end Celery worker lives here, at the root, so the whole session has exactly one: a
# suite that imported the fixture into its own conftest got a second worker consuming the same
# queues, and tests that watch one worker's log missed the messages the other one took.


@pytest.fixture(scope="session")
def worker_env(django_db_setup, broker_url_session) -> dict[str, str]:
    """Environment that points a child process at the test database and the test broker."""
    settings = connection.settings_dict
    url = (f"postgres://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:"
           f"{settings['PORT'] or 5432}/{settings['NAME']}")
    env = dict(os.environ)
    env.update(DATABASE_URL=url, CELERY_BROKER_URL=broker_url_session, PYTHONUNBUFFERED="1")
    env.pop("CELERY_TASK_ALWAYS_EAGER", None)
    return env


@pytest.fixture(scope="session")
def broker_url_session() -> str:
    return os.environ["CELERY_BROKER_URL"]


@pytest.fixture(scope="session")
def celery_worker_process(worker_env, tmp_path_factory, broker_url_session):
    import redis

    redis.Redis.from_url(broker_url_session).delete("ingest", "runwatch")
    worker = e2e.WorkerProcess(worker_env, tmp_path_factory.mktemp("worker") / "worker.log")
    worker.start()
    yield worker
    # Stopped before django_db_setup's teardown drops the database it holds connections to.
    worker.stop()


@pytest.fixture
def private_broker_url(tmp_path) -> Iterator[str]:
    """A redis-server of this test's own, for tests that read or count what reaches the broker:
    in a whole-suite run the end-to-end tests' Celery worker consumes the shared broker's queues
    and would take the messages."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=1)

    def up() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {server.returncode}")
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False

    try:
        e2e.wait_for(up, timeout=30, what="the private redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.kill()
        server.wait()
