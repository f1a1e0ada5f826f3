"""The runs list and the live run page, each with the JSON endpoint its page polls."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET

from collectors.models import Run
from dashboard.views import presenters
from dashboard.views.access import get_run_for_user, visible_runs

# The list shows the most recently active runs; older ones stay a click away on their pages. Each
# run shown costs a few index probes per partition of the step table, so this bounds the list's
# cost however many runs (sweeps, restarts under new names) a project piles up.
RUNS_LIST_LIMIT = 200


def _recent_runs(user) -> tuple[QuerySet[Run], int]:
    runs = visible_runs(user)
    total = runs.count()
    newest = (runs.order_by(F("last_seen_at").desc(nulls_last=True), "-created_at", "-id")
              .values_list("pk", flat=True)[:RUNS_LIST_LIMIT])
    return Run.objects.filter(pk__in=list(newest)), total


@login_required
@require_GET
def runs_list(request: HttpRequest) -> HttpResponse:
    runs, total = _recent_runs(request.user)
    rows = presenters.runs_rows(runs, timezone.now())
    return render(
        request,
        "dashboard/runs.html",
        {"rows": rows, "total": total, "refresh_ms": settings.RUNWATCH_REFRESH_MS},
    )


@login_required
@require_GET
def runs_json(request: HttpRequest) -> JsonResponse:
    runs, total = _recent_runs(request.user)
    rows = presenters.runs_rows(runs, timezone.now())
    # The rows come rendered by the same template as the page, so the refresh cannot drift
    # from the first paint; the structured rows are there for scripts.
    html = render_to_string("dashboard/_run_rows.html", {"rows": rows}, request=request)
    return JsonResponse({"runs": rows, "total": total, "rows_html": html})


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
def run_series(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's figures; ``?since=&until=`` (Unix seconds) narrows them to a time window,
    which the page asks for when the throughput chart is zoomed."""
    run = get_run_for_user(request, run_id)
    try:
        window = _window(request.GET)
    except ValueError as error:
        return HttpResponseBadRequest(str(error))
    return JsonResponse(presenters.run_series(run, timezone.now(), window))


def _window(params) -> tuple[datetime, datetime] | None:
    since, until = params.get("since"), params.get("until")
    if since is None and until is None:
        return None
    try:
        bounds = [float(value) for value in (since, until)]
    except (TypeError, ValueError):
        raise ValueError("since and until must both be given, as Unix seconds "
                         "(e.g. since=1764720000&until=1764723600).") from None
    if not all(math.isfinite(b) and 0 <= b < 253402300800 for b in bounds):
        raise ValueError("since and until must be Unix seconds between 1970 and 9999.")
    if bounds[0] >= bounds[1]:
        raise ValueError("since must be earlier than until.")
    return (datetime.fromtimestamp(bounds[0], tz=UTC), datetime.fromtimestamp(bounds[1], tz=UTC))
