"""`make demo`: the dashboard on http://127.0.0.1:8000 with a two-rank training job streaming to it.

Embedded mode (SQLite under var/, Celery tasks in-process), so nothing has to be installed beyond
the virtual environment. Steps: migrate, collectstatic, (re)create the `demo` superuser with a fresh
random password, make an ingest token for project `demo`, start the dashboard, wait until it
answers, then run `torchrun --standalone --nproc_per_node=2 examples/train_tiny.py` against it.
When training ends the dashboard stays up; Ctrl-C stops everything.

    python scripts/demo.py [--port 8000] [--steps 2000] [--nproc 2]
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SERVER_LOG = ROOT / "var" / "demo-server.log"
CLUSTER_LOG = ROOT / "var" / "demo-cluster.log"
#: The simulated cluster beside the real job: 32 GPUs on 4 hosts, a 12-hour run of which the first
#: 3 hours are history (stored at once, so the cluster pages have a day/night curve, power swings
#: and GPU heat to show) and the rest streams live. Two planted interruptions over the 12 hours.
CLUSTER_ARGS = ("--gpus", "32", "--days", "0.5", "--history", "3", "--interruptions", "2")
DEMO_USER = "demo"
DEMO_PROJECT = "demo"

# Set or reset by `manage.py shell`; the password travels in the environment, not on a command line.
_SET_DEMO_USER = """
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username=os.environ["RUNWATCH_DEMO_USER"])
user.is_active = user.is_staff = user.is_superuser = True
user.set_password(os.environ["RUNWATCH_DEMO_PASSWORD"])
user.save()
"""


class DemoError(Exception):
    """Something the newcomer has to fix; the message says what."""


def embedded_env() -> dict[str, str]:
    env = dict(os.environ)
    # The demo is the embedded mode whatever the shell says: SQLite under var/, tasks in-process.
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_TASK_ALWAYS_EAGER"):
        env.pop(name, None)
    env["PYTHONUNBUFFERED"] = "1"
    env["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    # torch warns on import when NumPy is absent; this CPU demo does not need it.
    env["PYTHONWARNINGS"] = "ignore:Failed to initialize NumPy"
    return env


def manage(env: dict[str, str], *args: str, capture: bool = False) -> str:
    result = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C reaches this script only; it stops children itself
    )
    if result.returncode != 0:
        raise DemoError(
            f"`manage.py {' '.join(args)}` failed (exit {result.returncode}):\n"
            + (result.stderr or "").strip()
        )
    return result.stdout or ""


def ensure_port_free(port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DemoError(
                f"port {port} on 127.0.0.1 is taken ({exc.strerror}): stop what runs there, "
                f"or use another port: python scripts/demo.py --port {port + 1}"
            ) from None


def wait_until_answering(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise DemoError(
                f"the dashboard exited (code {server.returncode}) before answering; "
                f"its log:\n{tail(SERVER_LOG)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.3)
    raise DemoError(f"the dashboard did not answer at {url} within {timeout_s:.0f}s; see {SERVER_LOG}")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


def forward_output(process: subprocess.Popen, forwarding: threading.Event) -> None:
    """Copy the training job's output to the terminal until shutdown starts; after that, what the
    launcher says about its workers being signalled is noise, not news."""
    assert process.stdout is not None
    for line in process.stdout:
        if forwarding.is_set():
            sys.stdout.write(line)
            sys.stdout.flush()


def stop(process: subprocess.Popen | None, sig: int, grace_s: float, *, group: bool) -> None:
    """Signal, wait, then kill: no orphan survives the demo."""
    if process is None or process.poll() is not None:
        return
    send = (lambda s: os.killpg(process.pid, s)) if group else process.send_signal
    try:
        send(sig)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def gunicorn_quiet_flags() -> list[str]:
    """Newer gunicorn opens a control socket under ~/.gunicorn, shared by every gunicorn of the
    user; the demo has no use for it and must not collide with another server on the machine."""
    import gunicorn.config

    return ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []


def descendants(pid: int) -> list[int]:
    """Process ids below `pid`, read from /proc (Linux); empty where there is no /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name may hold spaces and parentheses: the parent id follows the last ')'.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start_simulated_cluster(env: dict[str, str], run_name: str, log_path: Path = CLUSTER_LOG,
                            args: tuple[str, ...] = CLUSTER_ARGS) -> subprocess.Popen:
    """`manage.py simulate --live` in the background, in the demo project. It stops cleanly on
    SIGINT (its ranks send their finish events), which is how run_demo's clean-up ends it."""
    log_path.parent.mkdir(exist_ok=True)
    with log_path.open("w") as log:
        return subprocess.Popen(
            [PYTHON, "manage.py", "simulate", "--live", *args, "--project", DEMO_PROJECT,
             "--run-name", run_name, "--no-progress"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this script only; it stops children itself
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Runwatch demo: dashboard + a 2-rank CPU job.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "8000")))
    parser.add_argument("--nproc", type=int, default=2, help="training ranks")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--no-cluster", action="store_true",
                        help="no simulated 32-GPU cluster beside the real job")
    return parser.parse_args(argv)


def run_demo(args: argparse.Namespace) -> int:
    env = embedded_env()
    base_url = f"http://127.0.0.1:{args.port}"
    ensure_port_free(args.port)

    print("demo: preparing the database (SQLite under var/) and static files ...", flush=True)
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "collectstatic", "--noinput", "-v", "0")
    password = secrets.token_urlsafe(12)
    manage(
        env | {"RUNWATCH_DEMO_USER": DEMO_USER, "RUNWATCH_DEMO_PASSWORD": password},
        "shell",
        "-c",
        _SET_DEMO_USER,
    )
    token = manage(env, "createtoken", DEMO_PROJECT, "--member", DEMO_USER, capture=True).strip()
    if not token.startswith("rw_"):
        raise DemoError(f"`manage.py createtoken` printed {token!r}, not a token (rw_...)")

    server = training = cluster = None
    forwarding = threading.Event()
    try:
        SERVER_LOG.parent.mkdir(exist_ok=True)
        with SERVER_LOG.open("w") as server_log:
            # One process, four threads: in embedded mode the ingest task runs inside the request,
            # and one writer process is what SQLite likes best.
            server = subprocess.Popen(
                [PYTHON, "-m", "gunicorn", "dashboard.wsgi", "--bind", f"127.0.0.1:{args.port}",
                 "--workers", "1", "--threads", "4", "--graceful-timeout", "5",
                 *gunicorn_quiet_flags()],
                cwd=ROOT,
                env=env,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_until_answering(f"{base_url}/login/", server, timeout_s=60)

        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_name = f"tiny-char-lm-{stamp}"
        cluster_name = f"sim-cluster-{stamp}"
        if not args.no_cluster:
            # Beside the real job, in the background: the dashboard is usable before it is done.
            cluster = start_simulated_cluster(env, cluster_name)
        print(
            f"\n  Runwatch dashboard: {base_url}\n"
            f"  user:     {DEMO_USER}\n"
            f"  password: {password}\n"
            f"  project {DEMO_PROJECT}, run {run_name}: {args.nproc} ranks training now.\n"
            f"  your own script: RUNWATCH_URL={base_url} RUNWATCH_TOKEN={token} "
            f"RUNWATCH_PROJECT={DEMO_PROJECT} python train.py\n"
            + (f"  and run {cluster_name}: a simulated 32-GPU cluster, 3 hours of history, "
               f"then live (log: {CLUSTER_LOG.relative_to(ROOT)}).\n" if cluster else "")
            + f"  (server log: {SERVER_LOG.relative_to(ROOT)}; Ctrl-C stops everything)\n",
            flush=True,
        )

        forwarding.set()
        training = subprocess.Popen(
            [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
             "examples/train_tiny.py", "--project", DEMO_PROJECT, "--run-name", run_name,
             "--steps", str(args.steps)],
            cwd=ROOT,
            env=env | {
                "RUNWATCH_URL": base_url,
                "RUNWATCH_TOKEN": token,
                "RUNWATCH_PROJECT": DEMO_PROJECT,
                # A laptop has no NVIDIA GPU: the simulated sensor (marked simulated in the data)
                # streams GPU telemetry beside the real steps. Unset it on a GPU machine.
                "RUNWATCH_GPU_SAMPLING": env.get("RUNWATCH_GPU_SAMPLING", "simulated"),
                "OMP_NUM_THREADS": "1",  # the example sets one thread per rank; say so up front
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        reader = threading.Thread(target=forward_output, args=(training, forwarding), daemon=True)
        reader.start()
        code = training.wait()
        reader.join(timeout=5)
        verdict = "finished" if code == 0 else f"stopped with exit code {code}"
        print(
            f"\ndemo: training {verdict}. The dashboard stays up at {base_url} "
            f"(user {DEMO_USER}, password {password}); Ctrl-C to stop it.",
            flush=True,
        )
        while server.poll() is None:
            time.sleep(0.5)
        print(f"demo: the dashboard exited (code {server.returncode}); see {SERVER_LOG}")
        return 1
    finally:
        # Ctrl-C lands here. Another Ctrl-C must not interrupt the clean-up half way.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        forwarding.clear()
        if training is not None and training.poll() is None:
            print("\ndemo: stopping training ...", flush=True)
        # SIGINT to the launcher only: it passes it on to each rank once, and the ranks leave
        # quietly after their Monitor has sent what it holds, to a server that is still up.
        ranks = descendants(training.pid) if training is not None else []
        stop(training, signal.SIGINT, grace_s=30, group=False)
        for pid in ranks:  # a rank the launcher left behind (each runs in a session of its own)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # SIGINT: the simulator sends its ranks' finish events, so the cluster's run ends finished.
        stop(cluster, signal.SIGINT, grace_s=15, group=False)
        if server is not None and server.poll() is None:
            print("demo: stopping the dashboard ...", flush=True)
        stop(server, signal.SIGTERM, grace_s=10, group=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (a CI runner, `kill`) takes the same clean way out as Ctrl-C; SIGINT is set again
    # because a shell without job control starts background commands with it ignored.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run_demo(args)
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C is how the demo is meant to end, not a failure for make to report.
        print("demo: stopped.")
        return 0


if __name__ == "__main__":
    sys.exit(main())
