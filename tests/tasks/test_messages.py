"""What reaches the model: drop-in prompts give the official tool's exact messages, and each
model config's decoding parameters reach litellm unchanged."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from conftest import compose_config
from helpers.jobs import run_one, stub_plan
from helpers.prompt_dirs import full_prompt_folder

from cupid_exp.config import DataConfig
from cupid_exp.data.loading import load_instances
from cupid_exp.job import typed_config
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.stub_llm_server import StubServer

INSTANCE = load_instances(DataConfig(name="sample", source="sample")).instances[0]


def official_style_dir(root: Path) -> Path:
    """Prompt files in the official layout (keys, placeholder names, |- blocks), with our own text (the files this
    test does not write: the project's)."""
    full_prompt_folder(root / "prompts")
    files = {
        "evaluation/preference_inferrer.yaml": """
            system_prompt: |-
              INFER-SYSTEM (no placeholders)
            user_prompt: |-
              ## Log

              {interaction_log}

              ---

              ## Current

              ### User

              {curr_request}

              Answer under "### Most Likely Preference".
            """,
        "evaluation/response_generator.yaml": """
            system_prompt: |-
              GENERATE-SYSTEM
            user_prompt: |-
              ## Log

              {interaction_log}

              ---

              ## Request

              {curr_request}
            """,
        "evaluation/response_judger.yaml": """
            system_prompt: |-
              JUDGE-SYSTEM

              **Preference**: "{preference}"

              **Checklist**:
              {checklist}
            user_prompt: |-
              ### User's Request

              {user_request}

              ### AI Assistant's Response

              {ai_response}
            """,
    }
    for name, text in files.items():
        path = root / "prompts" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    # the official tool keeps its matcher examples in Python beside prompts/ (here: one invented example)
    module = root / "evaluation" / "modules" / "preference_matcher.py"
    module.parent.mkdir(parents=True)
    module.write_text(f"EXAMPLES = {[{'preference': 'INVENTED-EXAMPLE', 'checklist': {'Is it short?': 1}}]!r}\n")
    return root / "prompts"


def official_log(instance) -> str:
    """The official tool's log layout, written out independently of cupid_exp.rendering."""
    out = ""
    for i, session in enumerate(instance.prior_interactions):
        out += f"### Session {i + 1}\n\n"
        for m in session.dialogue:
            out += f"#### {'User' if m.role == 'user' else 'AI Assistant'}\n\n{m.content}\n\n"
        out += "---\n\n"
    return out.strip()


def test_drop_in_prompts_send_the_official_messages(tmp_path: Path, monkeypatch) -> None:
    sent: dict[str, list[dict]] = {}
    real_complete = LLMClient.complete

    async def recording_complete(self, messages, *, step, **kw):
        sent.setdefault(step, messages)  # the first attempt of each step
        return await real_complete(self, messages, step=step, **kw)

    monkeypatch.setattr(LLMClient, "complete", recording_complete)
    with StubServer() as stub:
        job = stub_plan(stub.url, tmp_path, f"prompts.dir={official_style_dir(tmp_path / 'official')}",
                        "task=both", "runtime.reask=0", "calls.cache=false")
        result = run_one(job)

    log = official_log(INSTANCE)
    request = f"## Log\n\n{log}\n\n---\n\n## Current\n\n### User\n\n{INSTANCE.current_request}"
    assert sent["infer"] == [
        {"role": "system", "content": "INFER-SYSTEM (no placeholders)"},
        {"role": "user", "content": f'{request}\n\nAnswer under "### Most Likely Preference".'},
    ]
    assert sent["generate"] == [
        {"role": "system", "content": "GENERATE-SYSTEM"},
        {"role": "user", "content": f"## Log\n\n{log}\n\n---\n\n## Request\n\n{INSTANCE.current_request}"},
    ]
    checklist = "\n".join(f"- {item}" for item in INSTANCE.current_checklist)
    assert sent["judge"] == [
        {"role": "system", "content": f'JUDGE-SYSTEM\n\n**Preference**: "{INSTANCE.current_contextual_preference}"'
                                      f"\n\n**Checklist**:\n{checklist}"},
        {"role": "user", "content": f"### User's Request\n\n{INSTANCE.current_request}\n\n"
                                    f"### AI Assistant's Response\n\n{result.generation.response}"},
    ]
    # the decomposer and matcher prompts this directory lacks fall back to the project's files; the matcher's
    # examples come from the official module beside it
    assert "**Preferences**" in sent["decompose"][-1]["content"]
    assert "INVENTED-EXAMPLE" in sent["match_recall"][0]["content"]
    assert result.inference.f1 is not None  # the stub answers the official-style prompts; the job ran through


@pytest.mark.parametrize("model,expected", [
    ("gpt4o", {"temperature": 0}),
    ("o3_mini", {"max_completion_tokens": 16384}),
    ("claude37", {"temperature": 1, "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    ("deepseek_r1", {"temperature": 0}),
    ("gemini_pro", {"temperature": 0}),
])
def test_decoding_parameters_reach_litellm_unchanged(tmp_path: Path, model: str, expected: dict, monkeypatch) -> None:
    cfg = typed_config(compose_config([f"model={model}", f"paths.output_root={tmp_path}"]))
    configure_litellm(cfg.calls)
    client = LLMClient(cfg.model, cfg.calls, UsageMeter())
    seen = {}

    class Stop(Exception):
        pass

    async def capture(**kwargs):  # injected fault: stop at the litellm boundary, no network
        seen.update(kwargs)
        raise Stop

    import litellm

    monkeypatch.setattr(litellm, "acompletion", capture)
    with pytest.raises(Stop):
        asyncio.run(client.complete([{"role": "user", "content": "hi"}], step="s"))
    for key, value in expected.items():
        assert seen[key] == value
    if model == "o3_mini":
        assert "temperature" not in seen
    assert seen["model"] == cfg.model.litellm_model
    assert seen["num_retries"] == seen["max_retries"] == 0  # retries are ours (cupid_exp.llm.retry), not litellm's
    assert seen["timeout"] == cfg.calls.timeout
