"""python manage.py classify [FILE] [--jsonl]: root-cause triage of a log excerpt outside a run.

Plain mode reads one excerpt (FILE, or stdin) and prints
``category  expected|unexpected  confidence  rule``. ``--jsonl`` reads JSON lines with a ``text``
field (other evidence keys such as ``exit_code``, ``signal`` or ``xids`` are used when present) and
writes each line back with ``category``, ``expected``, ``confidence`` and ``rule`` added.
"""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from collectors.classification.engine import classify
from collectors.classification.rules import active_rules, rules_from_file

EVIDENCE_KEYS = ("text", "exc_type", "exit_code", "signal", "xids", "ecc_dbe", "heartbeat_lost",
                 "source")


class Command(BaseCommand):
    help = "Classifies a log excerpt (FILE or stdin) into a root-cause category."

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", help="log excerpt to read (default: stdin)")
        parser.add_argument("--jsonl", action="store_true",
                            help="read JSON lines with a 'text' field; write them back with the verdict")
        parser.add_argument("--file-rules", action="store_true",
                            help="use the shipped rules file, not the database's (admin-edited) rules")

    def _rules(self, file_rules: bool):
        if file_rules:
            return rules_from_file()
        try:
            return active_rules()
        except DatabaseError as error:
            self.stderr.write(f"database unavailable ({error.__class__.__name__}); "
                              "using the shipped rules file")
            return rules_from_file()

    def handle(self, *args, file: str | None, jsonl: bool, file_rules: bool, **options):
        try:
            source = open(file, encoding="utf-8", errors="replace") if file else sys.stdin
        except OSError as error:
            raise CommandError(f"cannot read {file}: {error.strerror}") from None
        rules = self._rules(file_rules)
        with source:
            if not jsonl:
                verdict = classify({"text": source.read()}, rules=rules)
                self.stdout.write(f"{verdict.category}  "
                                  f"{'expected' if verdict.expected else 'unexpected'}  "
                                  f"{verdict.confidence:.2f}  {verdict.rule}")
                if verdict.matched:
                    self.stdout.write(f"matched: {verdict.matched}")
                return
            for number, line in enumerate(source, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise CommandError(f"line {number} is not JSON: {error.msg}") from None
                if not isinstance(record, dict) or not isinstance(record.get("text", ""), str):
                    raise CommandError(f"line {number} must be an object with a 'text' string")
                verdict = classify({key: record[key] for key in EVIDENCE_KEYS if key in record},
                                   rules=rules)
                record.update(category=verdict.category, expected=verdict.expected,
                              confidence=verdict.confidence, rule=verdict.rule)
                self.stdout.write(json.dumps(record, ensure_ascii=False))
