"""ARCHITECTURE.md stays true: every metric key a stage writes is in its glossary, and every code name, file and
parameter it cites exists."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from seed_core.config import METHODS, Params, to_dict

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "ARCHITECTURE.md").read_text()
GLOSSARY = DOC[DOC.index("## Metrics glossary") :]
# sft.py's keys are relative: the warm-up and Stage 1 write them under `sft/`
RELATIVE = {"seed_core/sft.py": "sft/"}
NOT_STAGES = ("seed_core/tools/",)  # reports and probes compute their own tables, not stage metrics
NOT_KEYS = {"sft/c{}"}  # strings shaped like a key that are not one: a sampling seed's tag


def glossary_names() -> list[str]:
    names = []
    for row in GLOSSARY.splitlines():
        if row.startswith("| `"):
            names += re.findall(r"`([^`]+)`", row.split(" | ")[0])
    return names


def name_pattern(name: str) -> re.Pattern:
    """`<a|b>`: one of the alternatives; `<x>`: one path segment; `*`: anything, possibly empty."""
    out = ""
    for part in re.split(r"(<[^>]+>|\*)", name):
        if part == "*":
            out += ".*"
        elif part.startswith("<") and "|" in part:
            out += "(" + "|".join(map(re.escape, part[1:-1].split("|"))) + ")"
        elif part.startswith("<"):
            out += "[^/]+"
        else:
            out += re.escape(part)
    return re.compile(out + "$")


PATTERNS = [name_pattern(n) for n in glossary_names()]
PREFIXES = {n.split("/")[0] for n in glossary_names() if "/" in n}


def documented(key: str) -> bool:
    return any(p.match(key) for p in PATTERNS)


def written_keys() -> set[str]:
    """Every metric key in the committed reference run and reports (what the stages really wrote)."""
    keys: set[str] = set()

    def walk(d):
        if isinstance(d, dict):
            for k, v in d.items():
                if "/" in k:
                    keys.add(k)
                walk(v)
        elif isinstance(d, list):
            for x in d:
                walk(x)

    for path in [*REPO.glob("metrics/**/*.json"), *REPO.glob("reports/**/metrics/**/*.json")]:
        if not path.name.endswith(".lineage.json"):
            walk(json.loads(path.read_text()))
    return keys


def code_keys() -> dict[str, str]:
    """Metric-key strings in the stages' code ({} where an f-string fills in), with the file each is in."""
    found = {}
    for path in sorted((REPO / "seed_core").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith(NOT_STAGES):
            continue
        tree = ast.parse(path.read_text())
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            else:
                continue
            if "/" not in text:
                continue
            text = RELATIVE.get(rel, "") + text
            if re.fullmatch(r"[a-z_]+/[a-z_{}/0-9]*", text) and text.split("/")[0] in PREFIXES and text not in NOT_KEYS:
                found[text] = rel
    return found


def test_every_key_the_stages_wrote_is_in_the_glossary():
    keys = written_keys()
    assert len(keys) > 50  # the reference run and the reports were read
    missing = sorted(k for k in keys if not documented(k))
    assert not missing, f"ARCHITECTURE.md's metrics glossary lacks {missing}: add a row for each"


def test_every_key_in_the_code_is_in_the_glossary():
    missing = []
    for text, where in code_keys().items():
        stem = text.split("{}")[0]
        if "{}" in text or text.endswith("/"):  # a key built at run time: some glossary name must start so
            ok = documented(text.replace("{}", "x")) or any(n.startswith(stem) for n in glossary_names())
        else:
            ok = documented(text)
        if not ok:
            missing.append(f"{text} ({where})")
    assert not missing, f"ARCHITECTURE.md's metrics glossary lacks {sorted(missing)}"


def test_the_glossary_matcher_itself():
    assert name_pattern("analyzer/<before|after>/*").match("analyzer/after/parse_rate")
    assert not name_pattern("analyzer/<before|after>/*").match("analyzer/during/parse_rate")
    assert name_pattern("credit/auc/<signal>").match("credit/auc/gate")
    assert not name_pattern("credit/auc/<signal>").match("credit/auc/gate/x")
    assert name_pattern("sft/train/loss*").match("sft/train/loss")


# ------------------------------------------------------------------ code names


def _index() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({module: its top-level names}, {class: its members}) over seed_core, flows, bench and tests."""
    modules: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    for path in [*REPO.glob("seed_core/**/*.py"), *REPO.glob("flows/*.py")]:
        rel = path.relative_to(REPO).with_suffix("")
        parts = rel.parts[1:] if rel.parts[0] == "seed_core" else rel.parts
        name = ".".join(p for p in parts if p != "__init__")
        tree = ast.parse(path.read_text())
        top = modules.setdefault(name, set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                top.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        top.add(t.id)
            if isinstance(node, ast.ClassDef):
                members = classes.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return modules, classes


MODULES, CLASSES = _index()
PARAM_KEYS = set()


def _param_keys(d: dict, prefix: str = "") -> None:
    for k, v in d.items():
        PARAM_KEYS.add(prefix + k)
        if isinstance(v, dict):
            _param_keys(v, prefix + k + ".")


_param_keys(to_dict(Params()))
SECTIONS = {k for k in PARAM_KEYS if "." not in k}


def resolves(token: str) -> bool:
    """Whether a cited code name exists: `module.name`, `dir/module.name`, `Class.member`, `name()`."""
    dotted = token.removesuffix("()").replace("/", ".").removeprefix("seed_core").removeprefix(".")
    if not dotted:
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):  # the longest module prefix
        module = ".".join(parts[:cut])
        if module in MODULES:
            rest = parts[cut:]
            break
    else:
        module, rest = None, parts
    if module is None and parts[0] in {m.split(".")[0] for m in MODULES}:
        return False  # a package cited with a name it lacks
    if not rest:
        return True
    first, members = rest[0], rest[1:]
    if module is not None and first not in MODULES[module]:
        return False
    if module is None and not members:  # a bare name: defined anywhere, a class member, or a method's name
        return any(first in names for names in (*MODULES.values(), *CLASSES.values())) or first in METHODS
    if module is None and not any(first in names for names in MODULES.values()):
        return False
    return not members or (first in CLASSES and members[0] in CLASSES[first])


def cited() -> list[str]:
    return sorted(set(re.findall(r"`([^`\n]+)`", DOC[: DOC.index("## Metrics glossary")])))


def kind(token: str) -> str | None:
    if re.search(r"[<>{}*\s:]", token) or token.startswith(("..", "data/", "models/", "runs/", "metrics/")):
        return None  # a pattern, a command, a shell line or a pipeline output
    if token.endswith((".py", "/")) or (
        "/" in token and "." not in token.split("/")[-1] and token.split("/")[0] in {"seed_core", "flows", "tests"}
    ):
        return "file"
    if token.split(".")[0] in SECTIONS and "/" not in token:
        return "param"
    if re.fullmatch(r"[\w/]+(\.\w+)+(\(\))?", token) and not token.endswith((".json", ".jsonl", ".md", ".yaml")):
        return "code"
    if re.fullmatch(r"[A-Z]\w+|[a-z]+_[a-z_]+(\(\))?|[A-Z][A-Z_]+", token):
        return "code"  # a class, a snake_case function, a constant (one-word names are too often plain words)
    return None


def test_every_code_name_file_and_parameter_the_document_cites_exists():
    bad = []
    for token in cited():
        what = kind(token)
        if what == "param" and token not in PARAM_KEYS and token not in SECTIONS:
            bad.append(f"{token} (no such parameter)")
        elif what == "file":
            rel = token.rstrip("/")
            if not any((base / rel).exists() for base in (REPO, REPO / "seed_core")) and not list(
                REPO.glob(f"*/**/{rel}")
            ):
                bad.append(f"{token} (no such file)")
        elif what == "code" and not resolves(token):
            bad.append(f"{token} (no such name)")
    assert not bad, f"ARCHITECTURE.md cites what does not exist: {bad}"


@pytest.mark.parametrize(
    "token, ok",
    [("method/update.method_spec", True), ("method/prompts.NOPE", False), ("Trainer.update", True),
     ("Trainer.nope", False), ("records.publish_dir", True), ("policy.hf.sequence_logprobs", True)],
)  # fmt: skip
def test_the_name_resolver_itself(token, ok):
    assert resolves(token) is ok
