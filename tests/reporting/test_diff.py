"""Config diff: the printed overrides, applied after A's, compose exactly B's resolved config."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml
from conftest import compose_config
from helpers.mlflow_runs import log_job_run
from omegaconf import OmegaConf

from cupid_exp.diff import main
from cupid_exp.reporting.diff import RunSpec, diff_runs, format_value, leaf_diffs, render, spec_from_job_dir


def resolved(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose_config(overrides), resolve=True)


def spec(overrides: list[str]) -> RunSpec:
    cfg = compose_config(overrides, return_hydra_config=True)
    choices = {k: v for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items()
               if v is not None and not k.startswith("hydra/")}
    return RunSpec(" ".join(overrides), resolved(overrides), choices, list(overrides))


PAIRS = [
    ([], ["model=gpt4o"]),
    (["model=local", "data.limit=2"],
     ["model=gpt4o", "data.limit=3", "+model.params.top_p=0.9", "~model.params.max_tokens",
      "evaluator=gpt4o", "llm@evaluator.judge=local", "data.instance_types=[changing,consistent]"]),
    (["evaluator=gpt4o"], []),  # back to the defaults
    (["paths.output_root=/a"], ["paths.output_root=/b", "tracking.uri=sqlite:////elsewhere.db"]),
    ([], ["model=openai_compatible", "model.litellm_model=openai/my-model",
          "model.api_base='http://127.0.0.1:8000/v1'", "tracking.run_name='it\\'s \"odd\", {x: 1} \\\\'",
          "calls.timeout=12.5", "runtime.reask=0", "data.strict=true", "+model.params.stop=['a b',null]"]),
    (["model=claude37"], ["model=claude37", "model.params.temperature=0.5",
                          "+model.params.thinking={type:enabled,budget_tokens:2048}"]),
    (["tracking=none"], ["tracking=mlflow", "runtime.failure_policy=zero"]),
    # per-setting schemas: a setting choice brings its own keys; a task choice brings its parts
    (["setting=oracle"], ["setting=retrieval", "setting.retriever=embedding", "setting.top_k=4"]),
    (["setting=retrieval", "setting.top_k=3"], ["setting=retrieval", "task=both"]),
]


@pytest.mark.parametrize("a_overrides, b_overrides", PAIRS)
def test_round_trip_composes_b(a_overrides, b_overrides) -> None:
    a, b = spec(a_overrides), spec(b_overrides)
    diff = diff_runs(a, b)
    assert diff.verified, diff.unreproduced
    assert diff.base_overrides == a_overrides
    assert resolved(a_overrides + diff.overrides) == resolved(b_overrides)
    if resolved(a_overrides) != resolved(b_overrides):
        assert diff.overrides


def test_an_override_inside_a_group_b_chose_otherwise_is_left_out_of_as(capsys) -> None:
    """standard's schema has no top_k, so A's setting.top_k=3 cannot stand after setting=standard."""
    a_ov, b_ov = ["setting=retrieval", "setting.top_k=3", "data.limit=2"], ["setting=standard", "task=both"]
    diff = diff_runs(spec(a_ov), spec(b_ov))
    assert diff.verified, diff.unreproduced
    assert diff.superseded == ["setting.top_k=3"] and diff.base_overrides == a_ov
    assert diff.overrides == ["setting=standard", "task=both", "data.limit=null"]
    kept = [o for o in a_ov if o not in diff.superseded]
    assert resolved(kept + diff.overrides) == resolved(b_ov)
    assert resolved(shlex.split(diff.command())[3:]) == resolved(b_ov)
    text = render(diff, spec(a_ov), spec(b_ov))
    assert "# leave out of A's overrides (inside a group B chose otherwise): setting.top_k=3" in text
    # an override inside a group that stays is never left out
    diff = diff_runs(spec(["setting=retrieval", "setting.top_k=3"]), spec(["setting=retrieval", "setting.top_k=5"]))
    assert diff.superseded == [] and diff.overrides == ["setting.top_k=5"]


def test_a_whole_group_change_is_printed_as_the_choice() -> None:
    diff = diff_runs(spec(["model=local"]), spec(["model=gpt4o"]))
    assert diff.overrides == ["model=gpt4o"]  # the evaluator it implies (gpt4o) comes with it, unprinted
    diff = diff_runs(spec(["model=local"]), spec(["model=gpt4o", "evaluator=local"]))
    assert diff.overrides == ["model=gpt4o", "evaluator=local"]  # an explicit choice against the default stays
    diff = diff_runs(spec([]), spec(["evaluator=gpt4o", "llm@evaluator.judge=local"]))
    assert diff.overrides == ["evaluator=gpt4o", "llm@evaluator.judge=local"]


def test_only_sources_of_interpolations_are_printed() -> None:
    diff = diff_runs(spec(["paths.output_root=/a"]), spec(["paths.output_root=/b"]))
    assert diff.overrides == ["paths.output_root=/b"]  # tracking.uri, cache_dir, ... follow
    diff = diff_runs(spec([]), spec(["tracking.uri=sqlite:////x.db"]))
    assert diff.overrides == ["tracking.uri=sqlite:////x.db"]


def test_identical_configs_have_no_overrides() -> None:
    diff = diff_runs(spec(["model=gpt4o"]), spec(["model=gpt4o"]))
    assert diff.overrides == [] and diff.verified and not diff.digests


@pytest.mark.parametrize("value", ["plain", "with space", "it's", "back\\slash\\", "true", "null", "1.5", "",
                                   "${data.name}", "a:b/c@d", "é", 3, -2, 0.1, 1e-07, True, None,
                                   ["x", 1, None], {"a": 1, "b": "c d"}])
def test_format_value_round_trips_through_hydra(value) -> None:
    cfg = compose_config([f"+model.params.x={format_value(value)}"])
    got = OmegaConf.to_container(cfg.model.params, resolve=False)["x"]
    assert got == value and type(got) is type(value)


def test_leaf_diffs_skip_redacted_values() -> None:
    assert leaf_diffs({"k": {"api_key": "***", "n": 1}}, {"k": {"api_key": "sk-x", "n": 2}}) == \
        [leaf_diffs({"n": 1}, {"n": 2}, "k.")[0]]


def write_job_dir(path: Path, overrides: list[str], *, digest: str = "d1") -> Path:
    """A job dir as Hydra writes it: unresolved config.yaml, hydra.yaml, overrides.yaml (+ our metrics.json)."""
    cfg = compose_config(overrides, return_hydra_config=True)
    hydra_dir = path / ".hydra"
    hydra_dir.mkdir(parents=True)
    hydra_cfg = OmegaConf.create({"hydra": OmegaConf.to_container(cfg.hydra, resolve=False)})
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    OmegaConf.save(cfg, hydra_dir / "config.yaml", resolve=False)
    OmegaConf.save(hydra_cfg, hydra_dir / "hydra.yaml", resolve=False)
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (path / "metrics.json").write_text(json.dumps({"prompts_digest": "p1", "data": {"digest": digest}}))
    return path


def test_cli_on_job_dirs_prints_pasteable_overrides(tmp_path: Path, capsys) -> None:
    a_ov = ["model=local", "paths.output_root=/runs/a"]
    b_ov = ["model=gpt4o", "paths.output_root=/runs/b", "data.limit=5", "tracking.run_name='two words'"]
    a = write_job_dir(tmp_path / "a", a_ov)
    b = write_job_dir(tmp_path / "b", b_ov, digest="d2")
    assert "${paths.output_root}" in (a / ".hydra" / "config.yaml").read_text()  # really unresolved
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    printed = [tok for line in lines for tok in shlex.split(line)]
    assert sorted(printed) == sorted(["model=gpt4o", "paths.output_root=/runs/b", "data.limit=5",
                                      "tracking.run_name='two words'"])
    assert resolved(a_ov + printed) == resolved(b_ov)
    assert "# dataset_digest: d1 -> d2" in out and "prompts_digest" not in out  # only what differs
    assert "# verified" in out

    assert main([str(a), str(b), "--shell"]) == 0
    command = shlex.split(capsys.readouterr().out)
    assert command[:3] == ["python", "-m", "cupid_exp"]
    assert resolved(command[3:]) == resolved(b_ov)
    keys = [token.split("=", 1)[0] for token in command[3:]]
    assert len(keys) == len(set(keys)), command  # not 'model=local ... model=gpt4o'


def test_a_job_dirs_git_commit_is_read_from_its_metrics_json(tmp_path: Path) -> None:
    a = write_job_dir(tmp_path / "a", ["data.limit=2"])
    saved = json.loads((a / "metrics.json").read_text())
    saved["git"] = {"git_commit": "c0ffee", "git_dirty": "true", "cupid_exp_version": "0"}  # as write_outputs does
    (a / "metrics.json").write_text(json.dumps(saved))
    b = write_job_dir(tmp_path / "b", ["data.limit=3"])
    assert spec_from_job_dir(a).digests["git_commit"] == "c0ffee (dirty)"
    diff = diff_runs(spec_from_job_dir(a), spec_from_job_dir(b))
    assert "not recorded, so not compared: git_commit (B)" in diff.notes


def test_job_dir_whose_conf_changed_since_is_noted(tmp_path: Path) -> None:
    a = write_job_dir(tmp_path / "a", ["data.limit=2"])
    recorded = yaml.safe_load((a / ".hydra" / "config.yaml").read_text())
    recorded["runtime"]["reask"] = 7  # the conf/ of that day had another default
    (a / ".hydra" / "config.yaml").write_text(yaml.safe_dump(recorded))
    diff = diff_runs(spec_from_job_dir(a), spec(["data.limit=3"]))
    assert diff.overrides == ["data.limit=3"] and diff.verified
    assert any("runtime.reask" in n and "compose differently" in n for n in diff.notes)


def test_conf_drift_since_both_runs_is_kept_apart_from_their_differences(tmp_path: Path, capsys) -> None:
    a = write_job_dir(tmp_path / "a", ["data.limit=2"])
    b = write_job_dir(tmp_path / "b", ["data.limit=3"])
    for job in (a, b):  # both ran when conf/ had reask=7; today's default is different
        recorded = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        recorded["runtime"]["reask"] = 7
        (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(recorded))
    diff = diff_runs(spec_from_job_dir(a), spec_from_job_dir(b))
    assert diff.overrides == ["data.limit=3"] and diff.drift == ["runtime.reask=7"] and diff.verified
    assert shlex.split(diff.command())[3:] == ["data.limit=3", "runtime.reask=7"]  # A's data.limit=2 is set again
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "data.limit=3\n# conf/ has changed since these runs" in out and "\nruntime.reask=7\n" in out


def test_keys_added_to_conf_since_both_runs_are_not_differences(tmp_path: Path) -> None:
    a = write_job_dir(tmp_path / "a", ["data.limit=2"])
    b = write_job_dir(tmp_path / "b", ["data.limit=3", "runtime.failure_policy=zero"])
    for job in (a, b):  # recorded before runtime.progress existed
        recorded = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        del recorded["runtime"]["progress"]
        (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(recorded))
    diff = diff_runs(spec_from_job_dir(a), spec_from_job_dir(b))
    # leaves come in the composed config's key order (the job schema's runtime before the run's data)
    assert diff.overrides == ["runtime.failure_policy=zero", "data.limit=3"] and diff.drift == []
    assert diff.verified and diff.added_since == ["runtime.progress"]
    # but a key only B's record lacks is a difference no override can make: not verified
    recorded = yaml.safe_load((b / ".hydra" / "config.yaml").read_text())
    del recorded["runtime"]["reask"]
    (b / ".hydra" / "config.yaml").write_text(yaml.safe_dump(recorded))
    diff = diff_runs(spec_from_job_dir(a), spec_from_job_dir(b))
    assert not diff.verified and diff.unreproduced == ["runtime.reask"]


def log_run(cfg_overrides: list[str], tags: dict) -> str:
    cfg = compose_config(cfg_overrides, return_hydra_config=True)
    return log_job_run(cfg, run_name="t", tags=tags, metrics={"inference/f1": 0.5},
                       table=pd.DataFrame([{"key": "k"}]))


def test_cli_on_mlflow_runs_reconstructs_a_and_reports_digests(tmp_path: Path, capsys, monkeypatch) -> None:
    root = f"paths.output_root={tmp_path}"
    a_ov = [root, "model=gpt4o", "evaluator=local", "data.limit=4"]
    b_ov = [root, "model=claude37", "evaluator=gpt4o", "llm@evaluator.matcher=local",
            "runtime.failure_policy=zero"]
    run_a = log_run(a_ov, {"dataset_digest": "aaa", "prompts_digest": "p"})
    run_b = log_run(b_ov, {"dataset_digest": "bbb", "prompts_digest": "p"})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main([run_a, run_b, "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    printed = [tok for line in out.splitlines() if line and not line.startswith("#") for tok in shlex.split(line)]
    assert "model=claude37" in printed and "evaluator=gpt4o" in printed
    assert "llm@evaluator.matcher=local" in printed and "runtime.failure_policy=zero" in printed
    assert "# dataset_digest: aaa -> bbb" in out and "git_commit" not in out
    assert "reconstructed as:" in out and "# verified" in out
    base = shlex.split(out.split("reconstructed as: ")[1].splitlines()[0])
    # the MLflow record of A is resolved and redacted; compose(reconstructed A + diff) must equal B's
    assert resolved(base + printed) == resolved(b_ov)
    # without --tracking-uri the store is $MLFLOW_TRACKING_URI's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main([run_a, run_b]) == 0
    assert capsys.readouterr().out == out
    mlflow.set_tracking_uri(None)


def test_cli_rejects_what_is_neither_a_dir_nor_a_run_id(capsys) -> None:
    assert main(["nope", "also-nope"]) == 2
    assert "neither a job output dir nor an MLflow run id" in capsys.readouterr().err
