"""python manage.py loadrules [FILE]: syncs the classification rules file into the table."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from collectors.classification.rules import RULES_FILE, RuleFileError, sync_rules_from_file


class Command(BaseCommand):
    help = ("Loads the root-cause classification rules from rules_v1.json (or FILE) into the "
            "database. Rules edited in the admin are kept; file rules no longer in the file are removed.")

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", type=Path, default=RULES_FILE)

    def handle(self, *args, file: Path, **options):
        try:
            counts = sync_rules_from_file(file)
        except (OSError, ValueError, RuleFileError) as error:
            raise CommandError(f"could not load rules from {file}: {error}") from None
        self.stdout.write(", ".join(f"{name}: {count}" for name, count in counts.items()))
