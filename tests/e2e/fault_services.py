"""Private servers for the fault and load tests: a PostgreSQL cluster, a redis-server, the ingest
API under gunicorn and Celery workers, each on a free loopback port and each ours to stop, kill and
start again. The shared PostgreSQL and Redis are never touched: a test that stops a server must
own it.

Every child process is started in its own session, so a test can kill a whole worker (its main
process and its pool) the way a node failure or an OOM kill of its container would."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e.conftest import ROOT, wait_for
from trainer_plugin.transports.broker import QUEUE, ZSTD_QUEUE

INITDB = shutil.which("initdb") or "/usr/local/bin/initdb"
PG_CTL = shutil.which("pg_ctl") or "/usr/local/bin/pg_ctl"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
#: Redelivery of what a dead worker had reserved comes after the visibility timeout; a short one
#: keeps the tests short (a redelivered batch is stored once).
INGEST_QUEUES = (QUEUE, ZSTD_QUEUE)
VISIBILITY_TIMEOUT_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _as_postgres_user() -> list[str]:
    # PostgreSQL refuses to run as root; CI containers often are root, a laptop is not.
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class PostgresCluster:
    """initdb into a temporary directory, then pg_ctl start/stop/restart on a free port."""

    def __init__(self):
        # Its own directory under the system temp dir, not pytest's: pytest's is private to
        # this user, and the server may have to run as the postgres user.
        self.directory = Path(tempfile.mkdtemp(prefix="runwatch-faults-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.log = self.directory / "postgres.log"

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        subprocess.run([*_as_postgres_user(), INITDB, "-D", str(self.data), "-U", "postgres",
                        "-A", "trust", "--no-sync", "-E", "UTF8"],
                       check=True, capture_output=True, timeout=120)
        self.start()

    def _pg_ctl(self, *args: str, timeout: float = 120) -> None:
        # fsync stays on: a crash-restart must find every committed batch.
        options = (f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
                   f"-c max_connections=300")
        subprocess.run([*_as_postgres_user(), PG_CTL, "-D", str(self.data), "-o", options,
                        "-l", str(self.log), "-w", "-t", "60", *args],
                       check=True, capture_output=True, timeout=timeout)

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: a clean shutdown that ends the sessions; ``immediate``: a crash (recovery
        from the WAL at the next start)."""
        self._pg_ctl("stop", "-m", mode)

    def running(self) -> bool:
        return port_answers(self.port)

    def connect(self, database: str = "postgres", **kwargs):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                               autocommit=True, **kwargs)

    def create_migrated_database(self, name: str, env: dict[str, str]) -> str:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT,
                       env=dict(env, DATABASE_URL=url), check=True, capture_output=True,
                       timeout=300)
        return url

    def destroy(self) -> None:
        if self.running():
            try:
                self.stop("immediate")
            except subprocess.SubprocessError:
                pass
        shutil.rmtree(self.directory, ignore_errors=True)


class RedisServer:
    """A redis-server with an append-only file fsynced on every write: a broker that acknowledged
    a message must still have it after it stops, or no client could promise anything."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):
        import redis

        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory),
             "--maxclients", "2000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(self.answers, timeout=30, what=f"redis-server on port {self.port}")

    def answers(self) -> bool:
        import redis

        try:
            return bool(self.client().ping())
        except redis.exceptions.RedisError:
            return False

    def stop(self) -> None:
        """SIGTERM: redis fsyncs the append-only file and exits, as in a maintenance stop."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def queue_depth(self, queues: tuple[str, ...] = INGEST_QUEUES) -> int | None:
        try:
            client = self.client()
            return sum(int(client.llen(queue)) for queue in queues)
        except Exception:
            return None


def _stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)


class CeleryWorker:
    """A real collectors worker (prefork pool) on the given broker and database."""

    def __init__(self, env: dict[str, str], log_path: Path, name: str, concurrency: int = 2):
        self.env = env
        self.log_path = log_path
        self.name = name
        self.concurrency = concurrency
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    def start(self) -> None:
        marker = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-Q",
                 "ingest,runwatch", "--concurrency", str(self.concurrency), "--loglevel", "INFO",
                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-n", f"{self.name}-{os.getpid()}@%h"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

        def ready() -> bool:
            with self.log_path.open("rb") as log:
                log.seek(marker)
                return b"ready." in log.read() or self.process.poll() is not None

        wait_for(ready, timeout=90, what=f"Celery worker {self.name} to start")
        if self.process.poll() is not None:
            raise RuntimeError(f"Celery worker exited at start:\n{self.output()}")

    def pool_pids(self) -> list[int]:
        if self.process is None:
            return []
        found = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True,
                               text=True)
        return [int(pid) for pid in found.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL to the main process and its pool at once: the node or container died."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart_if_dead(self) -> bool:
        """What `restart: unless-stopped` does in the production compose file. (Celery 5's
        worker can die of its own while a broker vanishes, cf. celery/kombu#582; that costs a
        restart, not data: what it had reserved is redelivered after the visibility timeout.)"""
        if self.process is not None and self.process.poll() is not None:
            self.restarts += 1
            self.start()
            return True
        return False

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


class IngestServer:
    """The ingest API (dashboard.wsgi) under gunicorn on a fixed free port, so that it can be
    stopped and started again where the plugin expects it."""

    def __init__(self, env: dict[str, str], log_path: Path, workers: int = 2, threads: int = 4):
        self.env = env
        self.log_path = log_path
        self.port = free_port()
        self.workers = workers
        self.threads = threads
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "dashboard.wsgi:application",
                 "--bind", f"127.0.0.1:{self.port}", "--workers", str(self.workers),
                 "--threads", str(self.threads), "--worker-class", "gthread",
                 "--backlog", "2048", "--graceful-timeout", "10", "--timeout", "60",
                 "--error-logfile", "-", "--log-level", "warning"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_for(lambda: port_answers(self.port) or self.process.poll() is not None, timeout=90,
                 what=f"gunicorn on port {self.port}")
        if self.process.poll() is not None:
            raise RuntimeError(f"gunicorn exited at start:\n{self.output()}")

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)
        wait_for(lambda: not port_answers(self.port), timeout=30, what="the ingest API to stop")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def server_env(database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    """Environment for a collectors process (worker, gunicorn, manage.py) on private servers."""
    env = dict(os.environ)
    env.pop("CELERY_TASK_ALWAYS_EAGER", None)
    env.update(DATABASE_URL=database_url, CELERY_BROKER_URL=broker_url, PYTHONUNBUFFERED="1",
               CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT_S),
               # One message reserved per pool process: a killed worker holds as little as can be.
               CELERY_WORKER_PREFETCH_MULTIPLIER="1")
    env.update(extra)
    return env


def create_token(env: dict[str, str], project: str) -> str:
    made = subprocess.run([sys.executable, "manage.py", "createtoken", project], cwd=ROOT,
                          env=env, check=True, capture_output=True, text=True, timeout=120)
    return made.stdout.strip().splitlines()[-1]


def sleep_supervised(seconds: float, *workers: CeleryWorker) -> None:
    """Sleeps, restarting any worker that died meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for worker in workers:
            worker.restart_if_dead()
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


class PrivateStack:
    """A private PostgreSQL cluster with a migrated database, a private redis-server, Celery
    workers on both, an ingest token, and (on request) the ingest API under gunicorn."""

    def __init__(self, directory: Path, *, project: str, workers: int = 1, concurrency: int = 2,
                 **env_extra: str):
        self.directory = directory
        self.project = project
        self.postgres = PostgresCluster()
        self.redis = RedisServer(directory / "redis")
        self.worker_count = workers
        self.concurrency = concurrency
        self.env_extra = env_extra
        self.workers: list[CeleryWorker] = []
        self.ingest: IngestServer | None = None
        self.env: dict[str, str] = {}
        self.database_url = ""
        self.token = ""

    def start(self) -> PrivateStack:
        self.postgres.init()
        self.redis.start()
        self.env = server_env(self.postgres.url("postgres"), self.redis.url, **self.env_extra)
        self.database_url = self.postgres.create_migrated_database("runwatch", self.env)
        self.env["DATABASE_URL"] = self.database_url
        self.token = create_token(self.env, self.project)
        for index in range(self.worker_count):
            worker = CeleryWorker(self.env, self.directory / f"worker{index}.log", f"w{index}",
                                  concurrency=self.concurrency)
            worker.start()
            self.workers.append(worker)
        return self

    def start_ingest(self, **kwargs) -> IngestServer:
        self.ingest = IngestServer(self.env, self.directory / "gunicorn.log", **kwargs)
        self.ingest.start()
        return self.ingest

    def supervise(self) -> None:
        for worker in self.workers:
            worker.restart_if_dead()

    def in_flight(self) -> int:
        """Messages in the ingest queues or reserved by a worker and not yet acknowledged."""
        client = self.redis.client()
        return (sum(int(client.llen(queue)) for queue in INGEST_QUEUES)
                + int(client.hlen("unacked")))

    def stop(self) -> None:
        if self.ingest is not None:
            self.ingest.stop()
        for worker in self.workers:
            worker.stop()
        self.redis.kill()
        self.postgres.destroy()
