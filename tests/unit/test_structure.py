"""The architecture as tests: one-way imports between the library's parts, and dvc.yaml's `deps` equal to what
each stage's code really imports (so `dvc repro` never calls a stage up to date after its code changed)."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STAGE_MODULES = ("prepare", "warmup", "build_sft_data", "train_analyzer", "rl", "evaluate", "eval_table")
# Modules a stage imports that cannot change its outputs, so editing them must not re-run it.
NOT_RESULTS = {
    "flows/_common.py": "argument parsing, Prefect artifacts and the lineage sidecar; no stage logic",
    "seed_core/tracking.py": "W&B logging only",
    "seed_core/tools/lineage.py": "writes the <output>.lineage.json sidecars (records, not results)",
}


REGISTERED = re.compile(r"seed_core(\.\w+)+:\w+")


def module_file(module: str) -> Path | None:
    """The file of a `seed_core...` module (a .py file or a package's __init__.py), or None."""
    base = REPO / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def imports(path: Path) -> frozenset[Path]:
    """Repository files `path` imports, at module level or inside functions (a lazy import runs too), with the
    __init__.py of every package on the way."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and REGISTERED.fullmatch(node.value):
            names = [node.value.partition(":")[0]]  # a registry entry ("module:Class", `envs.GAMES`) imported on use
        else:
            continue
        for name in names:
            if name == "_common":
                out.add(REPO / "flows/_common.py")
            if not name.startswith("seed_core"):
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__, a/b/__init__, then c
                if f := module_file(".".join(parts[:i])):
                    out.add(f)
    return frozenset(out)


def closure(path: Path) -> set[Path]:
    seen, todo = set(), [path]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += imports(p)
    return seen


def docstring_only(path: Path) -> bool:
    """A package marker: nothing but a docstring, so it cannot change a result."""
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


def seed_core_imports(path: Path) -> set[str]:
    """Every module name `path` imports (absolute; the library uses no relative imports)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{rel(path)}: relative import; the library imports `seed_core....` absolutely"
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


LIBRARY = sorted((REPO / "seed_core").rglob("*.py"))


@pytest.mark.parametrize("path", LIBRARY, ids=rel)
def test_library_imports_neither_prefect_nor_dvc(path):
    bad = sorted(m for m in seed_core_imports(path) if m.split(".")[0] in ("prefect", "dvc"))
    assert not bad, f"{rel(path)} imports {bad}: seed_core runs without Prefect or DVC; move it to flows/"


@pytest.mark.parametrize("path", sorted((REPO / "seed_core/stages").rglob("*.py")), ids=rel)
def test_a_stage_imports_no_other_stage(path):
    stage = path.relative_to(REPO / "seed_core/stages").parts[0].removesuffix(".py")  # a module or a package
    own = f"seed_core.stages.{stage}"
    bad = sorted(m for m in seed_core_imports(path) if m.startswith("seed_core.stages.") and not m.startswith(own))
    assert not bad, f"{rel(path)} imports {bad}: a stage imports no other stage; move the shared piece down"


@pytest.mark.parametrize(
    "path", sorted((REPO / "seed_core").glob("[!_]*/**/*.py")) + sorted((REPO / "seed_core").glob("*.py")), ids=rel
)
def test_imports_point_down(path):
    """tools -> stages -> method -> envs, policy -> plumbing: nothing imports a part above it."""
    part = rel(path).split("/")[1]
    above = {
        "method": ("stages", "tools"),
        "envs": ("stages", "tools"),
        "policy": ("stages", "tools", "method"),
        "stages": ("tools",),
    }.get(part, ("stages", "tools") if part.endswith(".py") else ())
    bad = sorted(m for m in seed_core_imports(path) if m.split(".")[:2][-1] in above and m.startswith("seed_core."))
    assert not bad, f"{rel(path)} imports {bad}; see ARCHITECTURE.md for the import rules"


GAME_PACKAGES = sorted(p.parent.name for p in (REPO / "seed_core/envs").glob("*/__init__.py"))


@pytest.mark.parametrize("path", sorted((REPO / "seed_core").rglob("*.py")), ids=rel)
def test_games_and_the_method_meet_only_at_the_protocols(path):
    """A game imports nothing of the method layer but the teacher protocol its oracle implements; nothing outside
    a game's own package imports it (`envs.game` finds it by `env.name`), tools and tests aside."""
    where = rel(path)
    mods = {m for m in seed_core_imports(path) if m.startswith("seed_core.")}
    if where.startswith("seed_core/envs/") and where.count("/") == 3:  # inside a game's package
        bad = sorted(
            m for m in mods if m.startswith("seed_core.method") and not m.startswith("seed_core.method.teachers")
        )
        assert not bad, f"{where} imports {bad}: a game imports only the teacher protocol of the method layer"
    elif not where.startswith("seed_core/tools/"):
        own = {f"seed_core.envs.{g}" for g in GAME_PACKAGES}
        bad = sorted(m for m in mods if any(m == g or m.startswith(g + ".") for g in own))
        assert not bad, f"{where} imports the game module(s) {bad}: reach a game through `envs.game(env.name)`"


def test_layout_matches_stage_names():
    stages = REPO / "seed_core/stages"
    modules = [p.stem for p in stages.glob("[!_]*.py")] + [p.parent.name for p in stages.glob("*/__init__.py")]
    assert sorted(modules) == sorted(STAGE_MODULES)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(STAGE_MODULES) <= set(stages)


def dvc_stages() -> dict[str, dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def stage_params(stage: dict) -> list[str]:
    return [p for p in stage.get("params", []) if isinstance(p, str)]


def param_value(params: dict, key: str):
    for k in key.split("."):
        params = params[k]
    return params


def recipe_files(value) -> set[str]:
    """Repository files a params value names (e.g. rl.sdar_skills: recipes/sdar_skills_alfworld.yaml)."""
    if isinstance(value, dict):
        return set().union(*(recipe_files(v) for v in value.values())) if value else set()
    if isinstance(value, str) and re.fullmatch(r"[\w./-]+\.\w+", value) and (REPO / value).is_file():
        return {value}
    return set()


def stage_code(name: str, stage: dict) -> set[str]:
    cmd = stage["do"]["cmd"] if "do" in stage else stage["cmd"]
    flow = re.search(r"python (flows/\w+\.py)", cmd)
    assert flow, f"stage {name}: cmd {cmd!r} does not run a flow"
    code = {rel(p) for p in closure(REPO / flow.group(1)) if not docstring_only(p)}
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for key in stage_params(stage["do"] if "do" in stage else stage):
        code |= recipe_files(param_value(params, key))
    return code


@pytest.mark.parametrize("name", list(dvc_stages()))
def test_dvc_deps_cover_the_code_a_stage_runs(name):
    stage = dvc_stages()[name]
    body = stage["do"] if "do" in stage else stage
    deps = {d for d in body.get("deps", [])}
    needed = stage_code(name, stage) - set(NOT_RESULTS)
    missing = sorted(f for f in needed if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))
    assert not missing, f"dvc.yaml stage {name} runs code missing from its deps: {missing}; add them to its deps"
    code_deps = {d for d in deps if d.startswith(("seed_core/", "flows/", "recipes/"))}
    extra = sorted(code_deps - needed - set(NOT_RESULTS))
    assert not extra, f"dvc.yaml stage {name} lists deps its code does not import: {extra}; remove them"


def test_every_stage_rl_builds_on_can_be_restored_from_the_run_cache():
    """DVC keeps a stage with a persisted output out of its run-cache. A sweep's experiments share every stage
    upstream of `rl`, so such a stage would re-run in every experiment (and retrain what follows it)."""
    stages = dvc_stages()
    made_by = {
        (o if isinstance(o, str) else next(iter(o))): name
        for name, body in stages.items()
        for o in body.get("outs", [])
    }
    upstream, todo = set(), ["rl"]
    while todo:
        for dep in stages[todo.pop()].get("deps", []):
            if dep in made_by and made_by[dep] not in upstream:
                upstream.add(made_by[dep])
                todo.append(made_by[dep])
    assert {"prepare", "warmup", "build_sft_data", "train_analyzer"} <= upstream
    persisted = {
        f"{name}: {next(iter(o))}"
        for name in upstream
        for o in stages[name].get("outs", [])
        if isinstance(o, dict) and next(iter(o.values())).get("persist")
    }
    assert not persisted, f"persisted outputs upstream of rl keep their stages out of DVC's run-cache: {persisted}"


def test_the_closure_follows_lazy_imports_and_packages():
    """The test above is only as good as this: a function-level import counts, and so does each package's
    __init__.py on the way to a module."""
    code = {rel(p) for p in closure(REPO / "seed_core/stages/train_analyzer.py")}
    assert {
        "seed_core/envs/__init__.py",
        "seed_core/envs/alfworld/__init__.py",
        "seed_core/envs/alfworld/expert.py",
        "seed_core/sft.py",
        "seed_core/method/teachers.py",
    } <= code
    assert not any(f.startswith("seed_core/stages/rl/") for f in code)


def test_the_rl_stage_declares_its_paths_once():
    """dvc.yaml's rl stage names the files `stages.rl.PATHS` and `INIT` name (the flow's and the ranks' defaults)."""
    from seed_core.stages.rl import INIT, PATHS

    stage = dvc_stages()["rl"]
    outs = [o if isinstance(o, str) else next(iter(o)) for o in stage["outs"]]
    metrics = [next(iter(m)) if isinstance(m, dict) else m for m in stage.get("metrics", [])]
    assert sorted(outs + metrics) == sorted([PATHS.runs_dir, PATHS.out_dir, PATHS.plots, PATHS.metrics])
    manifests = [d for d in stage["deps"] if d.startswith(PATHS.manifest_dir + "/")]
    assert manifests and set(INIT.values()) <= set(stage["deps"])


@pytest.mark.parametrize("path", sorted((REPO / "tests").rglob("*.py")), ids=rel)
def test_no_test_imports_a_private_name(path):
    """Tests hold the library to its public names: a private one may change without notice."""
    bad = sorted(
        f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seed_core")
        for a in node.names
        if a.name.startswith("_")
    )
    assert not bad, f"{rel(path)} imports private names {bad}: test through the public API, or make them public"


def test_one_metrics_file_the_headline():
    """`dvc metrics show` prints one column per key of every declared metrics file: only the headline is one."""
    declared = [
        next(iter(m)) if isinstance(m, dict) else m for s in dvc_stages().values() for m in s.get("metrics", [])
    ]
    assert declared == ["metrics/headline.json"]
