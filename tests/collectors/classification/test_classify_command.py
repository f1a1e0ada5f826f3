"""python manage.py classify, in plain and --jsonl mode."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"


def run(*args, stdin: str | None = None, monkeypatch=None) -> str:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    out = io.StringIO()
    call_command("classify", *args, stdout=out)
    return out.getvalue()


def test_plain_mode_reads_a_file(tmp_path):
    excerpt = tmp_path / "crash.log"
    excerpt.write_text(ECC)
    first, matched = run(str(excerpt)).splitlines()
    assert first.split() == ["gpu_memory", "unexpected", "0.95", "ecc-uncorrectable-text"]
    assert matched == "matched: RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_plain_mode_reads_stdin(monkeypatch):
    out = run(stdin="slurmstepd: error: *** JOB 5 CANCELLED AT 2024-01-01T00:00:00 DUE TO PREEMPTION ***",
              monkeypatch=monkeypatch)
    assert out.split()[:4] == ["planned", "expected", "0.90", "slurm-preempted"]


def test_jsonl_mode_adds_the_verdict_to_each_line(monkeypatch):
    lines = [{"text": ECC, "id": 1}, {"text": "nothing to see", "id": 2},
             {"text": "", "exit_code": -9, "id": 3}]
    out = run("--jsonl", stdin="\n".join(json.dumps(line) for line in lines) + "\n\n",
              monkeypatch=monkeypatch)
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["id"], r["category"], r["expected"], r["rule"]) for r in records] == [
        (1, "gpu_memory", False, "ecc-uncorrectable-text"),
        (2, "unknown", False, "fallback"),
        (3, "host", False, "sigkill-signal"),
    ]
    assert all(isinstance(r["confidence"], float) for r in records)
    assert records[0]["text"] == ECC


def test_jsonl_mode_with_file_rules(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "OSError: [Errno 28] No space left on device"}) + "\n")
    record = json.loads(run("--jsonl", "--file-rules", str(source)))
    assert (record["category"], record["rule"]) == ("storage", "disk-full")


def test_jsonl_mode_names_the_bad_line(monkeypatch):
    with pytest.raises(CommandError, match="line 2 is not JSON"):
        run("--jsonl", stdin='{"text": "a"}\nnot json\n', monkeypatch=monkeypatch)


def test_missing_file_is_a_clear_error():
    with pytest.raises(CommandError, match="cannot read /nonexistent/crash.log"):
        run("/nonexistent/crash.log")
