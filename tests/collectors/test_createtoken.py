from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from collectors.models import IngestToken, Project


def createtoken(*args) -> str:
    out = StringIO()
    call_command("createtoken", *args, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


def test_prints_a_working_token_once_and_keeps_only_its_hash(db):
    plain = createtoken("llm", "--name", "cluster-a")

    assert plain.startswith("rw_") and len(plain) > 40
    stored = IngestToken.objects.get()
    assert stored.project.slug == "llm" and stored.name == "cluster-a"
    assert plain not in (stored.hashed, stored.prefix)
    assert IngestToken.objects.authenticate(plain) == stored


def test_second_token_for_the_same_project_reuses_the_project(db):
    first, second = createtoken("llm"), createtoken("llm")

    assert first != second
    assert Project.objects.count() == 1
    assert IngestToken.objects.count() == 2


def test_member_gets_access_to_the_project(db):
    user = get_user_model().objects.create_user("ada", password="x" * 12)

    createtoken("llm", "--member", "ada")

    assert Project.objects.get(slug="llm").visible_to(user)


def test_unknown_member_is_a_clear_error_and_creates_nothing(db):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        createtoken("llm", "--member", "ghost")
    assert not Project.objects.exists()


def test_bad_project_slug_is_refused(db):
    with pytest.raises(CommandError, match="must be a slug"):
        createtoken("my project!")
    assert not Project.objects.exists()
