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
from helpers.cli_runner import cli_command, cli_env, job_dirs, read_jsonl, run_cli, run_job

from cupid_exp import secrets as secrets_module
from cupid_exp.testing.cupid_data import write_dataset
from cupid_exp.testing.stub_llm_server import StubServer

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
    root = tmp_path / "out"  # the response cache stays under it too (calls.cache_dir default)
    env = cli_env(**KEYS)
    overrides = ["model.api_key_env=STUB_CREDS", f"+evaluator.decomposer.params.api_key={OVERRIDE_KEY}",
                 "calls.num_retries=0", "runtime.max_failed_fraction=1"]
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
    # refused before any job ran (no MLflow worker process to print): in this process
    failing = run_job([*cmd, "data.strict=true", f"data.path={tmp_path / 'missing.jsonl'}"], env=env, check=False)
    outputs += [failing.stdout, failing.stderr]
    assert failing.returncode != 0
    # a 401 quoting the key stops the job (a fatal refusal): its one line quotes the key, masked
    with StubServer(echo_key_steps=("infer",), seed=2) as stub:
        fatal = run_cli([*cli_command(stub.url, root, *overrides, "calls.cache=false", data=data),
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


# Secrets given in the config rather than the environment: every header's value, credentials in URLs.
HEADERS = {"X-Tenant": "hdr-tenant-SENTINEL-4f3a", "X-Api-Key": "hdr-apikey-SENTINEL-77aa"}
BEARER = "hdr-bearer-SENTINEL-9c1d"  # sent as "Authorization: Bearer …"; the stub quotes it back in a 400
URL_PASSWORD = "urlpass-SENTINEL-11"
TRACKING_PASSWORD = "trkpass-SENTINEL-22"
QUERY_TOKEN = "qrytoken-SENTINEL-33"
CONFIG_SECRETS = [*HEADERS.values(), BEARER, URL_PASSWORD, TRACKING_PASSWORD, QUERY_TOKEN]
HEADER_OVERRIDE = ("+model.params.extra_headers={" + ",".join(f"{k}:{v}" for k, v in HEADERS.items())
                   + f",Authorization:'Bearer {BEARER}'}}")


def found_in(root: Path, outputs: list[str], secrets: list[str]) -> list[str]:
    found = [f"{p.relative_to(root)}: {s}" for p in sorted(root.rglob("*")) if p.is_file()
             for s in secrets if s.encode() in p.read_bytes()]
    return found + [f"output {i}: {s}" for i, text in enumerate(outputs) for s in secrets if s in text]


def test_headers_and_url_credentials_reach_the_call_but_no_file_and_no_printed_line(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data.jsonl", 6)
    root = tmp_path / "out"
    outputs: list[str] = []
    sweep = lambda cmd: [*cmd[:3], "-m", *cmd[3:]]  # noqa: E731
    # some inferences answered with a 400 quoting the bearer token: it flows into the records, the journal, MLflow
    with StubServer(record_headers=("x-tenant", "x-api-key", "authorization"), echo_key_steps=("infer",),
                    echo_key_rate=0.5, echo_key_status=400, seed=3) as stub:
        base = cli_command(stub.url, root, HEADER_OVERRIDE, "calls.num_retries=0", "runtime.max_failed_fraction=1",
                           data=data)
        for cmd in (base, sweep([*base, "data.limit=4"])):  # a sweep: multirun.yaml, the launcher's log, a parent run
            proc = run_cli(cmd)
            outputs += [proc.stdout, proc.stderr]
        sent = {name: dict(values) for name, values in stub.header_values.items()}
        echoed = stub.stats()["faults"]["infer"].get("echo_key", 0)
        # credentials in a URL: refused before any call, in one line that shows them masked
        refused = {
            "evaluator.decomposer.api_base": f"evaluator.decomposer.api_base=http://user:{URL_PASSWORD}@127.0.0.1:"
                                             f"{stub.port}/v1",
            "model.api_base": f"model.api_base='http://127.0.0.1:{stub.port}/v1?api_key={QUERY_TOKEN}'",
            "tracking.uri": f"tracking.uri=http://me:{TRACKING_PASSWORD}@127.0.0.1:9",
        }
        before = stub.stats()["total_received"]
        for key, override in refused.items():
            single = cli_command(stub.url, root, override, data=data)
            # a sweep's parent run would be opened with the tracking URI before any job checks it
            # the others refused before a job starts (in this process); a sweep over tracking.uri has its
            # parent run's worker process by then (its output is the CLI's only in a process of its own)
            for cmd in [single, sweep(single)] if key == "tracking.uri" else [single]:
                proc = (run_cli if key == "tracking.uri" else run_job)(cmd, check=False)
                outputs += [proc.stdout, proc.stderr]
                lines = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp: ")]
                assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
                assert len(lines) == 1 and f"{key}='" in lines[0] and "carries credentials" in lines[0], proc.stderr
        assert stub.stats()["total_received"] == before  # nothing was sent with a refused URL

    # the values did reach the provider, as headers
    for name, value in HEADERS.items():
        assert sent[name.lower()].get(value, 0) > 0, sent
    assert sent["authorization"].get(f"Bearer {BEARER}", 0) > 0, sent
    # ... and flowed into what we write, masked: the 400s quoted the token
    assert echoed > 0
    (job, *_) = job_dirs(root / "runs")
    quoted = [e for r in read_jsonl(job / "instances.jsonl") for e in r["errors"] if "from key" in e["message"]]
    assert quoted and all("***" in e["message"] for e in quoted)
    # the whole tree was written: Hydra's files (ours and MLflow's copies), the sweep's, the store, the journal
    assert list(root.glob("runs/*/*/.hydra/config.yaml")) and list(root.glob("runs/*/*/.hydra/hydra.yaml"))
    assert list(root.glob("mlartifacts/*/artifacts/.hydra/overrides.yaml"))
    assert list(root.glob("multirun/*/*/multirun.yaml")) and list(root.glob("multirun/*/*/*/job_status.json"))
    assert (root / "mlflow.db").exists() and list(root.glob("journal/*.jsonl"))

    assert found_in(root, outputs, CONFIG_SECRETS) == []


def test_redact_masks_every_header_and_the_credentials_of_urls() -> None:
    headers = {**HEADERS, "Authorization": f"Bearer {BEARER}"}
    config = {"model": {"api_base": f"http://user:{URL_PASSWORD}@host/v1?api_key={QUERY_TOKEN}&stream=1",
                        "params": {"temperature": 0, "extra_headers": headers}},
              "tracking": {"uri": "sqlite:///outputs/mlflow.db"}}
    assert secrets_module.redact(config) == {
        "model": {"api_base": "http://***@host/v1?api_key=***&stream=1",
                  "params": {"temperature": 0, "extra_headers": {"X-Tenant": "***", "X-Api-Key": "***",
                                                                  "Authorization": "***"}}},
        "tracking": {"uri": "sqlite:///outputs/mlflow.db"}}


def test_secret_values_read_headers_and_urls_from_overrides_as_hydra_saves_them() -> None:
    overrides = [HEADER_OVERRIDE, f"model.api_base=http://user:{URL_PASSWORD}@host/v1",
                 # a sweep's job overrides, as Hydra writes them: a URL's colons escaped
                 f"tracking.uri=http\\://me\\:{TRACKING_PASSWORD}@host\\:5000", "model=gpt4o,claude"]
    found = secrets_module.secret_values(overrides)
    assert {*HEADERS.values(), BEARER, f"Bearer {BEARER}", URL_PASSWORD, TRACKING_PASSWORD} <= set(found)
    assert not {"gpt4o", "claude", "host"} & set(found)
    scrubbed = [secrets_module.scrub(o, found) for o in overrides]
    assert not [s for s in CONFIG_SECRETS if any(s in o for o in scrubbed)]
    assert scrubbed[1] == "model.api_base=http://***@host/v1" and scrubbed[3] == "model=gpt4o,claude"


def test_a_value_shaped_like_a_key_is_a_secret_under_any_name_and_a_model_name_is_not() -> None:
    """``model=sk-…`` (a key where a choice goes) is refused by quoting it: such a value is a secret whatever the
    setting; the names a command line carries (models, options, runs, a git commit) are not."""
    keys = ["sk-proj-ABCdef1234567890XYZ", "hf_AbCdEfGhIjKlMnOpQrStUvWx", "AIzaSyA1234567890abcdefghijklmnopq",
            "oRZ3k9mXbT2qPp7LwV8sYc1nHd5eFgJa"]
    names = ["gemini_flash_thinking", "Meta-Llama-3-70B-Instruct", "claude-3-5-sonnet-20241022", "skeleton_key_run",
             "my_experiment_2026_11_28_final", "0123456789abcdef0123456789abcdef01234567"]
    found = secrets_module.secret_values([f"model={keys[0]}", f"llm@evaluator.judge={keys[1]},gpt4o",
                                          f"tracking.run_name={keys[2]}", f"data.path={keys[3]}",
                                          *(f"model.name={n}" for n in names)])
    assert set(keys) <= set(found) and not set(names) & set(found)


def test_a_section_named_like_a_secret_is_not_one_and_a_scrubbed_yaml_file_stays_yaml(tmp_path) -> None:
    """Hydra's own hydra.yaml has ``callbacks.redact_secrets._target_``: a key's name marks its own value, not the
    section under it; and a value that now starts with the mask would read as a YAML alias (``*``)."""
    import yaml

    from cupid_exp.secrets import redact, scrub_file, secret_values

    text = ("hydra:\n  callbacks:\n    redact_secrets:\n      _target_: cupid_exp.tracking.callbacks.RedactSecrets\n"
            "model:\n  params:\n    api_key: sk-sentinel-12345\n    extra_headers:\n"
            "      Authorization: Bearer sk-sentinel-12345\n  notes:\n  - sk-sentinel-12345 it's\n")
    config = yaml.safe_load(text)
    secrets = secret_values(config)
    assert "cupid_exp.tracking.callbacks.RedactSecrets" not in secrets and "sk-sentinel-12345" in secrets
    assert redact(config)["hydra"] == config["hydra"]
    path = tmp_path / "hydra.yaml"
    path.write_text(text)
    scrub_file(path, secrets)
    assert "sk-sentinel" not in path.read_text()
    assert yaml.safe_load(path.read_text()) == {
        "hydra": config["hydra"],
        "model": {"params": {"api_key": "***", "extra_headers": {"Authorization": "***"}}, "notes": ["*** it's"]}}
