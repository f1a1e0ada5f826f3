"""Applies the classification rules to an interruption's evidence.

Evidence is a dict; every key is optional and unknown keys are ignored:

``text``            exception message and traceback, or the launcher's stderr tail
``exc_type``        exception class name, e.g. ``torch.OutOfMemoryError``
``exit_code``       the process's exit code (negative: killed by that signal, as torchrun reports)
``signal``          the signal that stopped it: ``"SIGTERM"``, ``"TERM"`` or ``15``
``xids``            NVML XID codes seen on the host shortly before (ints)
``ecc_dbe``         volatile double-bit ECC error count
``heartbeat_lost``  for stall/kill interruptions: did the heartbeats stop as well as the steps?
``source``          exception | signal | launcher | stall | kill

Rules are tried highest priority first and the first match decides (see rules.py). A torchrun
``ChildFailedError`` report is unwrapped first: the launcher's own traceback and its "closing
signal SIGTERM" chatter are dropped, and the verdict comes from the children's output and the
"Root Cause (first observed failure)" block (its exit code, signal and traceback).
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import asdict, dataclass
from typing import Any

from collectors.classification import xid as xid_catalogue
from collectors.classification.rules import Rule, active_rules

SNIPPET_CHARS = 300
FALLBACK_RULE = "fallback"
FALLBACK_CONFIDENCE = 0.1


@dataclass(frozen=True)
class Verdict:
    category: str
    expected: bool
    confidence: float
    rule: str
    # The piece of evidence that decided it: the matching log line, or e.g. "xid=79 (...)".
    matched: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Unwrapped:
    text: str
    exit_code: int | None
    root_cause: str


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)\s*:\s*\n(?P<block>.*?)(?:\n\s*={5,}|\Z)",
                         re.DOTALL)
_BLOCK_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_BLOCK_TRACEBACK = re.compile(r"traceback\s*:\s*(?P<traceback>.*)", re.DOTALL)
_LAUNCHER_EXITCODE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank")
_TRACEBACK_HEAD = re.compile(r"Traceback \(most recent call last\)")
_LAUNCHER_FRAMES = re.compile(r"torchrun|distributed[/\\]run\.py|distributed[/\\]launch|elastic|"
                              r"launch\.py|launcher", re.IGNORECASE)
# torchrun's own lines around a child failure; they name signals and exit codes of the *wrapper*,
# not the cause, so they must not reach the rules.
_LAUNCHER_NOISE = re.compile(
    r"^.*(Sending process \d+ closing signal|Closing process \d+ via signal|"
    r"failed \(exitcode: -?\d+\) local_rank|Worker group (failed|FAILED)|will restart worker group|"
    r"Stopping worker group|_no_error_file_warning_msg).*$\n?",
    re.MULTILINE,
)
_NO_TRACEBACK = "To enable traceback see"


def unwrap_child_failed(text: str) -> Unwrapped | None:
    """The cause inside a torchrun ChildFailedError report, or None if ``text`` holds none."""
    root = _ROOT_CAUSE.search(text)
    wrapper_at = text.find("ChildFailedError")
    launcher_exit = _LAUNCHER_EXITCODE.search(text)
    if root is None and wrapper_at < 0 and launcher_exit is None:
        return None

    exit_code = None
    root_traceback = ""
    if root is not None:
        block = root.group("block")
        if code := _BLOCK_EXITCODE.search(block):
            exit_code = int(code.group(1))
        if found := _BLOCK_TRACEBACK.search(block):
            root_traceback = found.group("traceback").strip()
            if root_traceback.startswith(_NO_TRACEBACK):
                root_traceback = ""
    if exit_code is None and launcher_exit is not None:
        exit_code = int(launcher_exit.group(1))

    # Everything from the launcher's traceback on is the wrapper: cut it, keep the children's output.
    cut = len(text)
    if wrapper_at >= 0:
        cut = text.rfind("\n", 0, wrapper_at) + 1
        heads = [m.start() for m in _TRACEBACK_HEAD.finditer(text, 0, wrapper_at)]
        if heads and _LAUNCHER_FRAMES.search(text, heads[-1], wrapper_at):
            cut = text.rfind("\n", 0, heads[-1]) + 1
    elif root is not None:
        cut = root.start()
    children = _LAUNCHER_NOISE.sub("", text[:cut])
    return Unwrapped(text=(children.rstrip() + "\n" + root_traceback).strip(), exit_code=exit_code,
                     root_cause=root.group("block").strip() if root else "")


def _signal_name(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit()):
        try:
            return signals.Signals(abs(int(value))).name
        except ValueError:
            return None
    name = str(value).strip().upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def _exit_code(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _signal_from_exit_code(code: int | None) -> str | None:
    """torchrun reports death by signal N as exit code -N; shells as 128 + N."""
    if code is None:
        return None
    if code < 0:
        return _signal_name(-code)
    if 128 < code <= 128 + 64:
        return _signal_name(code - 128)
    return None


def evidence_values(evidence: dict[str, Any]) -> dict[str, list[str]]:
    """Each rule field's rendering of the evidence: what that field's regexes are searched in."""
    text = str(evidence.get("text") or "")
    exit_code = _exit_code(evidence.get("exit_code"))
    unwrapped = unwrap_child_failed(text)
    if unwrapped is not None:
        text = unwrapped.text
        if exit_code is None:
            exit_code = unwrapped.exit_code
    signal = _signal_name(evidence.get("signal")) or _signal_from_exit_code(exit_code)

    xids: list[int] = []
    for code in list(evidence.get("xids") or []) + xid_catalogue.xids_in_text(text):
        try:
            code = int(code)
        except (TypeError, ValueError):
            continue
        if code not in xids:
            xids.append(code)

    values: dict[str, list[str]] = {
        "text": [text] if text else [],
        "exc_type": [str(evidence["exc_type"])] if evidence.get("exc_type") else [],
        "exit_code": [str(exit_code)] if exit_code is not None else [],
        "signal": [signal] if signal else [],
        "xid": [f"{code}:{xid_catalogue.category_of(code) or 'none'}" for code in xids],
        "ecc_dbe": [],
        "heartbeat": [],
    }
    dbe = _exit_code(evidence.get("ecc_dbe"))
    if dbe is not None:
        values["ecc_dbe"] = [str(dbe)]
    source = str(evidence.get("source") or "")
    if evidence.get("heartbeat_lost") is not None and source in ("stall", "kill"):
        values["heartbeat"] = [f"{source}:{'lost' if evidence['heartbeat_lost'] else 'alive'}"]
    return values


def _snippet(field: str, value: str, match: re.Match) -> str:
    if field == "text":
        start = value.rfind("\n", 0, match.start()) + 1
        end = value.find("\n", match.end())
        line = value[start:end if end >= 0 else len(value)].strip()
        if len(line) > SNIPPET_CHARS:
            middle = (match.start() + match.end()) // 2 - start
            begin = max(0, middle - SNIPPET_CHARS // 2)
            line = line[begin:begin + SNIPPET_CHARS]
        return line
    if field == "xid":
        code = int(value.split(":", 1)[0])
        info = xid_catalogue.lookup(code)
        return f"xid={code}" + (f" ({info.description})" if info else "")
    return f"{field}={value}"


def classify(evidence: dict[str, Any], rules: list[Rule] | None = None) -> Verdict:
    """The category of one interruption, from its evidence (see the module docstring).

    ``rules`` defaults to the active rules of the database (admin edits included); pass
    ``rules_from_file()`` to classify without a database."""
    if rules is None:
        rules = active_rules()
    values = evidence_values(evidence if isinstance(evidence, dict) else {})
    for rule in rules:
        for value in values.get(rule.field, ()):
            match = rule.regex.search(value)
            if match:
                return Verdict(category=rule.category, expected=rule.expected,
                               confidence=rule.confidence, rule=rule.slug,
                               matched=_snippet(rule.field, value, match))
    return Verdict(category="unknown", expected=False, confidence=FALLBACK_CONFIDENCE,
                   rule=FALLBACK_RULE, matched="")
