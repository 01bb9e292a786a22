"""A run of ``runtime.epochs=3`` in the report: its row says so, its intervals resample epochs within personas, and
``--compare`` against a one-epoch run names the epochs and pairs epoch with epoch."""

from __future__ import annotations

import mlflow
import pytest
from helpers.records import make_records
from helpers.report_runs import log, sample_label

from cupid_exp.report import main
from cupid_exp.scoring.bootstrap import bootstrap_ci

EPOCHS = 3


def _epochs(n: int) -> list[dict]:
    """Three draws of the same 12 personas' instances (each epoch scored a little differently)."""
    out = []
    for epoch in range(n):
        for r in make_records(n_personas=12, seed=10 + epoch, shift=0.05 * epoch, fail_every=1000):
            out.append({**r, "key": f"{r['key']}#{epoch}", "epoch": epoch,
                        "persona_id": r["persona_id"]})
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("epochs")
    records = _epochs(EPOCHS)
    ids = {"one": log(root, ["model=gpt4o"], make_records(n_personas=12, seed=10, fail_every=1000), name="one"),
           "three": log(root, ["model=gpt4o", f"runtime.epochs={EPOCHS}"], records, name="three")}
    mlflow.set_tracking_uri(None)
    return {"uri": f"sqlite:///{root}/mlflow.db", "cache": root / "cache", "ids": ids, "records": records}


def report(store, capsys, *args: str) -> str:
    assert main(["--tracking-uri", store["uri"], "--cache-dir", str(store["cache"]), "--n-boot", "200", *args]) == 0
    return capsys.readouterr().out


def test_a_run_of_three_epochs_is_its_own_row_with_intervals_over_epochs(store, capsys) -> None:
    out = report(store, capsys)
    block = out.split(f"### Inference by model — data={sample_label()}, evaluator=local")[1].split("###")[0]
    rows = {line.split("|")[1].strip(): line for line in block.splitlines() if line.startswith("| gpt4o")}
    assert set(rows) == {"gpt4o", f"gpt4o · epochs={EPOCHS}"}
    two_stage = bootstrap_ci(store["records"], "f1", n_boot=200)
    assert two_stage.fmt(100) in rows[f"gpt4o · epochs={EPOCHS}"]
    persona_only = bootstrap_ci([{**r, "epoch": None} for r in store["records"]], "f1", n_boot=200)
    assert persona_only.fmt(100) != two_stage.fmt(100)  # the row's interval is the one over epochs too
    assert "epochs=K rows: each instance ran K times" in out


def test_compare_names_the_epochs_and_pairs_epoch_with_epoch(store, capsys) -> None:
    out = report(store, capsys, "--compare", store["ids"]["one"], store["ids"]["three"])
    assert f"runtime.epochs: unset → {EPOCHS}" in out
    assert f"epochs: A 1, B {EPOCHS}; epoch e of A is paired with epoch e of B" in out
    f1 = next(line for line in out.splitlines() if line.startswith("| inference | all") and "| f1 " in line)
    cells = [c.strip() for c in f1.strip("|").split("|")]
    # A's one draw is paired with B's epoch 0 (the same records here: no difference); B's other epochs stand apart
    assert cells[5:9] == ["+0.0", "[+0.0, +0.0]", "1", "36 (12)"] and cells[10] == "72"
