"""The fault-injection suite's ledger (a pytest plugin, loaded by conftest.py).

A test marked `@pytest.mark.fault(kind, n=1)` injects `n` faults of one kind for real; it survived them when it
passed. Tests that break something next to outputs a previous run wrote wrap the fault in `intact(folder)`,
which counts every file that changed or vanished as an output lost; tests that plant a secret call
`scan_for_secret`, which counts every file it appears in as a secret leaked. The terminal summary (and
`$SEED_FAULT_REPORT`, a JSON file, which `seed doctor` reads) gives the four figures.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

KINDS = ("kill", "teacher", "params", "data", "model_output", "numeric", "disk", "security")

_results: dict[str, list[tuple[str, int, bool]]] = {}  # nodeid -> [(kind, faults, passed)]
_lost: list[str] = []
_leaked: list[str] = []


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"fault(kind, n=1): injects n faults of one kind for real, one of {', '.join(KINDS)}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    markers = list(item.iter_markers("fault"))
    if not markers or report.skipped or not (report.when == "call" or report.failed):
        return
    for m in markers:
        if m.args[0] not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: fault kind {m.args[0]!r} is not one of {KINDS}")
    passed = report.passed and all(ok for _, _, ok in _results.get(item.nodeid, []))
    _results[item.nodeid] = [(m.args[0], m.kwargs.get("n", 1), passed) for m in markers]


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@contextmanager
def intact(root: Path):
    """Fails (and counts the files as outputs lost) when any file under `root` changed or vanished inside."""
    before = _digest(root)
    assert before, f"nothing under {root} to guard"
    try:
        yield
    finally:
        after = _digest(root)
        lost = [f"{root}/{f}" for f, h in before.items() if after.get(f) != h]
        _lost.extend(lost)
    assert not lost, f"outputs lost: {lost}"


def files_containing(secret: str, *roots: Path) -> list[str]:
    needle = secret.encode()
    return [
        str(p)
        for root in roots
        for p in sorted(Path(root).rglob("*"))
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes()
    ]


def scan_for_secret(secret: str, *roots: Path) -> list[str]:
    """Every file under `roots` whose bytes contain `secret`, counted as secrets leaked."""
    hits = files_containing(secret, *roots)
    _leaked.extend(hits)
    return hits


def figures() -> dict:
    by_kind = Counter()
    survived = Counter()
    for kind, n, passed in (r for rs in _results.values() for r in rs):
        by_kind[kind] += n
        survived[kind] += n if passed else 0
    return {
        "faults_injected": sum(by_kind.values()),
        "faults_survived": sum(survived.values()),
        "outputs_lost": len(_lost),
        "secrets_leaked": len(_leaked),
        "tests": len(_results),
        "by_kind": {k: {"injected": by_kind[k], "survived": survived[k]} for k in KINDS if by_kind[k]},
    }


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    f = figures()
    terminalreporter.write_sep("=", "fault injection")
    terminalreporter.write_line(
        f"{f['faults_injected']} faults injected in {f['tests']} tests, {f['faults_survived']} survived, "
        f"{f['outputs_lost']} outputs lost, {f['secrets_leaked']} secrets leaked"
    )
    for kind, c in f["by_kind"].items():
        terminalreporter.write_line(f"  {kind:<13} {c['survived']}/{c['injected']} survived")
    if out := os.environ.get("SEED_FAULT_REPORT"):
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(f, indent=1))
        tmp.replace(out)
