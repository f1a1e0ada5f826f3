"""python manage.py createtoken PROJECT: prints a new ingest token for PROJECT, once."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug

from collectors.models import IngestToken, Project


class Command(BaseCommand):
    help = ("Creates an ingest token for PROJECT (creating the project if needed) and prints it. "
            "Only a hash is kept: copy it now.")

    def add_arguments(self, parser):
        parser.add_argument("project", help="project slug, e.g. llm")
        parser.add_argument("--name", default="", help="a label for the token, e.g. the cluster")
        parser.add_argument("--member", action="append", default=[], metavar="USERNAME",
                            help="give this existing user access to the project (repeatable)")

    def handle(self, *args, project: str, name: str, member: list[str], **options):
        try:
            validate_slug(project)
        except ValidationError:
            raise CommandError(f"project {project!r} must be a slug: letters, digits, '-' and '_'") from None
        users = []
        for username in member:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user named {username!r}; create it first "
                                   "(python manage.py createsuperuser)")
            users.append(user)
        found, created = Project.objects.get_or_create(slug=project, defaults={"name": project})
        if users:
            found.members.add(*users)
        _, plain = IngestToken.issue(found, name=name)
        if created:
            self.stderr.write(f"created project {project!r}")
        self.stdout.write(plain)
