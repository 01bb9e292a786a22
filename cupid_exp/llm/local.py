"""In-process llama.cpp models (xllamacpp) as the litellm provider "llamacpp/<name>"."""

from __future__ import annotations

import asyncio
import atexit
import importlib
import importlib.metadata
import os
import secrets
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from cupid_exp.config import LocalModelConfig
from cupid_exp.llm import _litellm
from cupid_exp.llm.messages import Message

if TYPE_CHECKING:
    from litellm import CustomLLM, ModelResponse

PROVIDER = "llamacpp"
_PASSED_PARAMS = ("temperature", "max_tokens", "top_p", "top_k", "stop", "seed", "response_format", "grammar",
                  # llama.cpp's repetition samplers (synthesis.embedded_sampling)
                  "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "dry_multiplier",
                  "dry_base", "dry_allowed_length")


def resolve_gguf(spec: str) -> Path:
    """Find the weights: 'package:<dist>:<suffix>', 'assemble:<module>', or a file path."""
    kind, _, rest = spec.partition(":")
    if kind == "package":
        dist, _, suffix = rest.partition(":")
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError as exc:
            raise FileNotFoundError(f"local model package {dist!r} is not installed "
                                    f"(see README: scripts/setup.sh)") from exc
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


def strict_schema(schema: object) -> object:
    """OpenAI's ``strict: true`` (no extra properties): else a small model invents keys until max_tokens."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _request(messages: list[Message], params: dict[str, Any], cache_prompt: bool) -> dict[str, Any]:
    """The OpenAI-style request the llama.cpp server takes, from litellm's optional_params."""
    request: dict[str, Any] = {"messages": messages, "cache_prompt": cache_prompt,
                               **{key: params[key] for key in _PASSED_PARAMS if params.get(key) is not None}}
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") or {}
        sent_schema = strict_schema(schema) if spec.get("strict") else schema
        request["response_format"] = {"type": "json_schema", "json_schema": {"schema": sent_schema}}
    return request


def import_xllamacpp() -> Any:
    """xllamacpp, its OpenMP runtime told to sleep rather than spin while a thread waits (``OMP_WAIT_POLICY``, which
    libgomp reads once, as it loads; a value the user set is kept). Spinning threads on a core another process wants
    took twice the CPU and twice the time per prompt (bench/local_backend.md, "OpenMP's wait policy"). The variable is
    set only while the library loads: the job's other libraries and child processes see the environment as it was."""
    if "xllamacpp" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            import xllamacpp
        finally:
            del os.environ["OMP_WAIT_POLICY"]
    import xllamacpp

    return xllamacpp


class XLlamaCppEngine:
    """One GGUF model loaded by xllamacpp; ``chat`` takes and returns OpenAI-style dicts (thread-safe)."""

    def __init__(self, gguf: Path, cfg: LocalModelConfig):
        xllamacpp = import_xllamacpp()
        params = xllamacpp.CommonParams()
        params.model.path = str(gguf)
        params.n_ctx = cfg.n_ctx
        params.n_batch = cfg.n_batch
        params.n_ubatch = cfg.n_batch
        params.n_parallel = 1  # one slot: the whole n_ctx for one request at a time
        params.cpuparams.n_threads = cfg.n_threads
        params.cpuparams_batch.n_threads = cfg.n_threads_batch or cfg.n_threads
        params.ctx_shift = False  # a prompt that does not fit is an error, never silently shifted
        params.cache_prompt = cfg.prompt_cache_mb > 0
        params.cache_ram_mib = max(0, cfg.prompt_cache_mb)
        params.cache_idle_slots = cfg.prompt_cache_mb > 0
        if cfg.flash_attn is not None:
            params.flash_attn_type = int(cfg.flash_attn)  # llama.cpp's enum: -1 auto, 0 off, 1 on
        params.verbosity = -1  # llama.cpp's per-request log lines would flood stderr
        # xllamacpp always starts the server's HTTP listener too (127.0.0.1, a random port); a random
        # key nobody holds makes it refuse every request but /health. In-process calls need no key.
        params.api_keys = [secrets.token_urlsafe(24)]
        params.endpoint_slots = False
        if cfg.chat_format:
            # a llama.cpp built-in template by name (e.g. "gemma" for a GGUF that ships none); the Jinja
            # path would take the name for a template's source text
            params.use_jinja = False
            params.chat_template = cfg.chat_format
        self.n_ctx = cfg.n_ctx
        self.cache_prompt = cfg.prompt_cache_mb > 0
        self._server = xllamacpp.Server(params)

    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._server.handle_chat_completions(request)
        return reply

    def close(self) -> None:
        self._server = None  # the server's destructor stops its loop and frees the model


class LocalModels:
    """Loads one engine per registered name on first use; calls are serialised per model."""

    def __init__(self, engine_factory: Callable[[Path, LocalModelConfig], Any] = XLlamaCppEngine) -> None:
        self.engine_factory = engine_factory
        self._configs: dict[str, LocalModelConfig] = {}
        self._engines: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._load_lock = threading.Lock()
        self.stats: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def register(self, name: str, cfg: LocalModelConfig) -> None:
        with self._load_lock:
            if name in self._engines and self._configs[name] != cfg:  # an engine is made only for a known config
                self._engines.pop(name).close()  # reconfigured (another job in this process): reload
            self._configs[name] = cfg
            self._locks.setdefault(name, threading.Lock())

    def engine(self, name: str) -> Any:
        with self._load_lock:
            if name not in self._engines:
                if name not in self._configs:
                    raise ValueError(f"local model {name!r} is not configured")
                cfg = self._configs[name]
                self._engines[name] = self.engine_factory(resolve_gguf(cfg.gguf), cfg)
            return self._engines[name]

    def complete(self, name: str, messages: list[Message], params: dict[str, Any]) -> dict[str, Any]:
        """One chat completion as an OpenAI-style dict; provider problems raise litellm exceptions."""
        engine = self.engine(name)
        request = _request(messages, params, engine.cache_prompt)
        with self._locks[name]:
            start = time.perf_counter()
            try:
                out: dict[str, Any] = engine.chat(request)
            except ValueError as exc:  # xllamacpp rejects a request it cannot serve (e.g. a schema) this way
                raise _litellm_error(name, 400, "invalid_request_error", str(exc)) from exc
            wall = time.perf_counter() - start
        if "error" in out:
            err = out["error"] if isinstance(out["error"], dict) else {"message": str(out["error"])}
            raise _litellm_error(name, int(err.get("code") or 500), str(err.get("type") or ""),
                                 str(err.get("message") or err))
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        n_prompt, n_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        if choice.get("finish_reason") == "length" and n_prompt + n_out >= engine.n_ctx - 1:
            # llama.cpp stops a generation that reaches the end of the context and calls it "length"
            raise _litellm_error(name, 400, "exceed_context_size_error",
                                 f"prompt of {n_prompt} tokens + generation reached n_ctx={engine.n_ctx}")
        text = (choice.get("message") or {}).get("content") or ""
        if not text.strip():
            raise _litellm_error(name, 500, "empty_completion",
                                 f"the model produced no text (finish_reason={choice.get('finish_reason')})")
        self._account(name, usage, out.get("timings") or {}, wall)
        return out

    def _account(self, name: str, usage: dict[str, Any], timings: dict[str, Any], wall: float) -> None:
        s = self.stats[name]
        s["calls"] += 1
        s["wall_s"] += wall
        s["prompt_tokens"] += usage.get("prompt_tokens") or 0
        s["completion_tokens"] += usage.get("completion_tokens") or 0
        s["cached_prompt_tokens"] += timings.get("cache_n") or 0
        s["processed_prompt_tokens"] += timings.get("prompt_n") or 0
        s["prompt_ms"] += timings.get("prompt_ms") or 0.0
        s["generated_tokens"] += timings.get("predicted_n") or 0
        s["generation_ms"] += timings.get("predicted_ms") or 0.0

    def close(self) -> None:
        with self._load_lock:
            while self._engines:
                _, engine = self._engines.popitem()
                engine.close()


def _litellm_error(name: str, code: int, kind: str, message: str) -> Exception:
    import litellm

    model = f"{PROVIDER}/{name}"
    text = f"{model}: {message}"
    if kind == "exceed_context_size_error":
        return litellm.ContextWindowExceededError(message=text, model=model, llm_provider=PROVIDER)
    if code == 400:
        return litellm.BadRequestError(message=text, model=model, llm_provider=PROVIDER)
    if code == 503:
        return litellm.ServiceUnavailableError(message=text, model=model, llm_provider=PROVIDER)
    if code >= 500:
        return litellm.InternalServerError(message=text, model=model, llm_provider=PROVIDER)
    return litellm.APIError(status_code=code, message=text, model=model, llm_provider=PROVIDER)


def _model_response(name: str, out: dict[str, Any]) -> ModelResponse:
    import litellm

    choice = out["choices"][0]
    usage = out.get("usage") or {}
    return litellm.ModelResponse(
        id=out.get("id"), created=out.get("created"), model=f"{PROVIDER}/{name}", object="chat.completion",
        choices=[{"index": 0, "finish_reason": choice.get("finish_reason") or "stop",
                  "message": {"role": "assistant", "content": (choice.get("message") or {}).get("content") or ""}}],
        usage={"prompt_tokens": int(usage.get("prompt_tokens") or 0),
               "completion_tokens": int(usage.get("completion_tokens") or 0),
               "total_tokens": int(usage.get("total_tokens") or 0),
               "prompt_tokens_details": {"cached_tokens": int((usage.get("prompt_tokens_details") or {})
                                                              .get("cached_tokens") or 0)}},
    )


async def off_the_loop(fn: Callable[..., object], *args: object) -> Any:
    """``fn(*args)`` on a daemon thread, awaited. Not ``asyncio.to_thread``: a stopped job would wait for the generation
    under way and every call queued behind it."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile: nobody waits for it
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop has closed: the job is over
            pass

    threading.Thread(target=run, name="cupid-local-model", daemon=True).start()
    return await future


def _make_handler(models: LocalModels) -> CustomLLM:
    """litellm's CustomLLM over ``models``; a bug here arrives wrapped as APIConnectionError and still stops the job."""
    import litellm

    def call(model: str, messages: list[Message], optional_params: dict[str, Any]) -> ModelResponse:
        return _model_response(model, models.complete(model, messages, optional_params))

    class _Handler(litellm.CustomLLM):
        _cupid_models = models  # which registry it serves (``register_local_model`` looks)

        # litellm passes these positionally; only the model, its messages and the parameters matter here
        def completion(self, model: str, messages: list[Message], api_base: object, custom_prompt_dict: object,
                       model_response: object, print_verbose: object, encoding: object, api_key: object,
                       logging_obj: object, optional_params: dict[str, Any], *args: object,
                       **kwargs: object) -> ModelResponse:
            return call(model, messages, optional_params)

        async def acompletion(self, model: str, messages: list[Message], api_base: object,
                              custom_prompt_dict: object, model_response: object, print_verbose: object,
                              encoding: object, api_key: object, logging_obj: object, optional_params: dict[str, Any],
                              *args: object, **kwargs: object) -> Any:
            return await off_the_loop(call, model, messages, optional_params)

    return _Handler()


_MODELS: LocalModels | None = None


def local_models() -> LocalModels:
    """The process-wide registry behind the provider (its ``stats`` count tokens and timings per model)."""
    global _MODELS
    if _MODELS is None:
        _MODELS = LocalModels()
        atexit.register(_MODELS.close)
    return _MODELS


def register_local_model(litellm_model: str, cfg: LocalModelConfig) -> None:
    """Make 'llamacpp/<name>' routable by litellm, priced at zero."""
    import litellm

    provider_name, _, name = litellm_model.partition("/")
    if provider_name != PROVIDER or not name:
        raise ValueError(f"a local model's litellm_model must be '{PROVIDER}/<name>', got {litellm_model!r}")
    models = local_models()
    if not any(p.get("provider") == PROVIDER and getattr(p.get("custom_handler"), "_cupid_models", None) is models
               for p in litellm.custom_provider_map):
        handler = _make_handler(models)
        _litellm.register_custom_provider(PROVIDER, handler)
    models.register(name, cfg)
    litellm.register_model({litellm_model: {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                                            "litellm_provider": PROVIDER, "mode": "chat"}})
