"""A report row is one experiment: its data is the rows' content and the part of it taken. A run on a subset
never stands in for the whole data set's run, two files never share a row, and derived figures pair runs on the
same data only. The HTML page carries its plots; the CSV's numbers are in the units its titles name."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import shutil
from pathlib import Path

import mlflow
import pytest
from conftest import compose_config
from helpers.records import make_records
from helpers.report_runs import data_tags, log, sample_label
from mlflow.tracking import MlflowClient

from cupid_exp.data.loading import SAMPLE_FULL_PATH, SAMPLE_PATH
from cupid_exp.report import main
from cupid_exp.scoring.bootstrap import bootstrap_ci

SAMPLE = sample_label()


def report(store, capsys, *args: str) -> str:
    assert main(["--tracking-uri", store["uri"], "--cache-dir", str(store["root"] / "cache"), "--n-boot", "100",
                 *args]) == 0
    return capsys.readouterr().out


def rows_of(markdown: str, title_start: str) -> dict[str, dict[str, str]]:
    """The rows of the table whose title starts so, by their first cell (or first two, for a by-setting table)."""
    blocks = [b for b in markdown.split("### ")[1:] if b.startswith(title_start)]
    assert len(blocks) == 1, f"{len(blocks)} tables titled {title_start!r}"
    lines = [line for line in blocks[0].splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        key = cells[0] if header[1] != "setting" else f"{cells[0]} {cells[1]}"
        rows[key] = dict(zip(header, cells, strict=False))
    return rows


@pytest.fixture(scope="module")
def subset_store(tmp_path_factory) -> dict:
    """A full local × standard run, its oracle and summary runs, then the README's quick check: the same job with
    data.limit=1, newer than all of them."""
    root = tmp_path_factory.mktemp("subset")
    ids = {"standard": log(root, ["model=local"], make_records(seed=1), name="standard"),
           "oracle": log(root, ["model=local", "setting=oracle"], make_records(seed=2, shift=0.3), name="oracle"),
           "summary": log(root, ["model=local", "setting=summary"], make_records(seed=3, shift=0.1), name="summary"),
           "limit1": log(root, ["model=local", "data.limit=1"], make_records(n_personas=1, seed=4, shift=0.4)[:1],
                         name="limit1")}
    mlflow.set_tracking_uri(None)
    return {"uri": f"sqlite:///{root}/mlflow.db", "root": root, "ids": ids}


def test_a_newer_subset_run_does_not_stand_for_the_full_run(subset_store, capsys) -> None:
    ids = subset_store["ids"]
    metrics = {k: MlflowClient(subset_store["uri"]).get_run(v).data.metrics for k, v in ids.items()}
    assert metrics["limit1"]["inference/count/instances"] == 1  # the subset run really is the latest, on 1 instance
    out = report(subset_store, capsys)
    row = rows_of(out, f"Inference by model — data={SAMPLE}, evaluator=local")["local"]
    assert ids["standard"][:8] in row["runs"] and ids["limit1"][:8] not in row["runs"]
    assert row["n (all)"] == "85/90"
    assert f"not used: {ids['limit1'][:8]} (" in out and "a subset, data.limit=1; --subsets shows it" in out
    assert "subset data.limit=1" not in out.split("Notes:")[0]  # no table of the subset
    # the oracle gain recovered pairs the summary run with the full-data standard and oracle runs
    by_setting = rows_of(out, f"Inference by setting and instance type — data={SAMPLE}, evaluator=local")
    std, orc, summ = (metrics[k]["inference/f1"] for k in ("standard", "oracle", "summary"))
    assert by_setting["local summary"]["oracle gain recovered"] == f"{100 * (summ - std) / (orc - std):.0f}%"
    assert by_setting["local standard"]["run"] == ids["standard"][:8]


def test_subsets_on_request_get_their_own_marked_rows(subset_store, capsys) -> None:
    ids = subset_store["ids"]
    out = report(subset_store, capsys, "--subsets")
    full = rows_of(out, f"Inference by model — data={SAMPLE}, evaluator=local")
    assert ids["limit1"][:8] not in full["local"]["runs"]
    subset_label = SAMPLE[:-1] + "; subset data.limit=1]"
    subset = rows_of(out, f"Inference by model — data={subset_label}, evaluator=local")["local"]
    assert subset["runs"] == ids["limit1"][:8] and subset["n (all)"] == "1"
    assert subset["oracle"] == "–"  # the full data's oracle run is not put beside a 1-instance run
    assert f"Inference by setting and instance type — data={subset_label}" not in out  # nothing to pair it with


def test_a_subset_alone_is_shown_as_its_own_marked_row(tmp_path: Path, capsys) -> None:
    run = log(tmp_path, ["model=local", "data.limit=1"], make_records(n_personas=1, seed=4)[:1], name="limit1")
    mlflow.set_tracking_uri(None)
    out = report({"uri": f"sqlite:///{tmp_path}/mlflow.db", "root": tmp_path}, capsys)
    row = rows_of(out, f"Inference by model — data={SAMPLE[:-1]}; subset data.limit=1], evaluator=local")["local"]
    assert row["runs"] == run[:8]
    assert f"run {run[:8]} (local, standard) covers a subset, data.limit=1" in out


def test_two_local_files_are_two_rows_and_one_file_at_two_paths_is_one(tmp_path: Path, capsys) -> None:
    copy = tmp_path / "copy_of_full.jsonl"
    shutil.copyfile(SAMPLE_FULL_PATH, copy)
    small = log(tmp_path, ["model=local", "data=local", f"data.path={SAMPLE_PATH}"], make_records(seed=1),
                name="small")
    full = log(tmp_path, ["model=local", "data=local", f"data.path={SAMPLE_FULL_PATH}"], make_records(seed=2),
               name="full")
    again = log(tmp_path, ["model=local", "data=local", f"data.path={copy}"], make_records(seed=3), name="again")
    mlflow.set_tracking_uri(None)
    digests = {p: data_tags(compose_config(["data=local", f"data.path={p}"]))["dataset_digest"][:8]
               for p in (SAMPLE_PATH, SAMPLE_FULL_PATH)}
    assert digests[SAMPLE_PATH] != digests[SAMPLE_FULL_PATH]
    out = report({"uri": f"sqlite:///{tmp_path}/mlflow.db", "root": tmp_path}, capsys)
    small_row = rows_of(out, f"Inference by model — data=local [cupid_sample.jsonl #{digests[SAMPLE_PATH]}]")
    assert small_row["local"]["runs"] == small[:8]
    # the copy holds the same rows: one data set, named by both files, its latest run shown
    both = f"local [copy_of_full.jsonl = cupid_sample_full.jsonl #{digests[SAMPLE_FULL_PATH]}]"
    assert rows_of(out, f"Inference by model — data={both}")["local"]["runs"] == again[:8]
    assert f"not used: {full[:8]}" in out and f"not used: {small[:8]}" not in out


def test_html_is_one_page_with_its_plots_and_the_consoles_numbers(subset_store, capsys, tmp_path: Path) -> None:
    markdown = report(subset_store, capsys)
    target = tmp_path / "report.html"
    report(subset_store, capsys, "--format", "html", "--output", str(target), "--plots", str(tmp_path / "png"))
    page = target.read_text()
    images = re.findall(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    files = sorted((tmp_path / "png").glob("*.png"))
    assert len(images) == len(files) == 3  # one data set × evaluator × inference: by type, position, length
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in images)
    assert {base64.b64decode(data) for data in images} == {p.read_bytes() for p in files}
    assert "src='http" not in page and "src=\"http" not in page and ".png'" not in page  # nothing outside it
    assert ".scroll{overflow-x:auto" in page and page.count("<div class='scroll'><table") == page.count("<table")
    for cell in rows_of(markdown, "Inference by model")["local"].values():
        assert f"<td>{cell}</td>" in page


def test_csv_numbers_are_in_the_units_the_titles_name(subset_store, capsys) -> None:
    rows = list(csv.DictReader(io.StringIO(report(subset_store, capsys, "--format", "csv"))))
    f1 = [r for r in rows if r["table"].startswith("Inference by model") and r["column"] == "all"
          and r["metric"] == "f1"]
    assert len(f1) == 1 and "in %" in f1[0]["table"] and f1[0]["unit"] == "%" and f1[0]["data"] == SAMPLE
    cached = subset_store["root"] / "cache" / subset_store["ids"]["standard"] / "instances.jsonl"
    est = bootstrap_ci([json.loads(line) for line in cached.read_text().splitlines()], "f1", n_boot=100)
    assert float(f1[0]["value"]) == pytest.approx(100 * est.value)
    assert float(f1[0]["ci_low"]) == pytest.approx(100 * est.low)
    recovered = [r for r in rows if r["metric"] == "oracle_gain_recovered"]
    assert recovered and all(r["unit"] == "% of the oracle gain" for r in recovered)
    summary = [r for r in rows if r["table"].startswith("Inference by setting") and r["setting"] == "summary"
               and r["column"] == "all" and r["metric"] == "oracle_gain_recovered"]
    md = report(subset_store, capsys)
    shown = rows_of(md, "Inference by setting")["local summary"]["oracle gain recovered"]
    assert f"{float(summary[0]['value']):.0f}%" == shown
