"""Who may see what: a user sees the runs of the projects they are a member of; superusers see
all. Every view goes through these helpers, so access is decided in one place."""

from __future__ import annotations

from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404

from collectors.models import Run


def visible_runs(user):
    runs = Run.objects.all()
    if user.is_superuser:
        return runs
    return runs.filter(project__members=user)


def get_run_for_user(request: HttpRequest, run_id: int) -> Run:
    """The run, if the signed-in user may see it. Another project's run is a 404, not a 403:
    the answer must not tell an outsider which run ids exist."""
    run = get_object_or_404(Run.objects.select_related("project"), pk=run_id)
    if not run.project.visible_to(request.user):
        raise Http404("No run with that id in your projects.")
    return run
