"""Alert rules and channels of the user's projects, a "send test" per channel, and the history of
every notification attempt. Another project's rule or channel is a 404."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from collectors.alerts.forms import PARAMETERS, AlertRuleForm, ChannelForm
from collectors.alerts.models import Alert, AlertRule, Channel, Notification
from collectors.alerts.tasks import attempt_delivery
from collectors.models import Project


def visible_projects(user):
    return Project.objects.all() if user.is_superuser else Project.objects.filter(members=user)


def _get_for_user(request: HttpRequest, model, pk: int):
    found = get_object_or_404(model.objects.select_related("project"), pk=pk)
    if not found.project.visible_to(request.user):
        raise Http404("Nothing with that id in your projects.")
    return found


@login_required
@require_GET
def alerts_page(request: HttpRequest) -> HttpResponse:
    projects = visible_projects(request.user)
    return render(request, "dashboard/alerts.html", {
        "rules": AlertRule.objects.filter(project__in=projects).select_related("project", "run")
        .prefetch_related("channels"),
        "channels": Channel.objects.filter(project__in=projects).select_related("project"),
        "alerts": Alert.objects.filter(rule__project__in=projects)
        .select_related("rule", "run__project")[:50],
    })


def _edit(request: HttpRequest, form_class, instance, title: str) -> HttpResponse:
    projects = visible_projects(request.user)
    form = form_class(request.POST or None, instance=instance, projects=projects)
    if request.method == "POST" and form.is_valid():
        saved = form.save()
        messages.success(request, f"Saved {saved.name}.")
        return redirect("alerts")
    return render(request, "dashboard/alert_form.html",
                  {"form": form, "title": title, "parameters": PARAMETERS})


@login_required
@require_http_methods(["GET", "POST"])
def rule_new(request: HttpRequest) -> HttpResponse:
    return _edit(request, AlertRuleForm, None, "New alert rule")


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = _get_for_user(request, AlertRule, rule_id)
    return _edit(request, AlertRuleForm, rule, f"Edit rule {rule.name}")


@login_required
@require_http_methods(["GET", "POST"])
def channel_new(request: HttpRequest) -> HttpResponse:
    return _edit(request, ChannelForm, None, "New channel")


@login_required
@require_http_methods(["GET", "POST"])
def channel_edit(request: HttpRequest, channel_id: int) -> HttpResponse:
    channel = _get_for_user(request, Channel, channel_id)
    return _edit(request, ChannelForm, channel, f"Edit channel {channel.name}")


@login_required
@require_POST
def channel_test(request: HttpRequest, channel_id: int) -> HttpResponse:
    channel = _get_for_user(request, Channel, channel_id)
    notification = Notification.objects.create(channel=channel, kind=Notification.Kind.TEST)
    # Sent in the request: the person who pressed the button wants the answer now.
    failure = attempt_delivery(notification)
    if failure is None:
        messages.success(request, f"Test message sent to {channel.name}.")
    else:
        messages.error(request, f"Test message to {channel.name} failed: {failure}")
    return redirect("alerts")


@login_required
@require_GET
def history(request: HttpRequest) -> HttpResponse:
    projects = visible_projects(request.user)
    notifications = (Notification.objects.filter(channel__project__in=projects)
                     .select_related("channel__project", "alert__rule", "alert__run")[:500])
    return render(request, "dashboard/alert_history.html", {"notifications": notifications})
