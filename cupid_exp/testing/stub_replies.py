"""What the stub answers: the request's step (by prompt or schema) and a well-formed reply from the prompt's hash."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from cupid_exp.testing.stub_config import SYNTHESIS_STEPS, StubConfig

LABELS = ("Fully Covered", "Partially Covered", "Not Covered")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from the parts."""
    return int(digest("\x1f".join(map(str, parts)))[:13], 16) / 16 ** 13


# ---------------------------------------------------------------- recognising the step


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def prompt_of(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(system text, first user text): what the step's template produced, re-asks excluded."""
    system = "".join(_content(m) for m in messages if m.get("role") in ("system", "developer"))
    user = next((_content(m) for m in messages if m.get("role") == "user"), "")
    return system, user


def request_schema(body: dict[str, Any]) -> dict[str, Any]:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}


# A key of the request's JSON schema -> its step (the synthesis steps' keys first: no evaluation schema has them).
_SCHEMA_KEYS = (("personas", "persona"), ("factor", "factors"), ("reason", "changed_preference"),
                ("story", "session"), ("selected_items", "user_simulator"), ("summaries", "summarize"),
                ("results", "match"), ("checklist", "decompose"), ("score", "judge"), ("preference", "infer"))


def classify(body: dict[str, Any]) -> str:
    props = request_schema(body).get("properties") or {}
    if "expressed" in (((props.get("results") or {}).get("items") or {}).get("properties") or {}):
        return "validate"
    step = next((step for key, step in _SCHEMA_KEYS if key in props), None)
    if step is not None:
        return step
    system, user = prompt_of(body.get("messages") or [])
    text = system + "\n" + user
    if "Summarise every session" in user or '"summaries"' in text:
        return "summarize"
    if "Evaluation Score" in system or "critical evaluator" in system:
        return "judge"
    if "#### Checklist" in user:
        return "match"
    if "**Preferences**" in user or "evaluation checklist" in system:
        return "decompose"
    if "Most Likely Preference" in text:
        return "infer"
    if "User's Request" in user or "Respond to the user's request" in system:
        return "generate"
    if "helpful conversational assistant" in system:
        return "assistant_simulator"
    return "unknown"


# ---------------------------------------------------------------- well-formed replies

_WANTS = ("concise", "step-by-step", "formal", "friendly", "detailed", "bullet-pointed", "sourced", "practical")
_THINGS = ("worked examples", "a summary table", "one closing question", "plain language", "cited sources",
           "a short checklist", "concrete numbers", "a clear recommendation")


def _words(h: str, offset: int, options: tuple[str, ...]) -> str:
    return options[int(h[offset:offset + 2], 16) % len(options)]


_VOCAB = ("amber", "anchor", "atlas", "basil", "beacon", "birch", "bramble", "cedar", "cinder", "clover", "cobalt",
          "comet", "coral", "cricket", "delta", "ember", "falcon", "fennel", "fjord", "garnet", "glacier", "granite",
          "harbor", "hazel", "heron", "indigo", "island", "jasper", "juniper", "kestrel", "lagoon", "lantern",
          "lilac", "maple", "marble", "meadow", "meteor", "nectar", "nutmeg", "oasis", "onyx", "orchid", "otter",
          "pebble", "pepper", "pine", "quartz", "quill", "raven", "reef", "saffron", "sable", "sierra", "spruce",
          "summit", "thistle", "timber", "topaz", "tundra", "velvet", "willow", "walnut", "yarrow", "zephyr")


def stub_sentence(key: str, min_len: int = 0, max_len: int = 200) -> str:
    """Words drawn by ``key`` plus a token unique to it: no two fields share much, none is a placeholder."""
    target = max(min_len, min(max_len, 24))
    words = [f"k{key[:6]}"]
    while len(" ".join(words)) + 1 < target:  # the i-th word drawn by ``key`` and i
        words.append(_VOCAB[int(digest(f"{key}\x1f{len(words) - 1}")[:4], 16) % len(_VOCAB)])
    text = " ".join(words[1:] + words[:1]).capitalize()
    return (text[: max(1, max_len - 1)].rstrip() + ".")[:max_len]


def schema_value(schema: dict[str, Any], key: str, position: int | None = None) -> Any:
    """A value valid under ``schema``, drawn by ``key`` (enums in arrays by position, arrays at minItems)."""
    draw = int(digest(key)[:8], 16)
    if "enum" in schema:
        options = schema["enum"]
        return options[position % len(options)] if position is not None else options[draw % len(options)]
    kind = schema.get("type")
    if kind == "object":
        return {name: schema_value(sub, f"{key}/{name}", position)
                for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        n = schema.get("minItems", min(1, schema.get("maxItems", 1)))
        return [schema_value(schema.get("items") or {}, f"{key}[{i}]", i) for i in range(n)]
    if kind == "boolean":
        return bool(draw % 2)
    if kind in ("integer", "number"):
        low, high = int(schema.get("minimum", 1)), int(schema.get("maximum", 10))
        return low + draw % (high - low + 1)
    return stub_sentence(digest(key), int(schema.get("minLength", 0)), int(schema.get("maxLength", 200)))


def reply_text(step: str, body: dict[str, Any], cfg: StubConfig) -> str:
    text = _reply_text(step, body, cfg)
    if step not in cfg.replies.long_steps:
        return text
    mark = digest(text)[:12]
    filler = "The same sentence again, to make the reply long. "
    return (f"{text}\nLONG-REPLY {mark}\n" + filler * max(0, cfg.replies.long_bytes // len(filler))
            + f"LONG-REPLY-END {mark}")


def _reply_text(step: str, body: dict[str, Any], cfg: StubConfig) -> str:
    if step in SYNTHESIS_STEPS:  # JSON from the request's schema, keyed by the whole conversation (a re-ask differs)
        key = digest(f"{cfg.seed}\x1f{json.dumps(body.get('messages'), sort_keys=True)}")
        if step == "assistant_simulator":
            return f"Here is my answer. {stub_sentence(key, 60, 300)}"
        return json.dumps(schema_value(request_schema(body), key))
    system, user = prompt_of(body.get("messages") or [])
    h = digest(f"{cfg.seed}\x1f{system}\x1f{user}")
    structured = bool(body.get("response_format"))
    if step == "infer":
        sentence = (f"The user wants {_words(h, 0, _WANTS)} answers with {_words(h, 2, _THINGS)} "
                    f"and {_words(h, 4, _THINGS)} for requests like this (ref {h[:8]}).")
        if structured:
            return json.dumps({"preference": sentence})
        return (f"### Analysis\n\nSessions {int(h[6], 16) % 8 + 1} and {int(h[7], 16) % 8 + 1} match the "
                f"current request.\n\n### Most Likely Preference\n\n{sentence}")
    if step == "decompose":
        n = int(h[0], 16) % 4 + 1
        items = [f"Does the response use {_words(h, 2 + 2 * i, _THINGS)} (item {i + 1}, {h[10:16]})?"
                 for i in range(n)]
        payload = {"analysis": f"The preference states {n} requirement(s).", "checklist": items}
        return json.dumps(payload) if structured else (
            f"**Analysis**\n\n{payload['analysis']}\n\n**Checklist**\n\n```json\n"
            f"{json.dumps({'checklist': items}, indent=2)}\n```")
    if step == "match":
        checklist = user.split("#### Checklist", 1)[-1]  # its numbered lines
        items = [m.group(1).strip() for m in re.finditer(r"^\s*\d+\.\s+(.*)$", checklist, re.MULTILINE)]
        results = [{"index": i, "entry": item, "reasoning": "Compared with the preference.",
                    "label": LABELS[int(digest(f'{h}{i}')[:2], 16) % 3]}
                   for i, item in enumerate(items, start=1)]
        payload = {"results": results}
        return json.dumps(payload) if structured else f"```json\n{json.dumps(payload, indent=2)}\n```"
    if step == "summarize":
        n = len(re.findall(r"^### Session \d+", user, re.MULTILINE))
        summaries = [{"session_id": i, "analysis": f"Session {i} ({h[:6]}).",
                      "context": [f"context of session {i}"],
                      "preferences": [f"wants {_words(h, 2 * (i % 8), _THINGS)}"]} for i in range(1, n + 1)]
        payload = {"summaries": summaries}
        return json.dumps(payload) if structured else f"```json\n{json.dumps(payload, indent=2)}\n```"
    if step == "judge":
        if structured:
            return json.dumps({"evaluation": "Checked every item.", "score": float(cfg.replies.judge_score)})
        return f"### Evaluation of AI Assistant's Response\n\nChecked every item.\n\n### Evaluation Score\n\n" \
               f"{cfg.replies.judge_score}"
    if step == "generate":
        return (f"Here is a {_words(h, 0, _WANTS)} answer with {_words(h, 2, _THINGS)}.\n\n"
                f"1. First point ({h[:6]}).\n2. Second point.\n")
    return f"Stub reply {h[:12]}."


def billed_tokens(body: dict[str, Any], reply: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens billed: the reply's usage, else litellm's count."""
    usage = reply.get("usage")
    if usage:
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    import litellm

    model = str(body.get("model") or "stub")
    text = "".join(str((c.get("message") or {}).get("content") or "") for c in reply.get("choices") or [])
    prompt = litellm.token_counter(model=model, messages=body.get("messages") or [])
    return prompt, litellm.token_counter(model=model, text=text, count_response_tokens=True) if text else 0


def prompt_tokens(body: dict[str, Any]) -> int:
    """The stub's token rule for a request's prompt: its messages' characters / 4, at least 1."""
    return max(1, sum(len(_content(m)) for m in body.get("messages") or [] if isinstance(m, dict)) // 4)


def completion_body(text: str | None, body: dict[str, Any], finish_reason: str = "stop",
                    refusal: str | None = None) -> dict[str, Any]:
    prompt, completion_tokens = prompt_tokens(body), max(1, len(text or refusal or "") // 4)
    message = {"role": "assistant", "content": text, **({"refusal": refusal} if refusal else {})}
    return {"id": "chatcmpl-stub-" + digest(text or "")[:12], "object": "chat.completion", "created": 0,
            "model": body.get("model", "stub"),
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                      "total_tokens": prompt + completion_tokens}}
