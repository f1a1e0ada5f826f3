"""Forms for rules and channels, shared by the dashboard and the admin. A rule's parameters are
validated per kind here, so a rule that is saved can always be evaluated."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.validators import validate_email

from collectors.alerts.models import AlertRule, Channel
from collectors.models import Category, Project, Run

# kind → {parameter: (label, minimum, maximum, default)}; every listed parameter is required.
PARAMETERS: dict[str, dict[str, tuple[str, float, float, float]]] = {
    "interruption": {},
    "stall": {"minutes": ("No progress for (minutes)", 1, 10080, 10)},
    "throughput_drop": {"percent": ("Below the trailing median by more than (%)", 1, 100, 20),
                        "minutes": ("For at least (minutes)", 1, 1440, 10)},
    "gpu_temperature": {"max_temp_c": ("Temperature above (°C)", 30, 130, 85)},
    "power_swing": {"kw": ("Swing above (kW)", 0.01, 1e6, 100),
                    "window_s": ("Within (seconds)", 1, 3600, 10)},
    "ettr_below": {"target_pct": ("ETTR below (%)", 1, 100, 90)},
    "checkpoint_overdue": {"minutes": ("No checkpoint save for (minutes)", 1, 10080, 60)},
}
PARAMETER_FIELDS = sorted({name for spec in PARAMETERS.values() for name in spec})


def validate_parameters(kind: str, parameters: Any, categories: Any = ()) -> dict[str, str]:
    """Problems with a rule's parameters, by field; empty when it can be evaluated."""
    if kind not in PARAMETERS:
        return {"kind": f"Unknown rule kind {kind!r}."}
    if not isinstance(parameters, dict):
        return {"parameters": "Parameters must be a JSON object."}
    problems = {}
    for name, (label, low, high, _) in PARAMETERS[kind].items():
        value = parameters.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems[name] = f"{label}: a number is required for this kind of rule."
        elif not low <= value <= high:
            problems[name] = f"{label}: must be between {low:g} and {high:g}."
    known = set(Category.values)
    if categories and (not isinstance(categories, list) or set(categories) - known):
        problems["categories"] = "Categories must be root-cause slugs such as gpu_hardware."
    return problems


class ChannelForm(forms.ModelForm):
    recipients = forms.CharField(required=False, help_text="Email addresses, comma-separated.")
    # Write-only: an existing URL is never sent back to the browser.
    url = forms.CharField(
        required=False, label="Webhook URL", widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current URL.",
    )

    class Meta:
        model = Channel
        fields = ["project", "name", "kind"]

    def __init__(self, *args, projects=None, **kwargs):
        super().__init__(*args, **kwargs)
        if projects is not None:
            self.fields["project"].queryset = projects
        if self.instance.pk:
            self.initial["recipients"] = ", ".join(self.instance.recipients)
            if self.instance.url:
                self.fields["url"].help_text = (
                    f"Current: {self.instance.masked_target}. Leave empty to keep it.")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        kind = data.get("kind")
        if kind == Channel.Kind.EMAIL:
            recipients = [r.strip() for r in (data.get("recipients") or "").split(",") if r.strip()]
            if not recipients:
                self.add_error("recipients", "Give at least one email address.")
            for address in recipients:
                try:
                    validate_email(address)
                except forms.ValidationError:
                    self.add_error("recipients", f"{address!r} is not an email address.")
            data["config"] = {"recipients": recipients}
        elif kind in (Channel.Kind.SLACK, Channel.Kind.WEBHOOK):
            url = (data.get("url") or "").strip() or (
                self.instance.url if self.instance.pk and self.instance.kind == kind else "")
            if not url.startswith(("https://", "http://")):
                self.add_error("url", "Paste the webhook URL, starting with https://.")
            data["config"] = {"url": url}
        return data

    def save(self, commit: bool = True) -> Channel:
        self.instance.config = self.cleaned_data["config"]
        return super().save(commit=commit)


class AlertRuleForm(forms.ModelForm):
    categories = forms.MultipleChoiceField(
        choices=Category.choices, required=False, widget=forms.CheckboxSelectMultiple,
        help_text="Interruption rules: the root causes to alert on; none ticked means any.")

    class Meta:
        model = AlertRule
        fields = ["project", "run", "name", "kind", "cooldown_minutes", "enabled", "channels"]
        widgets = {"channels": forms.CheckboxSelectMultiple}

    def __init__(self, *args, projects=None, **kwargs):
        super().__init__(*args, **kwargs)
        for name in PARAMETER_FIELDS:
            label = next(spec[name][0] for spec in PARAMETERS.values() if name in spec)
            self.fields[name] = forms.FloatField(
                required=False, label=label,
                initial=self.instance.parameters.get(name) if self.instance.pk else None)
        if projects is not None:
            self.fields["project"].queryset = projects
            self.fields["run"].queryset = Run.objects.filter(project__in=projects)
            self.fields["channels"].queryset = Channel.objects.filter(project__in=projects)
        if self.instance.pk:
            self.initial["categories"] = self.instance.categories

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        kind = data.get("kind")
        if kind not in PARAMETERS:
            return data
        parameters = {}
        for name, (_, _, _, default) in PARAMETERS[kind].items():
            value = data.get(name)
            parameters[name] = default if value is None else value
        categories = list(data.get("categories") or []) if kind == "interruption" else []
        for field, problem in validate_parameters(kind, parameters, categories).items():
            self.add_error(field if field in self.fields else None, problem)
        project: Project | None = data.get("project")
        run = data.get("run")
        if project and run and run.project_id != project.pk:
            self.add_error("run", "The run must belong to the rule's project.")
        for channel in data.get("channels") or []:
            if project and channel.project_id != project.pk:
                self.add_error("channels", f"{channel.name} belongs to another project.")
        data["parameters"], data["categories"] = parameters, categories
        # Before the model's own clean(), which validates the same fields of the instance.
        self.instance.parameters, self.instance.categories = parameters, categories
        return data

    def save(self, commit: bool = True) -> AlertRule:
        self.instance.parameters = self.cleaned_data["parameters"]
        self.instance.categories = self.cleaned_data["categories"]
        return super().save(commit=commit)
