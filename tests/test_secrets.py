"""Secrets: API keys in the environment and in config overrides never reach anything we write.

Keys are set in the environment (under the usual names and under a name only ``api_key_env`` points
at) and passed as a config override; the stub answers some calls with a 401 that quotes the key it
was sent, as some providers do, so the key flows into error messages. Then every file under the
output root (job dirs with .hydra/, the sweep's multirun.yaml, the journal, the response cache,
mlflow.db, mlartifacts) and everything the CLI printed is searched for each key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli_runner import cli_command, cli_env, job_dirs, read_jsonl, run_cli
from helpers.cupid_data import write_dataset
from helpers.stub_llm_server import StubServer

from cupid_exp import secrets as secrets_module

KEYS = {
    "OPENAI_API_KEY": "sk-envOPENAI-fake-0a1b2c3d4e5f",
    "OPENAI_COMPATIBLE_API_KEY": "sk-envCOMPAT-fake-9z8y7x6w5v",  # the evaluator roles' api_key_env
    "ANTHROPIC_API_KEY": "sk-ant-envFAKE-13579bdf",
    "STUB_CREDS": "stubcreds-fake-24680ace",  # a name no pattern catches; only model.api_key_env names it
}
OVERRIDE_KEY = "sk-override-FAKE-5f4e3d2c1b0a"


def leaks(root: Path, outputs: list[str]) -> list[str]:
    found = []
    secrets = [*KEYS.values(), OVERRIDE_KEY]
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.relative_to(root)}: {s}" for s in secrets if s.encode() in data]
    for i, text in enumerate(outputs):
        found += [f"output {i}: {s}" for s in secrets if s in text]
    return found


@pytest.mark.slow
def test_no_key_appears_in_outputs_logs_hydra_files_or_mlflow(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 12)
    root = tmp_path / "out"  # the response cache stays under it too (runtime.cache_dir default)
    env = cli_env(**KEYS)
    overrides = ["model.api_key_env=STUB_CREDS", f"+evaluator.decomposer.params.api_key={OVERRIDE_KEY}",
                 "runtime.num_retries=0", "runtime.max_failed_fraction=1"]
    outputs = []
    # a 400 quoting the key: counted per instance, so the key flows into the journal, the records and MLflow
    with StubServer(echo_key_steps=("infer", "decompose", "match"), echo_key_rate=0.35, seed=2,
                    echo_key_status=400) as stub:
        cmd = cli_command(stub.url, root, *overrides, data=data)
        single = run_cli(cmd, env=env)
        outputs += [single.stdout, single.stderr]
        echoed = {step for step, kinds in stub.stats()["faults"].items() if kinds.get("echo_key")}
        assert echoed == {"infer", "decompose", "match"}  # each role's key was quoted back at least once
        sweep = run_cli([*cmd[:3], "-m", *cmd[3:]], env=env)  # a one-job sweep: multirun.yaml, parent run
        outputs += [sweep.stdout, sweep.stderr]
    failing = run_cli([*cmd, "data.strict=true", f"data.path={tmp_path / 'missing.jsonl'}"], env=env, check=False)
    outputs += [failing.stdout, failing.stderr]
    assert failing.returncode != 0
    # a 401 quoting the key stops the job (a fatal refusal): its one line quotes the key, masked
    with StubServer(echo_key_steps=("infer",), seed=2) as stub:
        fatal = run_cli([*cli_command(stub.url, root, *overrides, "runtime.cache=false", data=data),
                         "paths.output_root=" + str(tmp_path / "fatal")], env=env, check=False)
    outputs += [fatal.stdout, fatal.stderr]
    assert fatal.returncode == 2 and "invalid_api_key" in fatal.stderr and "***" in fatal.stderr, fatal.stderr[-2000:]

    # the keys did flow into what we write, masked: the failures quote them
    (job, *_) = job_dirs(root / "runs")
    records = read_jsonl(job / "instances.jsonl")
    quoted = [e for r in records for e in r["errors"] if "key" in e["message"]]
    assert quoted and all("***" in e["message"] for e in quoted)
    assert (root / "multirun").exists() and list((root / "multirun").glob("*/*/multirun.yaml"))
    assert list(root.glob("journal/*.jsonl")) and (root / "mlflow.db").exists()
    assert list(root.glob("mlartifacts/**/instances.jsonl")) and list(root.glob("cache/*"))
    assert list(root.glob("runs/*/*/.hydra/overrides.yaml"))

    assert leaks(root, outputs) == []


class _EnvLosingAKey(dict):
    """An environment where one name is listed but gone when read, as when another thread deletes it."""

    def __getitem__(self, key: str) -> str:
        if key == "_VANISHING_TOKEN":
            raise KeyError(key)
        return super().__getitem__(key)

    def get(self, key: str, default: str | None = None) -> str | None:
        try:
            return self[key]
        except KeyError:
            return default

    def items(self):  # like os._Environ: items are read through __getitem__
        return [(k, self[k]) for k in list(self)]


def test_secret_values_tolerate_a_variable_deleted_while_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _EnvLosingAKey({"_VANISHING_TOKEN": "x" * 20, "MY_API_KEY": "sk-still-here-123456"})
    monkeypatch.setattr(secrets_module.os, "environ", env)
    assert secrets_module.secret_values() == ["sk-still-here-123456"]


class _EnvDeletingOnRead(dict):
    """An environment where a variable is deleted by another thread right after its first read."""

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.pop(key, default)


def test_secret_named_by_api_key_env_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for config in ({"model": {"api_key_env": "STUB_CREDS"}}, ["model.api_key_env=STUB_CREDS"]):
        monkeypatch.setattr(secrets_module.os, "environ", _EnvDeletingOnRead(STUB_CREDS="stubcreds-fake-24680ace"))
        assert list(secrets_module._config_secrets(config)) == ["stubcreds-fake-24680ace"]
