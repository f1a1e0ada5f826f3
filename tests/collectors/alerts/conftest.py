"""Loopback stand-ins for the outside world: a real SMTP server (aiosmtpd) and an HTTP server
playing Slack's incoming webhook, both on 127.0.0.1 inside the test."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from collectors.alerts.models import AlertRule, Channel


class Inbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content,
                                                                     policy=policy.default)))
        return "250 OK"


@pytest.fixture
def smtp_server(settings) -> Iterator[Inbox]:
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS, settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = False, "", ""
    try:
        yield inbox
    finally:
        controller.stop()


class Hook:
    """What the webhook stand-in received; ``status`` is what it answers."""

    def __init__(self):
        self.requests: list[dict] = []
        self.status = 200
        self.url = ""


@pytest.fixture
def webhook_server() -> Iterator[Hook]:
    hook = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            hook.requests.append({"path": self.path, "json": json.loads(body),
                                  "content_type": self.headers["Content-Type"]})
            self.send_response(hook.status)
            self.end_headers()
            self.wfile.write(b"ok" if hook.status == 200 else b"no_service")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_port}/services/T000/B000/abcdefghijklmnopqrstWXYZ"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_port_url() -> str:
    # Bound then closed: nothing listens there, so a connection is refused at once.
    return f"http://127.0.0.1:{free_port()}/services/T000/B000/downdowndowndown"


@pytest.fixture
def public_url(settings) -> str:
    settings.RUNWATCH_PUBLIC_URL = "https://runwatch.example.org"
    return settings.RUNWATCH_PUBLIC_URL


@pytest.fixture
def eager(monkeypatch):
    from dashboard.celery import app

    monkeypatch.setitem(app.conf, "task_always_eager", True)


def make_rule(project, kind: str, channels=(), **parameters) -> AlertRule:
    categories = parameters.pop("categories", [])
    cooldown = parameters.pop("cooldown_minutes", 30)
    rule = AlertRule.objects.create(project=project, name=f"{kind} rule", kind=kind,
                                    parameters=parameters, categories=categories,
                                    cooldown_minutes=cooldown)
    rule.full_clean()
    rule.channels.set(channels)
    return rule


def slack_channel(project, url: str) -> Channel:
    return Channel.objects.create(project=project, kind="slack", name="on-call slack",
                                  config={"url": url})


def email_channel(project) -> Channel:
    return Channel.objects.create(project=project, kind="email", name="on-call email",
                                  config={"recipients": ["oncall@example.org"]})
