"""The matcher's few-shot examples behind ``prompts.dir``: read from the official module's source (ast,
nothing executed), or the drop-in's own file, or a one-line ConfigError before any call — never ours.

The official-layout folders here are fakes with examples we invented, in the official module's shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, run_job
from helpers.jobs import run_one, stub_plan
from helpers.prompt_dirs import full_prompt_folder

from cupid_exp.config import ConfigError
from cupid_exp.llm.client import LLMClient
from cupid_exp.prompts import MATCHER_EXAMPLES, PROJECT_PROMPTS, PromptSet
from cupid_exp.rendering import matcher_examples
from cupid_exp.testing.inprocess import InProcessModel
from cupid_exp.testing.stub_llm_server import StubServer

INVENTED = [
    {"preference": "Garden plans must list plants by watering need.",
     "checklist": {"Does the plan group plants by how much water they need?": 1, "Does the plan name a nursery?": 0}},
    {"preference": "Budget summaries should fit on one screen.",
     "checklist": {"Is the summary short?": 0.5, "Does the summary use a table?": 0, "Is it one screen long?": 1}},
]

MODULE = '''"""A fake of the official matcher module: same shape, invented content."""
import json
raise SystemExit("parsing must not execute this module")

EXAMPLES = {examples}


def score_to_label(score):
    return "Fully Covered" if score == 1 else "Not Covered"
'''

MATCHER_PROMPT = """system_prompt: |-
  FAKE MATCHER. Label each entry.

  ### Examples

  {examples}
user_prompt: |-
  #### Preference

  {preference}

  #### Checklist

  {checklist}
"""


def official_layout(root: Path, module_text: str | None = None) -> Path:
    """<root>/prompts/evaluation/preference_matcher.yaml (the other prompt files: ours) and
    <root>/evaluation/modules/preference_matcher.py."""
    full_prompt_folder(root / "prompts")
    (root / "prompts" / "evaluation" / "preference_matcher.yaml").write_text(MATCHER_PROMPT)
    if module_text is not None:
        (root / "evaluation" / "modules").mkdir(parents=True)
        (root / "evaluation" / "modules" / "preference_matcher.py").write_text(module_text)
    return root / "prompts"


def expected_block(examples: list[dict]) -> str:
    """The official few-shot layout, written out by hand: preference, then a fenced results list, each
    example followed by a '---' line (the last one included: only whitespace is stripped at the end)."""
    parts = []
    for ex in examples:
        results = [{"index": i, "entry": entry,
                    "label": {1: "Fully Covered", 0.5: "Partially Covered"}.get(score, "Not Covered")}
                   for i, (entry, score) in enumerate(ex["checklist"].items(), start=1)]
        parts.append(f"#### Preference\n\n{ex['preference']}\n\n#### Output\n\n```json\n"
                     f"{json.dumps({'results': results}, indent=2)}\n```\n\n---\n\n")
    return "".join(parts).strip()


def test_the_official_modules_examples_are_read_without_running_it(tmp_path: Path) -> None:
    prompts = PromptSet(official_layout(tmp_path, MODULE.format(examples=repr(INVENTED))))
    assert prompts.matcher_examples() == INVENTED
    assert matcher_examples(prompts.matcher_examples()) == expected_block(INVENTED)


def test_an_annotated_assignment_is_read_too(tmp_path: Path) -> None:
    module = f"from typing import Any\nEXAMPLES: list[dict[str, Any]] = {INVENTED!r}\n"
    assert PromptSet(official_layout(tmp_path, module)).matcher_examples() == INVENTED


@pytest.mark.parametrize("module, problem", [
    (None, "no matcher few-shot examples"),
    ("OTHER = []\n", "no module-level EXAMPLES"),
    ("EXAMPLES = load()\n", "malformed node"),
    ("EXAMPLES = [\n", "was never closed"),
    (f"EXAMPLES = {[{'preference': 'p', 'checklist': {'q?': 0.7}}]!r}\n", "example 1 is not"),
    ("EXAMPLES = []\n", "not a non-empty list"),
])
def test_examples_that_cannot_be_found_stop_with_one_line(tmp_path: Path, module, problem) -> None:
    prompts = PromptSet(official_layout(tmp_path, module))
    with pytest.raises(ConfigError, match=problem) as err:
        prompts.matcher_examples()
    assert "\n" not in str(err.value)


def test_a_drop_ins_own_examples_file_comes_first(tmp_path: Path) -> None:
    directory = official_layout(tmp_path, MODULE.format(examples=repr(INVENTED)))
    (directory / MATCHER_EXAMPLES).write_text((PROJECT_PROMPTS / MATCHER_EXAMPLES).read_text())
    assert PromptSet(directory).matcher_examples() == PromptSet().matcher_examples()


def test_the_examples_in_effect_are_part_of_the_prompt_digest(tmp_path: Path) -> None:
    one = official_layout(tmp_path / "one", MODULE.format(examples=repr(INVENTED)))
    two = official_layout(tmp_path / "two", MODULE.format(examples=repr(INVENTED[:1])))
    assert PromptSet(one).digest() != PromptSet(two).digest()


def test_the_matcher_call_carries_the_official_examples(tmp_path: Path, monkeypatch) -> None:
    sent: dict[str, list[dict]] = {}
    real_complete = LLMClient.complete

    async def recording_complete(self, messages, *, step, **kw):
        sent.setdefault(step, messages)
        return await real_complete(self, messages, step=step, **kw)

    monkeypatch.setattr(LLMClient, "complete", recording_complete)
    directory = official_layout(tmp_path / "official", MODULE.format(examples=repr(INVENTED)))
    with StubServer() as stub:
        result = run_one(stub_plan(stub.url, tmp_path, f"prompts.dir={directory}", "calls.cache=false"))
    system = sent["match_recall"][0]["content"]
    assert system == f"FAKE MATCHER. Label each entry.\n\n### Examples\n\n{expected_block(INVENTED)}"
    assert result.inference.f1 is not None


def test_the_cli_stops_before_any_call_when_the_examples_are_missing(tmp_path: Path) -> None:
    directory = official_layout(tmp_path / "official", None)
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, tmp_path / "out", f"prompts.dir={directory}", "tracking=none"),
                       check=False)
        assert stub.stats()["total_received"] == 0
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "matcher few-shot examples" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    # a PrefMatcher run needs no examples: the same directory is fine there
    with InProcessModel() as stub:
        run_job(cli_command(stub, tmp_path / "out2", f"prompts.dir={directory}", "tracking=none",
                            "evaluator.matcher_few_shot=false",
                            "evaluator.matcher_prompt=evaluation/preference_matcher_model"))
        assert stub.stats()["total_received"] > 0
