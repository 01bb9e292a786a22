"""Record the messages the official CUPID tool sends for one instance, by running its own modules.

Run as a script in its own process with the checkout on its path:
``PYTHONPATH=<official checkout> python official_calls.py <input.json> <out.json>``.
The official modules are imported from the checkout (nothing of theirs lives in this repo); the SDKs
they import at module level (openai, anthropic, google-genai, datasets) are replaced by recorders, so
no network is touched and every request is captured instead of sent. The input names what our run
produced (inferred preference and checklist, generated response), so both tools build their
prompts from the same values.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

CALLS: list[dict] = []
REPLIES: list[str] = []  # the next reply any fake client returns


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Completions:
    def __init__(self, client: str):
        self.client = client

    def create(self, **kwargs):
        CALLS.append({"client": self.client, "model": kwargs.get("model"), "messages": kwargs["messages"]})
        text = REPLIES.pop(0) if REPLIES else "{}"
        return _Obj(choices=[_Obj(message=_Obj(content=text))])


class _OpenAIClient:
    def __init__(self, api_key=None, base_url=None, **_):
        name = "vllm" if base_url and "8000" in base_url else "openai"
        self.chat = _Obj(completions=_Completions(name))
        self.models = _Obj(list=lambda: _Obj(data=[_Obj(id="gpt-4o-2024-11-20")]))


def install_fake_sdks() -> None:
    openai = types.ModuleType("openai")
    openai.Client = openai.OpenAI = _OpenAIClient
    anthropic = types.ModuleType("anthropic")
    anthropic.Anthropic = anthropic.AnthropicBedrock = lambda **_: None
    google = types.ModuleType("google")
    genai = types.ModuleType("google.genai")
    genai.Client = lambda **_: None
    genai.types = types.ModuleType("google.genai.types")
    google.genai = genai
    datasets = types.ModuleType("datasets")
    datasets.load_dataset = lambda *a, **k: []
    sys.modules.update({"openai": openai, "anthropic": anthropic, "google": google, "google.genai": genai,
                        "google.genai.types": genai.types, "datasets": datasets})


def record(given: dict) -> dict[str, list[dict]]:
    install_fake_sdks()
    from evaluation.modules import PreferenceInferrer, PreferenceMatcher, ResponseGenerator, ResponseJudger

    out: dict[str, list[dict]] = {}

    def model(system_prompt, user_prompt):  # the evaluated model, as the shipped example class sends it
        out.setdefault("subject", []).append([{"role": "system", "content": system_prompt},
                                              {"role": "user", "content": user_prompt}])
        return given["subject_reply"]

    def calls_of(fn) -> list[dict]:
        start = len(CALLS)
        fn()
        return [c["messages"] for c in CALLS[start:]]

    checklist_reply = "```json\n" + json.dumps({"checklist": given["inferred_checklist"]}) + "\n```"
    REPLIES[:] = [checklist_reply]
    out["decompose"] = calls_of(lambda: PreferenceInferrer(model)(given["current_request"],
                                                                    given["prior_interactions"]))
    out["infer"] = out.pop("subject")
    results = "```json\n" + json.dumps({"results": []}) + "\n```"
    matcher = PreferenceMatcher()
    REPLIES[:] = [results]
    out["match_precision"] = calls_of(lambda: matcher(given["inferred_checklist"], given["gt_preference"]))
    REPLIES[:] = [results]
    out["match_recall"] = calls_of(lambda: matcher(given["gt_checklist"], given["inferred_preference"]))
    prefmatcher = PreferenceMatcher(model_name="kixlab/prefmatcher-7b")
    REPLIES[:] = ["[]"]
    out["prefmatcher_recall"] = calls_of(lambda: prefmatcher(given["gt_checklist"], given["inferred_preference"]))
    ResponseGenerator(model)(given["current_request"], given["prior_interactions"])
    out["generate"] = out.pop("subject")
    REPLIES[:] = ["### Evaluation Score\n\n5"]
    out["judge"] = calls_of(lambda: ResponseJudger()(user_request=given["current_request"],
                                                    ai_response=given["response"], preference=given["gt_preference"],
                                                    checklist=given["gt_checklist"]))
    out["clients"] = [[c["client"], c["model"]] for c in CALLS]
    return out


if __name__ == "__main__":
    input_path, output_path = map(Path, sys.argv[1:3])
    result = record(json.loads(input_path.read_text(encoding="utf-8")))
    output_path.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
