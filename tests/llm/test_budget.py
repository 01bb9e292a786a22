"""The budget's ledgers: reserve the worst case, settle the actual cost, never let two processes pass the cap."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cupid_exp.config import CallsConfig, ConfigError, LocalModelConfig, ModelConfig, ModelInfo
from cupid_exp.llm.budget import Account, Budget, BudgetExceeded, check_priced, model_prices, worst_case_usd
from cupid_exp.llm.client import LLMClient, ProviderError, configure_litellm
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.fault_server import ScriptedServer, completion_body

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def ledger(path: Path) -> dict:
    return json.loads(path.read_text())


def one_account(tmp_path: Path, cap: float) -> Budget:
    return Budget([Account(str(tmp_path / "budget.json"), cap, "calls.max_cost_usd")])


# Each process reserves a random worst case, "spends" a random part of it, settles, and prints what it spent,
# until its budget refuses a call.
HAMMER = textwrap.dedent("""
    import asyncio, random, sys
    from cupid_exp.llm.budget import Account, Budget, BudgetExceeded
    budget = Budget([Account(sys.argv[1], float(sys.argv[2]), "calls.sweep_max_cost_usd")])
    rng, mine = random.Random(int(sys.argv[3])), 0.0

    async def main():
        global mine
        while True:
            worst = rng.uniform(0.5, 1.5)
            try:
                held = await budget.reserve(worst)
            except BudgetExceeded:
                return
            spent = worst * rng.uniform(0.3, 1.0)
            mine += spent
            held.settle(spent)

    asyncio.run(main())
    print(repr(mine))
""")


def test_processes_sharing_a_ledger_never_pass_its_cap_together(tmp_path: Path) -> None:
    path, cap = tmp_path / "sweep" / "budget.json", 40.0
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, str(path), str(cap), str(seed)], env=env,
                              stdout=subprocess.PIPE, text=True) for seed in range(4)]
    spent = [float(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    state = ledger(path)
    assert sum(spent) <= cap and state["spent"] == pytest.approx(sum(spent))  # no update lost, the cap held
    assert sum(1 for s in spent if s > 0) >= 2  # they really shared it
    assert state["reservations"] == {} and state["refusals"] >= 4
    assert cap - sum(spent) < 1.5  # it stopped only when the next worst case could not fit


def test_a_call_waits_for_reservations_that_may_come_back_and_is_refused_on_what_was_spent(tmp_path: Path) -> None:
    budget = one_account(tmp_path, 10.0)

    async def scenario() -> None:
        first = await budget.reserve(8.0)
        second = asyncio.ensure_future(budget.reserve(3.0))  # fits once the first's unused part comes back
        await asyncio.sleep(0.2)
        assert not second.done()
        first.settle(2.0)
        (await asyncio.wait_for(second, 5)).settle(3.0)
        with pytest.raises(BudgetExceeded) as refused:  # 5 spent: a worst case of 6 can never fit
            await budget.reserve(6.0)
        assert refused.value.spent == pytest.approx(5.0) and "calls.max_cost_usd=10" in str(refused.value)

    asyncio.run(scenario())
    assert ledger(tmp_path / "budget.json")["spent"] == pytest.approx(5.0) and budget.refused == 1
    # a higher budget (a resume) starts from what was spent
    bigger = one_account(tmp_path, 12.0)
    asyncio.run(bigger.reserve(6.0)).settle(1.0)
    assert ledger(tmp_path / "budget.json")["spent"] == pytest.approx(6.0)


def test_near_the_end_the_calls_of_older_instances_go_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cupid_exp.llm import budget as budget_module

    monkeypatch.setattr(budget_module, "_WAIT_S", 0.2)  # the young call looks at 0.2, 0.4, 0.6 s; the old at 0.5, 0.7
    budget = one_account(tmp_path, 10.0)

    async def call(order: int, usd: float) -> str:
        budget_module._ORDER.set(order)  # what started_instance sets for each instance, in its own task
        try:
            held = await budget.reserve(usd)
        except BudgetExceeded:
            return "refused"
        await asyncio.sleep(0.3)
        held.settle(usd)
        return "sent"

    async def scenario() -> list[str]:
        first = await budget.reserve(9.0)
        young = asyncio.ensure_future(call(5, 1.5))  # waits first, and looks first once there is room...
        await asyncio.sleep(0.3)
        old = asyncio.ensure_future(call(1, 1.5))  # ...but its instance started after this one's
        await asyncio.sleep(0.25)
        first.settle(8.0)  # room for one of them: the older instance's call
        return await asyncio.gather(young, old)

    assert asyncio.run(scenario()) == ["refused", "sent"]


def test_a_reservation_left_by_a_dead_process_is_charged_in_full(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    import socket

    (tmp_path / "budget.json").write_text(json.dumps({"spent": 1.0, "reservations": {
        "x": {"usd": 2.5, "pid": pid, "host": socket.gethostname(), "at": 0}}}))
    (account, spent), = one_account(tmp_path, 10.0).state()
    assert spent == pytest.approx(3.5) and ledger(tmp_path / "budget.json")["reservations"] == {}


def test_the_worst_case_bounds_the_tokens_a_tokenizer_counts() -> None:
    import litellm

    from cupid_exp.llm.budget import Prices

    for text in ("plain English words, " * 300, "ünïcödé 数据 данные " * 200):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
        tokens = litellm.token_counter(model="gpt-4o", messages=messages)
        bound = worst_case_usd(Prices(1.0, 0.0), messages, {})
        assert tokens <= bound <= 8 * tokens + 64
    assert worst_case_usd(Prices(0.0, 2.0), [{"role": "user", "content": "x"}], {"max_tokens": 100}) == 200.0
    assert worst_case_usd(Prices(0.0, 0.0), [{"role": "user", "content": "x"}], {"max_tokens": 100}) == 0.0


def test_prices_come_from_the_config_the_price_map_or_are_zero_for_an_embedded_model() -> None:
    configured = ModelConfig(name="m", litellm_model="openai/stub", params={"max_tokens": 10},
                             model_info=ModelInfo(input_cost_per_token=1e-6, output_cost_per_token=2e-6))
    assert (model_prices(configured).input, model_prices(configured).output) == (1e-6, 2e-6)
    assert model_prices(ModelConfig(name="g", litellm_model="openai/gpt-4o")).input == pytest.approx(2.5e-6)
    embedded = ModelConfig(name="l", litellm_model="cupid_local/x", local=LocalModelConfig(gguf="x.gguf"))
    assert model_prices(embedded).output == 0.0
    unpriced = ModelConfig(name="mystery", litellm_model="openai/stub", params={"max_tokens": 10})
    assert model_prices(unpriced) is None
    check_priced([unpriced], CallsConfig(cache_dir="c"))  # no budget: nothing to check
    with pytest.raises(ConfigError) as refused:
        check_priced([configured, unpriced], CallsConfig(cache_dir="c", max_cost_usd=5))
    message = str(refused.value)
    assert "\n" not in message and "'mystery' (openai/stub)" in message and "calls.max_cost_usd=5" in message


def test_a_client_settles_the_actual_cost_releases_a_failure_and_refuses_past_the_budget(tmp_path: Path) -> None:
    rt = CallsConfig(cache_dir=str(tmp_path / "cache"), cache=False, num_retries=0, timeout=30,
                       max_cost_usd=1.0)
    configure_litellm(rt)
    script = [(200, completion_body("hello"), {}), (500, {"error": {"message": "internal"}}, {})]
    budget = one_account(tmp_path, 0.005)
    with ScriptedServer(script) as server:
        model = ModelConfig(name="priced", litellm_model="openai/scripted", api_base=server.url,
                            params={"max_tokens": 1000},
                            model_info=ModelInfo(input_cost_per_token=1e-6, output_cost_per_token=4e-6))
        meter = UsageMeter()
        client = LLMClient(model, rt, meter, budget)
        messages = [{"role": "user", "content": "hi"}]
        done = asyncio.run(client.complete(messages, step="s"))
        assert ledger(tmp_path / "budget.json")["spent"] == pytest.approx(done.cost_usd) and done.cost_usd > 0
        with pytest.raises(ProviderError):
            asyncio.run(client.complete(messages, step="s"))
        state = ledger(tmp_path / "budget.json")
        assert state["spent"] == pytest.approx(done.cost_usd) and state["reservations"] == {}  # released
        sent = len(server.requests)
        with pytest.raises(BudgetExceeded):  # 1000 reply tokens at $4/M cannot fit what is left of $0.005
            asyncio.run(client.complete([{"role": "user", "content": "x" * 3000}], step="s"))
        assert len(server.requests) == sent and meter.as_dict()["s"]["not_sent_budget"] == 1


def test_an_unreadable_ledger_is_copied_aside_and_counts_again_from_the_usage_ledgers_spend(tmp_path, caplog) -> None:
    """A budget ledger of garbage stops nothing and lets nothing through for free: its bytes are kept aside, it
    counts again from what the job's usage ledger counted (``Account.floor``), and the cap still binds on that."""
    import logging

    path = tmp_path / "budget.json"
    garbage = b"\x00\x17{not json\xff" * 30
    path.write_bytes(garbage)
    with pytest.raises(ValueError):  # the fault: not JSON
        json.loads(path.read_bytes())
    budget = Budget([Account(str(path), 1.0, "calls.max_cost_usd", floor=0.75)])
    with caplog.at_level(logging.WARNING, logger="cupid_exp.aside"):
        assert budget.state()[0][1] == 0.75
    (aside,) = tmp_path.glob("budget.json.corrupt-*")
    assert aside.read_bytes() == garbage and ledger(path)["spent"] == 0.75
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"budget ledger {path} is unreadable (JSONDecodeError") and aside.name in line, line
    with pytest.raises(BudgetExceeded):  # 0.75 + 0.3 > 1.0: the restarted ledger still holds the earlier spend
        asyncio.run(budget.reserve(0.3))
    assert asyncio.run(budget.reserve(0.2)).usd == 0.2
