from __future__ import annotations

import pytest

from collectors.models import IngestToken, Project


@pytest.fixture
def project(db) -> Project:
    return Project.objects.create(slug="llm", name="LLM pretraining")


@pytest.fixture
def token(project) -> str:
    return IngestToken.issue(project, name="cluster-a")[1]


@pytest.fixture
def other_token(db) -> str:
    other = Project.objects.create(slug="vision")
    return IngestToken.issue(other)[1]
