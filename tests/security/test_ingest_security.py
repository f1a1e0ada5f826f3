"""Who may write, how much, and how tokens are checked: one project's token cannot write into
another's runs (over HTTP or through the broker), unknown and wrong-project tokens cost the same
single lookup and the hash is compared in constant time, bodies are size-limited however their
length is declared, and ingest is rate-limited per token with a 429 the plugin retries."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from collectors import models as collector_models
from collectors import ratelimit
from collectors.ingest import Refused, authorize
from collectors.models import IngestToken, Project, RejectedBatch, Run, StepMetric
from collectors.tasks import ingest_batch
from tests.batches import step_batch
from tests.reliability_report import record
from trainer_plugin import Monitor
from trainer_plugin.protocol import MAX_BATCH_BYTES

URL = "/api/v1/ingest"


def _post(client, batch, token, **headers):
    return client.post(URL, data=json.dumps(batch).encode(), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}", **headers)


@pytest.fixture
def eager():
    conf = ingest_batch.app.conf
    before = conf.task_always_eager
    conf.task_always_eager = True
    yield
    conf.task_always_eager = before


@pytest.mark.django_db
def test_a_token_of_one_project_cannot_write_into_another(client, token, other_token, eager):
    """`token` belongs to llm, `other_token` to vision: every attempt of vision's token on llm is
    refused, over HTTP (403) and on the broker path (dead-lettered), and llm gets no row."""
    sent = 20
    answers = [_post(client, step_batch(project="llm", run="target"), other_token).status_code
               for _ in range(sent // 2)]
    results = [ingest_batch(step_batch(project="llm", run="target"), token=other_token)
               for _ in range(sent // 2)]

    assert answers == [403] * (sent // 2)
    assert all("cannot write into project 'llm'" in r["rejected"] for r in results)
    assert not Run.objects.filter(project__slug="llm").exists()
    assert StepMetric.objects.count() == 0
    assert RejectedBatch.objects.filter(field="token").count() == sent // 2
    # The same token still writes into its own project.
    assert _post(client, step_batch(project="vision"), other_token).status_code == 202
    record("cross-project-token", fault="token of project A writes into project B",
           action=f"{sent} batches for B with A's token ({sent // 2} over HTTP: 403; "
                  f"{sent // 2} on the broker path: dead-lettered); stored in B: 0",
           sent=0, stored=0, unit="rows into B")


@pytest.mark.django_db
def test_unknown_and_wrong_project_tokens_cost_the_same_single_lookup(token, other_token):
    """No early exit that would time differently: both refusals are one indexed query by the
    token's hash (which reveals nothing about the token) and nothing else."""
    for presented, status in (("rw_" + "x" * 43, 401), (other_token, 403)):
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(Refused) as refused:
                authorize(presented, "llm")
        assert refused.value.status == status
        assert len(queries) == 1, [q["sql"] for q in queries]
        assert '"hashed" =' in queries[0]["sql"]


@pytest.mark.django_db
def test_the_token_hash_is_compared_in_constant_time(token, monkeypatch):
    compared = []
    real = collector_models.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(collector_models.hmac, "compare_digest", spy)

    assert IngestToken.objects.authenticate(token) is not None
    assert compared == [(collector_models.hash_token(token),) * 2]


@pytest.mark.django_db
def test_a_revoked_token_writes_nothing(client, token, eager):
    from django.utils import timezone

    IngestToken.objects.update(revoked_at=timezone.now())

    response = _post(client, step_batch(), token)

    assert response.status_code == 401
    assert StepMetric.objects.count() == 0


@pytest.mark.django_db
def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(client, token,
                                                                          ingest_queue):
    response = client.post(URL, data=b"{}", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}",
                           CONTENT_LENGTH=str(MAX_BATCH_BYTES + 1))

    assert response.status_code == 413
    assert "send smaller batches" in response.json()["error"]
    assert len(ingest_queue) == 0


@pytest.mark.django_db(transaction=True)
def test_a_body_without_a_declared_length_cannot_get_past_the_limit(live_server, eager):
    """Chunked, with no Content-Length: Django reads no more than was declared (nothing), so a
    body of any size is never parsed; the sender gets a 400, the database nothing."""
    _, plain = IngestToken.issue(Project.objects.create(slug="llm"))
    address = urlsplit(live_server.url)
    connection_ = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    chunk = b" " * (1024 * 1024)
    connection_.putrequest("POST", URL)
    connection_.putheader("Authorization", f"Bearer {plain}")
    connection_.putheader("Content-Type", "application/json")
    connection_.putheader("Transfer-Encoding", "chunked")
    connection_.endheaders()
    try:
        for _ in range(20):  # 20 MB, over the 16 MB limit
            connection_.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        connection_.send(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed before reading it all: also a refusal
    response = connection_.getresponse()

    assert 400 <= response.status < 500
    assert StepMetric.objects.count() == 0


# --- rate limit --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_over_the_rate_limit_a_token_gets_429_with_retry_after_and_nothing_is_queued(
        client, token, other_token, ingest_queue, settings):
    settings.RUNWATCH_INGEST_RATE_LIMIT = "3/60"

    answers = [_post(client, step_batch(), token) for _ in range(4)]

    assert [a.status_code for a in answers] == [202, 202, 202, 429]
    throttled = answers[-1]
    assert 1 <= int(throttled["Retry-After"]) <= 60
    assert "too many batches" in throttled.json()["error"]
    assert len(ingest_queue) == 3
    # Counted per token: another project's sender is not slowed by this one.
    assert _post(client, step_batch(project="vision"), other_token).status_code == 202


@pytest.mark.django_db
def test_the_default_limit_never_throttles_a_200_rank_job(settings):
    """200 ranks at one batch per second each, for 10 s, counted in the real Redis."""
    settings.RUNWATCH_INGEST_RATE_LIMIT = "6000/10"
    _, plain = IngestToken.issue(Project.objects.create(slug="big-job"))
    waits = [ratelimit.retry_after(plain) for _second in range(10) for _rank in range(200)]
    assert waits == [None] * 2000
    limit = ratelimit.parse(settings.RUNWATCH_INGEST_RATE_LIMIT)
    assert limit.batches / limit.window_s >= 3 * 200


def test_the_limit_setting_is_checked():
    assert ratelimit.parse("off") is None
    assert ratelimit.parse("100/5") == ratelimit.RateLimit(100, 5)
    with pytest.raises(Exception, match="BATCHES/SECONDS"):
        ratelimit.parse("fast")


@pytest.mark.django_db(transaction=True)
def test_the_plugin_keeps_a_throttled_batch_and_sends_it_after_retry_after(
        live_server, eager, settings, tmp_path):
    settings.RUNWATCH_INGEST_RATE_LIMIT = "1/3"
    _, plain = IngestToken.issue(Project.objects.create(slug="llm"))
    ratelimit.retry_after(plain)  # this window's one batch is spent: the first send is throttled
    monitor = Monitor("llm", "throttled", url=live_server.url, token=plain, flush_interval_s=0.05,
                      spool_dir=tmp_path, capture_signals=False, gpu_sampling=False)
    for step in range(40):
        monitor.step(step, loss=1.0 / (step + 1))
        time.sleep(0.04)
    delivered = monitor.close(timeout_s=60)

    assert delivered
    assert monitor.stats["send_errors"] >= 1  # it was throttled at least once
    assert monitor.stats["rows_dropped"] == 0
    steps = sorted(StepMetric.objects.filter(run__name="throttled").values_list("step", flat=True))
    assert steps == list(range(40))
    record("rate-limited-sender", fault="ingest rate limit (429) hit by a real plugin",
           action=f"RUNWATCH_INGEST_RATE_LIMIT=1/3, 40 steps in batches every 50 ms; "
                  f"{monitor.stats['send_errors']} answers were 429, each batch kept and resent "
                  "after Retry-After",
           sent=40, stored=len(steps), duplicated=len(steps) - len(set(steps)))


@pytest.mark.django_db
def test_an_unknown_token_is_refused_before_the_body_is_read(client, token, ingest_queue):
    """A body that is not even JSON: with a good token it is a 400 (it was parsed), with an unknown
    token a 401 (it never was), so strangers cannot make the collector parse 16 MiB bodies."""
    body = b"{not json" + b" " * 1_000_000
    headers = {"content_type": "application/json"}

    known = client.post(URL, data=body, HTTP_AUTHORIZATION=f"Bearer {token}", **headers)
    unknown = client.post(URL, data=body, HTTP_AUTHORIZATION="Bearer rw_" + "z" * 43, **headers)

    assert known.status_code == 400
    assert unknown.status_code == 401
    assert unknown["WWW-Authenticate"] == "Bearer"
    assert "not valid or has been revoked" in unknown.json()["error"]
    assert len(ingest_queue) == 0
