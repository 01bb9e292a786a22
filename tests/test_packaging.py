"""cupid-exp installs as a package: the wheel carries conf/ and prompts/ (mapped into the package at build
time), and an installed copy runs a real job from any folder; every import is a declared dependency."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env, read_jsonl

from cupid_exp.testing.cupid_data import stub_overrides
from cupid_exp.testing.stub_llm_server import StubServer


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(PROJECT_ROOT)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("cupid_exp-*.whl")
    return built


def test_the_wheel_carries_conf_prompts_data_and_entry_points(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    shipped_conf = {f"cupid_exp/conf/{p.relative_to(PROJECT_ROOT / 'conf').as_posix()}"
                    for p in (PROJECT_ROOT / "conf").rglob("*.yaml") if "local" not in p.parts}
    shipped_prompts = {f"cupid_exp/prompts/{p.relative_to(PROJECT_ROOT / 'prompts').as_posix()}"
                       for p in (PROJECT_ROOT / "prompts").rglob("*.yaml")}
    assert shipped_conf and shipped_conf <= names
    assert shipped_prompts and shipped_prompts <= names
    assert {"cupid_exp/data/sample/cupid_sample.jsonl", "cupid_exp/reporting/paper_reference.yaml"} <= names
    assert not [n for n in names if n.startswith("cupid_exp/conf/local/") and n.endswith(".yaml")]
    assert "cupid-exp = cupid_exp.cli:main" in entry_points


def test_an_installed_copy_runs_a_job_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = cli_env(PYTHONPATH=str(site))
    where = subprocess.run([sys.executable, "-c", "import cupid_exp.resources as r; print(r.conf_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where) == site / "cupid_exp" / "conf"  # found inside the installed package, not the checkout
    with StubServer() as stub:
        proc = subprocess.run([sys.executable, "-m", "cupid_exp", *stub_overrides(stub.url), "data.limit=2",
                               "tracking=none", "runtime.progress=false", "paths.output_root=out"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (instances,) = (tmp_path / "out" / "runs").glob("*/*/instances.jsonl")
    assert len(read_jsonl(instances)) == 2


def test_the_console_script_works_from_any_folder(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("cupid-exp")
    proc = subprocess.run([str(script), "--cfg", "job", "model=gpt4o"], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "litellm_model: openai/gpt-4o-2024-08-06" in proc.stdout


def _imports(folder: Path) -> set[str]:
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def _declared() -> set[str]:
    """Top-level modules provided by the declared dependencies (core and extras)."""
    requires = importlib.metadata.requires("cupid-exp") or []
    names = {re.split(r"[\s;<>=!\[~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requires}
    modules: set[str] = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in names for d in dists):
            modules.add(module)
    return modules


# Optional backends imported lazily behind their extra, which CI may not install.
OPTIONAL = {"xllamacpp", "sentence_transformers", "vllm"}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    third_party = {m for m in _imports(PROJECT_ROOT / "cupid_exp")
                   if m not in sys.stdlib_module_names and m not in {"cupid_exp", "__future__"}}
    missing = sorted(third_party - _declared() - OPTIONAL)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    requires = " ".join(importlib.metadata.requires("cupid-exp") or [])
    for extra_module, dist in (("xllamacpp", "xllamacpp"), ("sentence_transformers", "sentence-transformers"),
                              ("vllm", "vllm")):
        assert dist in requires, f"{extra_module} must be declared as an extra"
