"""Keys checked before the first call: which environment variables each role's provider needs (litellm's
``validate_environment`` and the config's own ``api_key_env``), said in one line that never shows a value."""

from __future__ import annotations

import pytest

from cupid_exp.config import ConfigError, LocalModelConfig, ModelConfig
from cupid_exp.job.checks import missing_credentials, missing_keys_line

PROVIDER_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "TOGETHER_API_KEY",
                 "TOGETHERAI_API_KEY", "VERTEXAI_PROJECT", "VERTEXAI_LOCATION", "MY_OWN_KEY")


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROVIDER_VARS:
        monkeypatch.delenv(name, raising=False)


CLAUDE = ModelConfig(name="claude37", litellm_model="anthropic/claude-3-7-sonnet-20250219",
                     api_key_env="ANTHROPIC_API_KEY")
GPT = ModelConfig(name="gpt4o_eval", litellm_model="openai/gpt-4o-2024-11-20", api_key_env="OPENAI_API_KEY")


def test_a_missing_key_is_one_line_naming_role_model_and_variable() -> None:
    assert missing_keys_line({"model": CLAUDE}) == (
        "model (claude37, anthropic/claude-3-7-sonnet-20250219) needs ANTHROPIC_API_KEY, which is not set; "
        "export it or point the role at another endpoint (model.api_base=URL, model.api_key_env=VAR)")


def test_a_set_key_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0000000000")
    assert missing_keys_line({"model": CLAUDE}) is None


def test_the_configs_own_variable_is_the_one_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    own = ModelConfig(name="gpt", litellm_model="openai/gpt-4o-2024-08-06", api_key_env="MY_OWN_KEY")
    assert missing_credentials(own) == ("MY_OWN_KEY (or OPENAI_API_KEY)", False)
    monkeypatch.setenv("MY_OWN_KEY", "sk-mine-0000000000")
    assert missing_credentials(own) is None


def test_litellms_own_variable_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """Together's configs name TOGETHER_API_KEY; litellm also reads TOGETHERAI_API_KEY by itself."""
    together = ModelConfig(name="qwen72b", litellm_model="together_ai/Qwen/Qwen2.5-72B-Instruct-Turbo",
                           api_key_env="TOGETHER_API_KEY")
    assert missing_credentials(together) == ("TOGETHER_API_KEY (or TOGETHERAI_API_KEY)", False)
    monkeypatch.setenv("TOGETHERAI_API_KEY", "tk-test-0000000000")
    assert missing_credentials(together) is None


def test_a_provider_needing_several_variables_names_them_all() -> None:
    vertex = ModelConfig(name="gemini_pro", litellm_model="vertex_ai/gemini-2.0-pro-exp-02-05")
    line = missing_keys_line({"model": vertex})
    assert "needs VERTEXAI_PROJECT and VERTEXAI_LOCATION, which are not set; export them" in line


def test_roles_on_one_model_share_the_line_and_every_missing_model_is_named() -> None:
    line = missing_keys_line({"model": CLAUDE, "evaluator.decomposer": GPT, "evaluator.matcher": GPT})
    assert "\n" not in line
    assert line.startswith("model (claude37, anthropic/claude-3-7-sonnet-20250219) needs ANTHROPIC_API_KEY; "
                           "evaluator.decomposer, evaluator.matcher (gpt4o_eval, openai/gpt-4o-2024-11-20) need "
                           "OPENAI_API_KEY; none of these is set")


def test_embedded_and_api_base_roles_need_no_key() -> None:
    embedded = ModelConfig(name="local", litellm_model="llamacpp/smollm2", local=LocalModelConfig(gguf="x.gguf"))
    server = ModelConfig(name="srv", litellm_model="openai/stub", api_base="http://127.0.0.1:9/v1",
                         api_key_env="OPENAI_COMPATIBLE_API_KEY")
    assert missing_keys_line({"model": embedded, "evaluator.judge": server}) is None


def test_no_value_is_ever_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-proj-DO-NOT-PRINT-1234567890"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    line = missing_keys_line({"model": CLAUDE, "evaluator.judge": GPT})
    assert "ANTHROPIC_API_KEY" in line and secret not in line and "OPENAI_API_KEY" not in line
    # a key pasted where the variable's NAME belongs is refused without being echoed
    pasted = ModelConfig(name="gpt", litellm_model="openai/gpt-4o-2024-08-06", api_key_env=secret)
    with pytest.raises(ConfigError) as err:
        missing_keys_line({"model": pasted})
    assert "model.api_key_env must be the NAME of an environment variable" in str(err.value)
    assert secret not in str(err.value)
