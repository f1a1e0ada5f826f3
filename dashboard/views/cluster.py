"""A run's Power page (cluster power over time, its swings and what caused them) and its GPU health
page (temperature and power per GPU, hottest and throttling GPUs, XID/ECC history), each with a
JSON twin for its charts. Numbers come from dashboard.views.cluster_presenters."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard.views import cluster_presenters
from dashboard.views.access import get_run_for_user

HEATMAP_ORDERS = ("name", "hottest")


@login_required
@require_GET
def run_power(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    try:
        start, end = cluster_presenters.parse_range(request.GET)
    except cluster_presenters.RangeError as exc:
        return HttpResponseBadRequest(str(exc))
    context = cluster_presenters.power_context(run, start, end)
    return render(request, "dashboard/run_power.html", {"run": run, "tab": "power", **context})


@login_required
@require_GET
def run_power_json(request: HttpRequest, run_id: int) -> JsonResponse:
    """The Power page's figures, swings and summary for ?start=&end= (Unix seconds or ISO 8601):
    what the page fetches when the user zooms, to redraw at per-second detail."""
    run = get_run_for_user(request, run_id)
    try:
        start, end = cluster_presenters.parse_range(request.GET)
    except cluster_presenters.RangeError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    context = cluster_presenters.power_context(run, start, end)
    return JsonResponse(context)


def _order(request: HttpRequest) -> str | None:
    order = request.GET.get("order") or "name"
    return order if order in HEATMAP_ORDERS else None


@login_required
@require_GET
def run_gpu_health(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    order = _order(request)
    if order is None:
        return HttpResponseBadRequest("'order' must be 'name' (host, then GPU index) or 'hottest'.")
    context = cluster_presenters.gpu_health_context(run, order)
    return render(request, "dashboard/run_gpu_health.html",
                  {"run": run, "tab": "gpu_health", "orders": HEATMAP_ORDERS, **context})


@login_required
@require_GET
def run_gpu_health_json(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_run_for_user(request, run_id)
    order = _order(request)
    if order is None:
        return JsonResponse({"error": "'order' must be 'name' or 'hottest'."}, status=400)
    return JsonResponse(cluster_presenters.gpu_health_context(run, order))
