"""The dead-letter list: every batch the broker path refuses is kept with its reason, whatever
the sender put in it, and an admin can read it (read-only) in the Django admin."""

from __future__ import annotations

import pytest
from django.urls import reverse

from collectors.models import RejectedBatch
from collectors.tasks import ingest_batch
from tests.batches import step_batch


def _deep(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {
    "NUL in the batch id": lambda b: b.__setitem__("batch_id", "ab\x00"),
    "NUL in the project": lambda b: b["run"].__setitem__("project", "l\x00m"),
    "lone surrogate in the project": lambda b: b["run"].__setitem__("project", "l\ud800m"),
    "lone surrogate as the batch id": lambda b: b.__setitem__("batch_id", "\ud800"),
    "batch id nested 5000 deep": lambda b: b.__setitem__("batch_id", _deep(5000)),
    # The validator's own error message (repr of the bad value) cannot be built for this one.
    "a step nested 5000 deep": lambda b: b["steps"]["step"].__setitem__(0, _deep(5000)),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_refused_batch_is_still_dead_lettered_with_its_reason(case, token):
    batch = step_batch()
    HOSTILE[case](batch)

    result = ingest_batch(batch, token=token)

    assert "rejected" in result
    [dead] = RejectedBatch.objects.all()
    assert dead.reason == result["rejected"]
    assert "\x00" not in dead.batch_id + dead.project + dead.excerpt
    assert len(dead.excerpt) <= 1000


@pytest.fixture
def dead_letters(db):
    ingest_batch({**step_batch(project="llm"), "v": 2}, token="rw_nope")
    ingest_batch(step_batch(project="vision"), token="rw_unknown")
    return list(RejectedBatch.objects.order_by("pk"))


@pytest.mark.django_db
def test_admin_lists_rejected_batches_with_reason_field_project_and_time(clients, dead_letters):
    page = clients["admin"].get(reverse("admin:collectors_rejectedbatch_changelist"))

    assert page.status_code == 200
    html = page.content.decode()
    assert "unsupported wire format version 2" in html
    assert "not valid or has been revoked" in html
    for dead in dead_letters:
        assert dead.batch_id in html
    # Filters by project and field, and search.
    assert "By project" in html and "By field" in html
    filtered = clients["admin"].get(reverse("admin:collectors_rejectedbatch_changelist"),
                                    {"project": "vision"}).content.decode()
    assert dead_letters[1].batch_id in filtered and dead_letters[0].batch_id not in filtered
    found = clients["admin"].get(reverse("admin:collectors_rejectedbatch_changelist"),
                                 {"q": "revoked"}).content.decode()
    assert dead_letters[1].batch_id in found and dead_letters[0].batch_id not in found


@pytest.mark.django_db
def test_a_rejected_batch_is_read_only_in_the_admin(clients, dead_letters):
    dead = dead_letters[0]
    detail = clients["admin"].get(reverse("admin:collectors_rejectedbatch_change", args=[dead.pk]))

    assert detail.status_code == 200
    html = detail.content.decode()
    assert "unsupported wire format version 2" in html and "excerpt" in html.lower()
    assert 'name="reason"' not in html  # shown, not an input
    assert clients["admin"].get(reverse("admin:collectors_rejectedbatch_add")).status_code == 403
    edited = clients["admin"].post(reverse("admin:collectors_rejectedbatch_change", args=[dead.pk]),
                                   {"reason": "tampered"})
    assert edited.status_code == 403
    dead.refresh_from_db()
    assert dead.reason.startswith("unsupported wire format version 2")


@pytest.mark.django_db
def test_the_dead_letter_list_is_for_staff_only(clients, dead_letters):
    response = clients["member"].get(reverse("admin:collectors_rejectedbatch_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
