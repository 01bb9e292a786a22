"""The model-server lifecycle (vLLM for PrefMatcher), against a real OpenAI-compatible server on 127.0.0.1:
the stub model server started as the serve command."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.mlflow_server import free_port

from cupid_exp.config import CallsConfig, ConfigError, ModelConfig, ServerConfig
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.server import ServerStartError, check_server_command, is_healthy, managed_server
from cupid_exp.llm.usage import UsageMeter


def model_server(port: int) -> ServerConfig:
    return ServerConfig(serve=True, base_url=f"http://127.0.0.1:{port}", startup_timeout=60,
                        command=[sys.executable, "-m", "cupid_exp.testing.stub_llm_server", "--port", str(port)])


def test_starts_waits_serves_reuses_and_stops(tmp_path) -> None:
    cfg = model_server(free_port())
    assert not is_healthy(cfg.base_url)
    with managed_server(cfg) as url:
        assert url == cfg.base_url and is_healthy(url)
        with managed_server(cfg):  # already up: reused, and left running afterwards
            pass
        assert is_healthy(url)
        rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=0, timeout=60)
        configure_litellm(rt)
        model = ModelConfig(name="pm", litellm_model="hosted_vllm/kixlab/prefmatcher-7b", api_base=f"{url}/v1",
                            params={"temperature": 0, "max_tokens": 8})
        out = asyncio.run(LLMClient(model, rt, UsageMeter()).complete(
            [{"role": "user", "content": "Say hi.\n\n#### Checklist\n\n1. Is it short?"}], step="probe"))
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


def test_a_missing_server_program_is_one_config_error_unless_a_server_already_answers() -> None:
    from cupid_exp.testing.stub_llm_server import StubServer

    missing = ServerConfig(serve=True, base_url=f"http://127.0.0.1:{free_port()}",
                           command=["cupid-no-such-server", "serve", "m"])
    with pytest.raises(ConfigError) as err:
        check_server_command(missing)
    message = str(err.value)
    assert "\n" not in message and "'cupid-no-such-server'" in message and "evaluator.server.command" in message
    assert f"start the server yourself at {missing.base_url}" in message
    with StubServer() as up:  # a server already up is reused: nothing to start, nothing to install
        check_server_command(ServerConfig(serve=True, base_url=f"http://127.0.0.1:{up.port}",
                                          command=["cupid-no-such-server"]))
    check_server_command(ServerConfig(serve=False, command=["cupid-no-such-server"]))  # serving off


def test_serve_true_without_vllm_stops_before_any_call_in_one_line(tmp_path: Path) -> None:
    """The README's ``evaluator=prefmatcher evaluator.server.serve=true`` where vLLM is not installed (PATH holds
    no program at all here): one line naming the program and how to install it, exit 2, no request sent."""
    from helpers.cli_runner import PROJECT_ROOT, cli_env

    from cupid_exp.testing.cupid_data import stub_overrides
    from cupid_exp.testing.stub_llm_server import StubServer

    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    with StubServer() as stub:
        overrides = [o for o in stub_overrides(stub.url) if "matcher" not in o and not o.startswith("evaluator=")]
        proc = subprocess.run(
            [sys.executable, "-m", "cupid_exp", "evaluator=prefmatcher", *overrides, "evaluator.server.serve=true",
             f"evaluator.server.base_url=http://127.0.0.1:{free_port()}", "data.limit=1", "runtime.progress=false",
             f"paths.output_root={tmp_path / 'outputs'}"],
            cwd=PROJECT_ROOT, env=cli_env(PATH=str(empty_bin)), capture_output=True, text=True, timeout=120)
        received = sum(stub.counters.received.values())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("cupid_exp:")]
    assert "evaluator.server.serve=true starts 'vllm'" in line and "pip install -e '.[vllm]'" in line
    assert "GPU" in line
    assert received == 0 and not (tmp_path / "outputs" / "mlflow.db").exists()
