"""The report's and the diff's bad inputs, through the real CLI (``python -m cupid_exp.report``): the short run ids
the report prints resolve when unique; an unknown or ambiguous prefix, a filter matching nothing and a filter
MLflow cannot read are each one line, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import mlflow
import pytest
from helpers.cli_runner import PROJECT_ROOT, cli_env
from helpers.records import make_records
from mlflow.tracking import MlflowClient
from test_report import log

from cupid_exp.diff import main as diff_main


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """Two finished job runs, and enough other runs that some share a first digit (17 ids, 16 digits)."""
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root}/mlflow.db"
    a = log(root, ["model=gpt4o"], make_records(seed=1, n_personas=8), name="a")
    b = log(root, ["model=claude37"], make_records(seed=2, n_personas=8, shift=0.1), name="b")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("cupid").experiment_id
    others = [client.create_run(experiment, run_name=f"other{i}").info.run_id for i in range(15)]
    mlflow.set_tracking_uri(None)
    return {"uri": uri, "root": root, "a": a, "b": b, "ids": [a, b, *others]}


def report(store: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cupid_exp.report", "--tracking-uri", store["uri"],
                           "--cache-dir", str(store["root"] / "cache"), "--n-boot", "50", *args],
                          cwd=PROJECT_ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_compare_takes_the_eight_digit_ids_the_report_prints(store) -> None:
    a, b = store["a"], store["b"]
    proc = report(store, "--compare", a[:8], b[:8])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"A = {a[:8]} (gpt4o" in proc.stdout and f"B = {b[:8]} (claude37" in proc.stdout
    assert f"python -m cupid_exp.diff {a} {b}" in proc.stdout  # the full ids, resolved


def unused_prefix(ids: list[str]) -> str:
    return next(p for p in (f"{i:08x}" for i in range(1000)) if not any(x.startswith(p) for x in ids))


def test_compare_with_an_unknown_prefix_is_one_line(store) -> None:
    prefix = unused_prefix(store["ids"])
    line = one_error_line(report(store, "--compare", store["a"][:8], prefix))
    assert line == f"--compare: no run id starts with {prefix!r} in {store['uri']}"


def test_compare_with_an_ambiguous_prefix_names_the_candidates(store) -> None:
    from cupid_exp.reporting.runs import LISTED_CANDIDATES

    digit, count = Counter(x[0] for x in store["ids"]).most_common(1)[0]
    assert count >= 2  # 17 ids over 16 digits
    line = one_error_line(report(store, "--compare", digit, store["b"][:8]))
    assert line.startswith(f"--compare: run id prefix {digit!r} is ambiguous in {store['uri']}: it starts ")
    named = [x for x in store["ids"] if x in line]
    assert len(named) == min(count, LISTED_CANDIDATES) and all(x.startswith(digit) for x in named)
    assert line.endswith("; give more digits")


def test_the_diff_resolves_through_the_same_resolver(store, capsys) -> None:
    from cupid_exp.reporting.runs import RunIdError, resolve_run_id

    a, b = store["a"], store["b"]
    assert resolve_run_id(store["uri"], a[:6]) == a
    assert diff_main([a[:8], b[:8], "--tracking-uri", store["uri"]]) == 0
    assert "model=claude37" in capsys.readouterr().out
    prefix = unused_prefix(store["ids"])
    assert diff_main([a[:8], prefix, "--tracking-uri", store["uri"]]) == 2
    assert capsys.readouterr().err.strip() == f"no run id starts with {prefix!r} in {store['uri']}"
    with pytest.raises(RunIdError, match="not an MLflow run id"):
        resolve_run_id(store["uri"], "A%")
    mlflow.set_tracking_uri(None)


def test_a_filter_matching_nothing_is_one_line_and_writes_no_file(store, tmp_path: Path) -> None:
    out = tmp_path / "report.csv"
    filter_string = "params.`model.name` = 'nobody'"
    line = one_error_line(report(store, "--filter", filter_string, "--format", "csv", "--output", str(out)))
    assert line == (f"no job run in experiment 'cupid' at {store['uri']} matching --filter {filter_string!r}: "
                    f"nothing to report, nothing written")
    assert not out.exists()


def test_a_filter_mlflow_cannot_read_is_one_line(store) -> None:
    line = one_error_line(report(store, "--filter", "params.`model.name` = 'gpt4o"))
    assert line.startswith("--filter \"params.`model.name` = 'gpt4o\" is not an MLflow filter string: ")


@pytest.mark.parametrize("args", [[], ["--compare", "abc", "def"]])
def test_a_report_where_no_store_is_makes_none_and_says_how_to_point_it(tmp_path: Path, monkeypatch, capsys,
                                                                         args: list[str]) -> None:
    """Run from another folder, the report finds no store at the default URI: one line naming it and how to point
    the report elsewhere, exit 2, and no empty store left behind."""
    from cupid_exp.reporting.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "no MLflow store at sqlite:///outputs/mlflow.db" in err and len(err.splitlines()) == 1
    assert "--tracking-uri" in err and "MLFLOW_TRACKING_URI" in err
    assert list(tmp_path.iterdir()) == []  # no outputs/mlflow.db made here
