"""Production configuration: `manage.py check --deploy` is clean with the documented production
environment (and flags the embedded defaults), and the server image runs as a non-root user."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _check_deploy(**overrides: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SECURE_", "SESSION_", "CSRF_", "RUNWATCH_HTTPS", "DEBUG",
                                  "SECRET_KEY", "ALLOWED_HOSTS"))
           # The browser tests set this for Playwright in the test process; a deployment never has it.
           and key != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(overrides)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "runwatch.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://runwatch.example.com",
    "RUNWATCH_HTTPS": "true",
}


def test_check_deploy_is_clean_with_the_production_environment():
    result = _check_deploy(**PRODUCTION)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_flags_the_embedded_defaults():
    result = _check_deploy()

    assert result.returncode != 0
    flagged = set(re.findall(r"security\.W\d+", result.stdout + result.stderr))
    # HSTS, SSL redirect, weak SECRET_KEY, insecure session and CSRF cookies.
    assert {"security.W004", "security.W008", "security.W009", "security.W012",
            "security.W016"} <= flagged


@pytest.mark.parametrize(("setting", "warning"), [
    ("SECURE_SSL_REDIRECT", "security.W008"),
    ("SESSION_COOKIE_SECURE", "security.W012"),
    ("SECURE_HSTS_PRELOAD", "security.W021"),
    ("DEBUG", "security.W018"),
])
def test_each_hardening_setting_can_be_changed_from_the_environment(setting, warning):
    value = "true" if setting == "DEBUG" else "false"
    result = _check_deploy(**{**PRODUCTION, setting: value})

    assert warning in result.stdout + result.stderr


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_the_server_image_runs_as_a_non_root_user():
    instructions = _dockerfile_instructions()
    users = [(i, arg.strip()) for i, (op, arg) in enumerate(instructions) if op.upper() == "USER"]
    assert users, "the Dockerfile never switches away from root"
    last_user_at, user = users[-1]
    assert user.split(":")[0] not in ("root", "0")
    # Nothing after it runs as root again, and the command itself comes after it.
    later_ops = [op.upper() for op, _ in instructions[last_user_at + 1:]]
    assert "RUN" not in later_ops
    cmd_at = max(i for i, (op, _) in enumerate(instructions) if op.upper() in ("CMD", "ENTRYPOINT"))
    assert cmd_at > last_user_at
    # The one directory it writes (var/: beat's schedule, the embedded database) is its own.
    assert any(op.upper() == "RUN" and f"chown {user}" in arg for op, arg in instructions)


def test_compose_runs_every_runwatch_service_from_that_image_without_root():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    ours = {name: service for name, service in compose["services"].items()
            if service.get("image", "").startswith("runwatch")}
    assert set(ours) >= {"web", "worker", "beat"}
    for name, service in ours.items():
        assert service.get("build") in (".", {"context": "."}), name
        assert str(service.get("user", "")).split(":")[0] not in ("root", "0"), name
        assert not service.get("privileged"), name
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            # Published on loopback only: the TLS proxy is the way in (Redis: not at all).
            assert str(port).startswith("127.0.0.1:"), (name, port)
