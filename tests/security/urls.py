"""Every URL the project serves, enumerated from the resolver, so that a page added tomorrow is
covered by the access and CSRF tests without anyone adding it to a list."""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

# Served without a dashboard login, each for a stated reason: the ingest API authenticates with
# its own token, its description is public documentation, and login/logout are the way in.
PUBLIC = {"ingest", "ingest_openapi", "login", "logout"}


@dataclass(frozen=True)
class Route:
    name: str  # "namespace:name"
    route: str  # the pattern as written, for messages
    kwargs: tuple[str, ...]
    converters: dict

    @property
    def namespace(self) -> str:
        return self.name.split(":")[0] if ":" in self.name else ""


def routes() -> list[Route]:
    found: list[Route] = []

    def walk(patterns, prefix: str, namespace: str, converters: dict):
        for entry in patterns:
            if isinstance(entry, URLResolver):
                ns = ":".join(filter(None, [namespace, entry.namespace]))
                walk(entry.url_patterns, prefix + str(entry.pattern), ns,
                     {**converters, **getattr(entry.pattern, "converters", {})})
            elif isinstance(entry, URLPattern) and entry.name:
                both = {**converters, **getattr(entry.pattern, "converters", {})}
                kwargs = tuple(entry.pattern.regex.groupindex)
                found.append(Route(":".join(filter(None, [namespace, entry.name])),
                                   prefix + str(entry.pattern), kwargs, both))

    walk(get_resolver().url_patterns, "/", "", {})
    return found


def dashboard_routes() -> list[Route]:
    """The dashboard's own pages and JSON endpoints: everything but the admin and PUBLIC."""
    return [r for r in routes() if r.namespace != "admin" and r.name not in PUBLIC]
