"""The runs list and the live run page, each with the JSON endpoint its page polls."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET

from dashboard.views import presenters
from dashboard.views.access import get_run_for_user, visible_runs


@login_required
@require_GET
def runs_list(request: HttpRequest) -> HttpResponse:
    rows = presenters.runs_rows(visible_runs(request.user), timezone.now())
    return render(
        request,
        "dashboard/runs.html",
        {"rows": rows, "refresh_ms": settings.RUNWATCH_REFRESH_MS},
    )


@login_required
@require_GET
def runs_json(request: HttpRequest) -> JsonResponse:
    rows = presenters.runs_rows(visible_runs(request.user), timezone.now())
    # The rows come rendered by the same template as the page, so the refresh cannot drift
    # from the first paint; the structured rows are there for scripts.
    html = render_to_string("dashboard/_run_rows.html", {"rows": rows}, request=request)
    return JsonResponse({"runs": rows, "rows_html": html})


@login_required
@require_GET
def run_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    series = presenters.run_series(run, timezone.now())
    return render(
        request,
        "dashboard/run.html",
        {
            "run": run,
            "header": series["run"],
            "config_json": json.dumps(run.config, indent=2, sort_keys=True),
            "series": series,
            "refresh_ms": settings.RUNWATCH_REFRESH_MS,
        },
    )


@login_required
@require_GET
def run_series(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_run_for_user(request, run_id)
    return JsonResponse(presenters.run_series(run, timezone.now()))
