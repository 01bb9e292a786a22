"""Decoding parameters are checked when the job is planned: a wrong type or range in ``model.params`` (or any
role's) is one line naming the key, the value and what is allowed, exit 2, before any model call."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CONF_DIR, compose_config
from helpers.cli_runner import cli_command, run_job
from helpers.jobs import stub_config

from cupid_exp.config import ConfigError
from cupid_exp.decoding_params import param_problem
from cupid_exp.job import typed_config
from cupid_exp.testing.inprocess import InProcessModel

UNREACHABLE = "http://127.0.0.1:9/v1"

BAD = [  # (overrides, the one-line message's fragment)
    ("model.params.temperature='0 .5'", "model.params.temperature='0 .5' is not allowed: a number in [0, 2]"),
    ("model.params.temperature=-3", "model.params.temperature=-3 is not allowed: a number in [0, 2]"),
    ("model.params.temperature=2.5", "model.params.temperature=2.5 is not allowed"),
    ("model.params.temperature=true", "model.params.temperature=True is not allowed"),
    ("+model.params.top_p=0", "model.params.top_p=0 is not allowed: a number in (0, 1]"),
    ("+model.params.top_p=1.2", "model.params.top_p=1.2 is not allowed"),
    ("model.params.max_tokens=0", "model.params.max_tokens=0 is not allowed: an integer >= 1"),
    ("model.params.max_tokens=12.5", "model.params.max_tokens=12.5 is not allowed"),
    ("+model.params.max_completion_tokens='many'", "model.params.max_completion_tokens='many' is not allowed"),
    ("+model.params.seed=1.5", "model.params.seed=1.5 is not allowed: an integer"),
    ("+model.params.n=3", "model.params.n=3 is not allowed: 1"),
    ("+model.params.presence_penalty=-2.5", "model.params.presence_penalty=-2.5 is not allowed: a number in [-2, 2]"),
    ("+model.params.frequency_penalty=3", "model.params.frequency_penalty=3 is not allowed"),
    ("+model.params.top_k=-5", "model.params.top_k=-5 is not allowed: an integer >= 1"),
    ("+model.params.stop=[1,2]", "model.params.stop=[1, 2] is not allowed: a string or a list of strings"),
    ("+model.params.stream=true", "model.params.stream=True is not allowed: false"),
    ("model=o3_mini & +model.params.reasoning_effort=extreme",
     "model.params.reasoning_effort='extreme' is not allowed: one of none, minimal, low, medium, high"),
    ("model=claude37 & model.params.thinking.budget_tokens=100",
     "model.params.thinking={'type': 'enabled', 'budget_tokens': 100} is not allowed: "
     "budget_tokens an integer >= 1024"),
    ("model=claude37 & model.params.thinking.budget_tokens=9000", "budget_tokens below max_tokens (8192)"),
    ("model=claude37 & model.params.thinking.type=on", "{type: enabled, budget_tokens: N} or {type: disabled}"),
    ("+model.params.temprature=0.5", "model.params.temprature=0.5 is not allowed: not a decoding parameter; "
                                     "did you mean temperature?"),
    ("evaluator.judge.params.temperature=-1", "evaluator.judge.params.temperature=-1 is not allowed"),
    ("+model.step_params.summarize.max_tokens=0", "model.step_params.summarize.max_tokens=0 is not allowed"),
    ("+model.step_params.judge.temprature=0", "model.step_params.judge.temprature=0 is not allowed: not a decoding "
                                              "parameter; did you mean temperature?"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_decoding_parameter_is_one_line_naming_key_value_and_range(tmp_path: Path, overrides: str,
                                                                         message: str) -> None:
    cfg = stub_config(UNREACHABLE, tmp_path, *overrides.split(" & "))
    with pytest.raises(ConfigError) as err:
        typed_config(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


GOOD = ["model.params.temperature=0", "model.params.temperature=2", "model.params.temperature=0.7",
        "+model.params.top_p=1", "+model.params.top_k=-1", "+model.params.seed=7", "+model.params.n=1",
        "+model.params.stop=END", "+model.params.stop=[a,b]", "+model.params.presence_penalty=-2",
        "+model.params.min_p=0.05", "+model.params.min_tokens=4",
        "+model.params.mirostat=2"]  # a key the table does not know, and far from every one it knows: passed on


@pytest.mark.parametrize("override", GOOD)
def test_good_and_unknown_parameters_pass(tmp_path: Path, override: str) -> None:
    typed_config(stub_config(UNREACHABLE, tmp_path, override))


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")))
def test_every_shipped_model_config_passes(model: str) -> None:
    typed_config(compose_config([f"model={model}"]))


def test_the_table_rejects_strings_for_numbers() -> None:
    assert param_problem("temperature", "0.5", {}) == "a number in [0, 2]"
    assert param_problem("temperature", float("nan"), {}) is not None
    assert param_problem("seed", True, {}) == "an integer"
    assert param_problem("some_provider_knob", "x", {}) is None


def test_the_cli_exits_2_before_any_call(tmp_path: Path) -> None:
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, tmp_path / "out", "tracking=none", "model.params.temperature=0 .5"),
                       check=False)
        received = stub.stats()["total_received"]
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("cupid_exp: ")
    assert "model.params.temperature='0 .5' is not allowed: a number in [0, 2]" in last
    assert "Traceback" not in proc.stderr and received == 0
