"""A run's Failures page (ETTR, badput, root causes, interruptions with a re-label control) and
its Checkpoints page. Numbers come from dashboard.views.failure_presenters."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from collectors.models import Category, Interruption
from dashboard.views import failure_presenters
from dashboard.views.access import get_run_for_user

EXPECTED_CHOICES = {"": None, "yes": True, "no": False}


@login_required
@require_GET
def run_failures(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    context = failure_presenters.failures_context(run, request.GET, timezone.now())
    return render(request, "dashboard/run_failures.html", {"run": run, "tab": "failures", **context})


@login_required
@require_GET
def run_checkpoints(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    context = failure_presenters.checkpoints_context(run)
    return render(request, "dashboard/run_checkpoints.html",
                  {"run": run, "tab": "checkpoints", **context})


@login_required
@require_POST
def label_interruption(request: HttpRequest, run_id: int, interruption_id: int) -> HttpResponse:
    """Stores an engineer's category and expected/unexpected for one interruption; both empty
    means "as classified". The label wins in every statistic."""
    run = get_run_for_user(request, run_id)
    interruption = get_object_or_404(Interruption, pk=interruption_id, run=run)
    category = request.POST.get("category", "")
    expected = request.POST.get("expected", "")
    if category and category not in Category.values:
        return HttpResponseBadRequest(
            f"Unknown category {category!r}: choose one of {', '.join(Category.values)}.")
    if expected not in EXPECTED_CHOICES:
        return HttpResponseBadRequest("Expected must be 'yes', 'no' or empty (as classified).")
    interruption.label_category = category
    interruption.label_expected = EXPECTED_CHOICES[expected]
    if category or expected:
        interruption.labelled_by, interruption.labelled_at = request.user, timezone.now()
    else:
        interruption.labelled_by, interruption.labelled_at = None, None
    interruption.save(update_fields=["label_category", "label_expected", "labelled_by",
                                     "labelled_at"])
    back = request.POST.get("next", "")
    if not back or not url_has_allowed_host_and_scheme(back, {request.get_host()},
                                                       require_https=request.is_secure()):
        back = reverse("run_failures", args=[run.pk])
    return redirect(f"{back.split('#')[0]}#interruption-{interruption.pk}")
