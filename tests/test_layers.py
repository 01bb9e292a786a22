"""The package's layers, read from its imports: the config schema is a leaf, the model layer (``llm/``) stands on
it and on nothing higher, no two modules import each other, however roundabout, the entry is the top (only the
programs import it), and the layers ``docs/architecture.md`` names hold.

The import graph is read with ``ast`` from every module under ``cupid_exp/``, imports inside functions included
(they run too, only later); imports under ``if TYPE_CHECKING:`` are left out (they never run: they name a type for
the reader and the type checker).
"""

from __future__ import annotations

import ast
import graphlib
import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import tomllib

PACKAGE = Path(__file__).resolve().parents[1] / "cupid_exp"

#: what the config schema and the model layer may stand on (modules, and packages with their modules): the
#: foundations, which import nothing of cupid_exp but each other (and the package's own ``__init__``)
BELOW_CONFIG = ("cupid_exp", "cupid_exp.errors", "cupid_exp.aside", "cupid_exp.config_checks",
                "cupid_exp.decoding_params", "cupid_exp.secrets", "cupid_exp.outputs", "cupid_exp.data",
                "cupid_exp.results", "cupid_exp.resources")


def within(module: str, roots: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``roots`` or inside one of them (``cupid_exp`` itself holds only itself)."""
    return any(module == r or (r != "cupid_exp" and module.startswith(r + ".")) for r in roots)


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for child in node.body for inner in ast.walk(child))
    return skipped


@lru_cache(maxsize=1)
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the cupid_exp modules it imports (a name imported from a package counts as its submodule when
    there is one), with the packages above each (importing ``a.b.c`` runs ``a/b/__init__.py`` first)."""
    modules = _module_names()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_only(tree)
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names if alias.name.startswith("cupid_exp"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                if base.startswith("cupid_exp"):
                    targets.update(known(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules
                                   else known(base) for alias in node.names)
        parents = {t.rsplit(".", i)[0] for t in targets if t for i in range(1, t.count(".") + 1)} & set(modules)
        graph[name] = frozenset(t for t in targets | parents if t and t != name)
    return graph


def reached(start: str) -> set[str]:
    """Every module that importing ``start`` (and calling into it) can import."""
    graph, seen, todo = import_graph(), set(), [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_graph_sees_lazy_imports() -> None:
    """A sanity check of the reader: ``entry`` imports ``config_store`` inside a function only."""
    assert "cupid_exp.config_store" in import_graph()["cupid_exp.entry"]


def test_config_is_a_leaf_of_foundations() -> None:
    above = [m for m in reached("cupid_exp.config") if not within(m, BELOW_CONFIG)]
    assert not above, sorted(above)


def test_llm_imports_nothing_above_config() -> None:
    llm = [m for m in import_graph() if within(m, ("cupid_exp.llm",))]
    above = {m for start in llm for m in reached(start)
             if not within(m, ("cupid_exp.llm", "cupid_exp.config", *BELOW_CONFIG))}
    assert not above, sorted(above)


def test_importing_and_checking_the_config_loads_no_task_setting_or_model_module() -> None:
    """In a fresh interpreter: the schema imported and every check a value runs (the decoding parameters', the
    task's) loads nothing of the tasks, the settings or the model layer."""
    script = """
import json, sys
from cupid_exp.config import (CallsConfig, DataConfig, EvaluatorConfig, ModelConfig, RuntimeConfig, TaskConfig,
                              TrackingConfig,
                              check_tree)
model = ModelConfig(name="m", litellm_model="openai/m", params={"temperature": 0, "max_tokens": 8})
check_tree(model, "model")
check_tree(EvaluatorConfig(name="e", decomposer=model, matcher=model, judge=model), "evaluator")
check_tree(TaskConfig(name="inference", parts=["inference"]), "task")
check_tree(RuntimeConfig(), "runtime")
check_tree(CallsConfig(cache_dir="c"), "calls")
check_tree(DataConfig(name="sample", source="sample"), "data")
check_tree(TrackingConfig(uri="sqlite:///x.db"), "tracking")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("cupid_exp"))))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    upper = [m for m in loaded if m.startswith(("cupid_exp.tasks", "cupid_exp.settings", "cupid_exp.llm"))]
    assert "cupid_exp.config" in loaded and not upper, upper


def package_of(module: str) -> str:
    """``cupid_exp.tracking.mlflow`` -> ``cupid_exp.tracking``; a top-level module is its own package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else module


def test_no_circle_among_the_packages() -> None:
    """Packages and top-level modules in one order: none imports, even lazily, one that imports it back."""
    arrows: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        arrows.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if t != "cupid_exp" and package_of(t) != package_of(module))
    try:
        tuple(graphlib.TopologicalSorter(arrows).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"packages importing each other: {' -> '.join(exc.args[1])}") from None


def imports_package(module: str, top: str) -> bool:
    """Whether ``module`` imports the third-party package ``top`` (``mlflow``, ``pytest``) at all, lazily included."""
    tree = ast.parse(_module_names()[module].read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    return any(id(node) not in skipped and (
        isinstance(node, ast.Import) and any(a.name.split(".")[0] == top for a in node.names)
        or isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == top)
        for node in ast.walk(tree))


def test_durability_stands_apart_from_mlflow_publishing() -> None:
    """The journal, ledger, lock and signals reach neither ``tracking`` nor MLflow: a job resumes without them."""
    durability = [m for m in import_graph() if within(m, ("cupid_exp.durability",))]
    assert len(durability) >= 5
    reach = set(durability).union(*(reached(m) for m in durability))
    assert not [m for m in reach if within(m, ("cupid_exp.tracking", "cupid_exp.reporting", "cupid_exp.job"))]
    assert not [m for m in reach if imports_package(m, "mlflow")]
    assert imports_package("cupid_exp.tracking.mlflow", "mlflow")  # the check can see one


def test_the_shipped_test_tools_need_no_pytest_and_the_runner_never_imports_them() -> None:
    """``cupid_exp.testing`` (the stub and fault servers) works in a plain install; no job depends on it."""
    testing = [m for m in import_graph() if within(m, ("cupid_exp.testing",))]
    assert {"cupid_exp.testing.stub_llm_server", "cupid_exp.testing.fault_server"} <= set(testing)
    reach = set(testing).union(*(reached(m) for m in testing))
    assert not [m for m in reach if imports_package(m, "pytest")]
    users = [m for m, targets in import_graph().items()
             if not within(m, ("cupid_exp.testing",)) and any(within(t, ("cupid_exp.testing",)) for t in targets)]
    assert not users, users


def test_the_model_layer_takes_the_calls_group_not_the_runtime_config() -> None:
    """``LLMClient`` and the ``llm/`` helpers are handed ``CallsConfig``; none of them names ``RuntimeConfig``."""
    naming = []
    for module, path in _module_names().items():
        if within(module, ("cupid_exp.llm",)):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if any(isinstance(node, ast.Name) and node.id == "RuntimeConfig"
                   or isinstance(node, ast.alias) and node.name == "RuntimeConfig" for node in ast.walk(tree)):
                naming.append(module)
    assert not naming, naming
    assert "CallsConfig" in _module_names()["cupid_exp.llm.client"].read_text(encoding="utf-8")


def test_no_circle_among_the_modules() -> None:
    """No module imports, even lazily, one that imports it back. A module's own packages do not count as its
    imports: Python runs ``a/__init__.py`` before ``a/b.py``, and a package re-exporting its modules is no circle;
    ``from cupid_exp.a import name`` in ``a/b.py`` (a name ``a`` re-exports) counts."""
    arrows = {module: {t for t in targets if not module.startswith(t + ".") and t != "cupid_exp"}
              for module, targets in import_graph().items()}
    try:
        tuple(graphlib.TopologicalSorter(arrows).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"modules importing each other: {' -> '.join(exc.args[1])}") from None


def programs() -> set[str]:
    """The modules ``[project.scripts]`` runs, and ``python -m cupid_exp``."""
    scripts = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    return {target.split(":")[0] for target in scripts.values()} | {"cupid_exp.__main__"}


def test_the_entry_is_the_top() -> None:
    """Only the programs import ``cupid_exp.entry``; the lifecycle (``job``, ``evaluation``, ...) is below it and
    takes ``Outcome``/``Interrupted`` from ``cupid_exp.errors``. Nothing imports a program but ``__main__``."""
    graph, tops = import_graph(), programs()
    assert {"cupid_exp.cli", "cupid_exp.synthesize"} <= tops
    entry_users = sorted(m for m, targets in graph.items() if "cupid_exp.entry" in targets and m not in tops)
    assert not entry_users, entry_users
    program_users = sorted((m, sorted(targets & tops)) for m, targets in graph.items()
                           if targets & tops and m != "cupid_exp.__main__")
    assert not program_users, program_users


def documented_layers() -> list[tuple[str, list[str]]]:
    """``docs/architecture.md``'s layers, bottom first: each a numbered line ``N. **name**: `module`, ... — why``."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    return [(name, [f"cupid_exp.{m}" for m in re.findall(r"`([\w.]+)`", modules)])
            for name, modules in re.findall(r"^\d+\. \*\*([^*]+)\*\*: (.*?) — ", text, re.MULTILINE)]


def test_the_documented_layers_hold() -> None:
    """Every module sits in one layer of ``docs/architecture.md`` (by its top-level module or package), and
    imports, even lazily, its own layer and those below only."""
    layers = documented_layers()
    assert [name for name, _ in layers][:3] == ["foundations", "config", "model layer"]
    level = {top: i for i, (_, tops) in enumerate(layers) for top in tops}
    assert len(level) == sum(len(tops) for _, tops in layers), "a module named in two layers"

    def layer_of(module: str) -> int | None:
        return level.get(module) if module in level else level.get(".".join(module.split(".")[:2]))

    graph = import_graph()
    assert not set(level) - set(graph), f"names in docs/architecture.md that are no module: {set(level) - set(graph)}"
    unplaced = sorted(m for m in graph if m != "cupid_exp" and layer_of(m) is None)
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"
    upward = sorted((m, t) for m, targets in graph.items() if m != "cupid_exp"
                    for t in targets if t != "cupid_exp" and layer_of(t) > layer_of(m))
    assert not upward, upward
