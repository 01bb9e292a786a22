"""Every config choice composes against the schema; bad choices and keys fail before any call."""

from __future__ import annotations

import pytest
import yaml
from conftest import CONF_DIR, compose_config
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from cupid_exp.config import ModelConfig
from cupid_exp.config_checks import check_known_keys
from cupid_exp.errors import ConfigError

GROUPS = ["model", "evaluator", "task", "setting", "data", "tracking", "runtime"]


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("group,choice", [(g, c) for g in GROUPS for c in choices(g)])
def test_every_choice_composes(group: str, choice: str) -> None:
    overrides = [f"{group}={choice}"]
    if (group, choice) == ("data", "local"):
        overrides.append("data.path=/tmp/x.jsonl")
    cfg = compose_config(overrides)
    OmegaConf.to_object(cfg)  # resolves and type-checks every field (MISSING would raise)
    if group == "model":  # a subject choice is the conf/llm/ config it names (model=claude -> claude37)
        included = yaml.safe_load((CONF_DIR / "model" / f"{choice}.yaml").read_text())["defaults"][0]["/llm@_here_"]
        assert cfg.model.name == included
        assert "/" in cfg.model.litellm_model


@pytest.mark.parametrize("choice", choices("llm"))
def test_every_llm_config_composes_in_an_evaluator_role(choice: str) -> None:
    cfg = compose_config(["evaluator=gpt4o", f"llm@evaluator.judge={choice}"])
    OmegaConf.to_object(cfg)
    assert cfg.evaluator.judge.name == choice and cfg.evaluator.name == "gpt4o"


def test_paper_models_are_shipped_with_table8_decoding() -> None:
    models = set(choices("model"))
    paper = {"gpt4o", "o3_mini", "claude37", "claude35", "llama405b", "mistral7b", "qwen72b", "deepseek_r1",
             "gemini_flash_thinking", "gemini_pro"}
    assert paper <= models
    # Table 8 prints 2024-08-07, a snapshot OpenAI never had: conf/llm/gpt4o.yaml says why it sends 08-06
    assert compose_config(["model=gpt4o"]).model.litellm_model.endswith("gpt-4o-2024-08-06")
    assert "temperature" not in compose_config(["model=o3_mini"]).model.params
    claude37 = compose_config(["model=claude37"]).model.params
    assert claude37.temperature == 1 and claude37.thinking.budget_tokens == 1024
    assert compose_config(["model=mistral7b"]).model.params.temperature == 0


def test_evaluator_roles_are_model_configs() -> None:
    cfg = compose_config(["evaluator=gpt4o"])
    for role in ("decomposer", "matcher", "judge"):
        assert cfg.evaluator[role].litellm_model == "openai/gpt-4o-2024-11-20"
        assert cfg.evaluator[role].params.temperature == 0
    swapped = compose_config(["evaluator=gpt4o", "llm@evaluator.decomposer=claude35"])
    assert swapped.evaluator.decomposer.name == "claude35"
    assert swapped.evaluator.matcher.name == "gpt4o_eval"


def test_defaults_are_the_offline_demo() -> None:
    cfg = compose_config()
    assert (cfg.model.name, cfg.evaluator.name, cfg.data.name, cfg.task.name, cfg.setting.name) == (
        "local", "local", "sample", "inference", "standard")
    assert cfg.tracking.uri.startswith("sqlite:///")


def test_unknown_choice_fails_with_the_options() -> None:
    with pytest.raises((MissingConfigException, ConfigCompositionException)) as err:
        compose_config(["model=gpt5-turbo-ultra"])
    assert "gpt5-turbo-ultra" in str(err.value)


def test_unknown_key_and_wrong_type_fail_against_the_schema() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["model.temprature=0"])
    assert "temprature" in str(err.value)
    # a group YAML with a misspelt key is rejected the same way when merged into its schema
    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(OmegaConf.structured(ModelConfig), {"name": "x", "litellm_model": "a/b", "temprature": 0})
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config(["model.max_concurrency=many"])


def test_how_calls_are_made_and_how_the_job_runs_are_two_groups() -> None:
    """``calls.*`` is the slice of the config the model layer reads, ``runtime.*`` what only the job reads: one class
    of 24 fields mixed both (a 15-field copy of the call half was built from it for the clients)."""
    import dataclasses

    from cupid_exp.config import CallsConfig, RuntimeConfig

    cfg = OmegaConf.to_object(compose_config(["calls.num_retries=7", "calls.timeout=12", "calls.batch=true",
                                              "calls.max_cost_usd=3", "runtime.failure_policy=zero"]))
    assert isinstance(cfg.calls, CallsConfig) and isinstance(cfg.runtime, RuntimeConfig)
    assert (cfg.calls.num_retries, cfg.calls.timeout, cfg.calls.batch, cfg.calls.max_cost_usd) == (7, 12, True, 3)
    assert cfg.runtime.failure_policy == "zero"
    job_only = {"failure_policy", "max_failed_fraction", "retry_failed", "resume", "workers", "progress",
                "progress_every_s", "reask", "epochs"}
    assert job_only == {f.name for f in dataclasses.fields(RuntimeConfig)}
    assert not job_only & {f.name for f in dataclasses.fields(CallsConfig)}
    old = compose_config(["+runtime.num_retries=7"])  # the old spelling: refused, naming the new one, not dropped
    with pytest.raises(ConfigError, match=r"runtime.num_retries is not a setting of runtime; did you mean "
                                          r"calls.num_retries\?"):
        check_known_keys(old, OmegaConf.to_object(old))


@pytest.mark.parametrize("override, hint", [
    ("+model.rpm=300", "model.rpm is not a setting of model; did you mean model.pool.rpm?"),
    ("+evaluator.judge.input_cost_per_token=1e-06",
     "evaluator.judge.input_cost_per_token is not a setting of evaluator.judge; did you mean "
     "evaluator.judge.model_info.input_cost_per_token?"),
    ("+runtime.dry_run=true", "runtime.dry_run is not a setting of runtime; did you mean calls.dry_run?"),
    ("+data.rpm=300", "data.rpm is not a setting of data (known:"),  # never a model's key: no move named
])
def test_a_moved_key_added_anew_is_refused_with_its_new_name(override: str, hint: str) -> None:
    """``+key=`` composes (Hydra adds the key), so the schema check, not Hydra's refusal, names where it went."""
    from cupid_exp.errors import ConfigError
    from cupid_exp.job.plan import typed_config

    with pytest.raises(ConfigError) as refused:
        typed_config(compose_config([override]))
    assert str(refused.value).startswith(hint), refused.value


@pytest.mark.parametrize("overrides, line", [
    (["data.path=/x.jsonl"], "data.path is read only by data=local; add data=local"),
    (["data.split=train"], "data.split is read only by data=cupid; add data=cupid"),
    (["data=local", "data.path=/x.jsonl", "data.hf_name=a/b"],
     "data.hf_name is read only by data=cupid; add data=cupid"),
])
def test_a_data_field_its_source_does_not_read_is_refused(overrides, line) -> None:
    from cupid_exp.errors import ConfigError
    from cupid_exp.job.plan import typed_config

    with pytest.raises(ConfigError) as refused:
        typed_config(compose_config(overrides))
    assert str(refused.value) == line
    typed_config(compose_config(["data=local", "data.path=/x.jsonl", "data.limit=2"]))  # its own fields pass


@pytest.mark.parametrize("overrides, line", [
    (["setting.top_k=3"], "setting.top_k is read only by setting=retrieval; add setting=retrieval"),
    (["setting=summary", "setting.retriever=bm25"], "setting.retriever is read only by setting=retrieval; add "
                                                    "setting=retrieval"),
    (["evaluator.server.serve=true"], "evaluator.server.serve is read only by evaluator=prefmatcher; add "
                                      "evaluator=prefmatcher"),
])
def test_an_override_the_chosen_option_lacks_names_the_options_that_have_it(overrides, line) -> None:
    """What ``python -m cupid_exp`` says when composing fails on such an override (its exit code: tests/test_cli)."""
    from cupid_exp.hydra_errors import unread_override

    with pytest.raises((ConfigCompositionException, AssertionError)):
        compose_config(overrides)
    assert unread_override(["-m", *overrides, "paths.output_root=/tmp/x"], "config") == line
    assert unread_override(["model.nope=1"], "config") is None  # no option has it: Hydra's message stands


def _folders(root, *overrides: str, sweep_dir: str | None = None) -> tuple[str, str]:
    """The folder Hydra gives a single run and a sweep's job 0 of this config (``conf/config.yaml``)."""
    cfg = compose_config([f"paths.output_root={root}", *overrides], return_hydra_config=True)
    OmegaConf.update(cfg, "hydra.job.num", 0, force_add=True)
    if sweep_dir is not None:
        OmegaConf.update(cfg, "hydra.sweep.dir", sweep_dir)
    return str(cfg.hydra.run.dir), str(cfg.hydra.sweep.subdir)


def test_an_experiments_folder_changes_with_what_decides_its_results_only(tmp_path) -> None:
    """A rerun goes to its experiment's folder, a sweep's job too (an absolute subdir: Hydra puts it there); what
    changes results or the report is another folder, how fast or how cheaply they are got is not."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"a": 1}\n')
    base = ("data=local", f"data.path={data}")
    run, job = _folders(tmp_path, *base)
    assert run.startswith(f"{tmp_path}/runs/local_inference_standard_local/") and job == run
    assert _folders(tmp_path, *base, "runtime.workers=2", "model.max_concurrency=3")[0] == run
    for changed in (("model.params.temperature=0.3",), ("runtime.failure_policy=zero",), ("data.limit=1",)):
        assert _folders(tmp_path, *base, *changed)[0] != run, changed
    data.write_text('{"a": 2}\n')  # the same path, other data
    assert _folders(tmp_path, *base)[0] != run
    # a sweep put outside <output_root>/multirun keeps its jobs inside it
    assert _folders(tmp_path, *base, sweep_dir=str(tmp_path / "elsewhere"))[1] == "0_local_inference_standard_local"
