"""In-process llama.cpp models as a litellm custom provider ("llamacpp/<name>").

Going through litellm keeps one code path for every model: the same caching,
retries, usage and cost accounting apply to the embedded model and to API models.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import importlib.metadata
import threading
from pathlib import Path
from typing import Any

from cupid_exp.config import LocalModelConfig

PROVIDER = "llamacpp"
_PASSED_PARAMS = ("temperature", "max_tokens", "top_p", "top_k", "stop", "seed", "response_format", "grammar")


def resolve_gguf(spec: str) -> Path:
    """Find the weights: 'package:<dist>:<suffix>', 'assemble:<module>', or a file path."""
    kind, _, rest = spec.partition(":")
    if kind == "package":
        dist, _, suffix = rest.partition(":")
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError as exc:
            raise FileNotFoundError(f"local model package {dist!r} is not installed "
                                    f"(see README: scripts/install_local_model.sh)") from exc
        matches = [f for f in files if str(f).endswith(suffix or ".gguf")]
        if not matches:
            raise FileNotFoundError(f"package {dist!r} ships no file ending in {suffix!r}")
        return Path(matches[0].locate())
    if kind == "assemble":
        module = importlib.import_module(rest)
        return Path(module.assemble())
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    return path


def _llama_response_format(fmt: Any) -> Any:
    """OpenAI-style json_schema -> llama.cpp's {'type': 'json_object', 'schema': ...}."""
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {"type": "json_object", "schema": fmt.get("json_schema", {}).get("schema", {})}
    return fmt


class LlamaCppProvider:
    """Lazily loads one llama.cpp model per registered name; calls are serialised per model."""

    def __init__(self) -> None:
        self._configs: dict[str, LocalModelConfig] = {}
        self._models: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._load_lock = threading.Lock()

    def register(self, name: str, cfg: LocalModelConfig) -> None:
        self._configs[name] = cfg
        self._locks.setdefault(name, threading.Lock())

    def _model(self, name: str) -> Any:
        with self._load_lock:
            if name not in self._models:
                if name not in self._configs:
                    raise ValueError(f"local model {name!r} is not configured")
                from llama_cpp import Llama

                cfg = self._configs[name]
                llm = Llama(model_path=str(resolve_gguf(cfg.gguf)), n_ctx=cfg.n_ctx, n_threads=cfg.n_threads,
                            n_batch=cfg.n_batch, chat_format=cfg.chat_format, verbose=False)
                if cfg.prompt_cache_mb > 0:  # the matcher's few-shot system prompt is then processed once
                    from llama_cpp import LlamaRAMCache

                    llm.set_cache(LlamaRAMCache(capacity_bytes=cfg.prompt_cache_mb * 2**20))
                atexit.register(llm.close)
                self._models[name] = llm
            return self._models[name]

    def complete(self, name: str, messages: list[dict], params: dict[str, Any]) -> dict:
        import litellm

        kwargs = {k: v for k, v in params.items() if k in _PASSED_PARAMS and v is not None}
        if "response_format" in kwargs:
            kwargs["response_format"] = _llama_response_format(kwargs["response_format"])
        if isinstance(kwargs.get("grammar"), str):
            from llama_cpp import LlamaGrammar

            kwargs["grammar"] = LlamaGrammar.from_string(kwargs["grammar"], verbose=False)
        llm = self._model(name)
        n_ctx = self._configs[name].n_ctx
        with self._locks[name]:
            n_prompt = len(llm.tokenize(_flatten(messages).encode("utf-8"), add_bos=False, special=True))
            if n_prompt + int(kwargs.get("max_tokens") or 0) > n_ctx:
                raise litellm.ContextWindowExceededError(
                    message=f"prompt of ~{n_prompt} tokens + max_tokens exceeds n_ctx={n_ctx}",
                    model=f"{PROVIDER}/{name}", llm_provider=PROVIDER)
            return llm.create_chat_completion(messages=messages, **kwargs)


def _flatten(messages: list[dict]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


def _make_handler(provider: LlamaCppProvider):
    import litellm

    class _Handler(litellm.CustomLLM):
        def completion(self, model, messages, api_base, custom_prompt_dict, model_response, print_verbose,
                       encoding, api_key, logging_obj, optional_params, *args, **kwargs):
            out = provider.complete(model, messages, optional_params)
            return litellm.ModelResponse(**{**out, "model": f"{PROVIDER}/{model}"})

        async def acompletion(self, model, messages, api_base, custom_prompt_dict, model_response, print_verbose,
                              encoding, api_key, logging_obj, optional_params, *args, **kwargs):
            out = await asyncio.to_thread(provider.complete, model, messages, optional_params)
            return litellm.ModelResponse(**{**out, "model": f"{PROVIDER}/{model}"})

    return _Handler()


_PROVIDER: LlamaCppProvider | None = None


def register_local_model(litellm_model: str, cfg: LocalModelConfig) -> None:
    """Make 'llamacpp/<name>' routable by litellm, priced at zero."""
    global _PROVIDER
    import litellm

    provider_name, _, name = litellm_model.partition("/")
    if provider_name != PROVIDER or not name:
        raise ValueError(f"a local model's litellm_model must be '{PROVIDER}/<name>', got {litellm_model!r}")
    if _PROVIDER is None:
        _PROVIDER = LlamaCppProvider()
        litellm.custom_provider_map = [
            *[p for p in litellm.custom_provider_map if p.get("provider") != PROVIDER],
            {"provider": PROVIDER, "custom_handler": _make_handler(_PROVIDER)},
        ]
        if hasattr(litellm, "custom_llm_setup"):
            litellm.custom_llm_setup()
    _PROVIDER.register(name, cfg)
    litellm.register_model({litellm_model: {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                                            "litellm_provider": PROVIDER, "mode": "chat"}})
