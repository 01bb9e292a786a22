"""A spending limit across calls, worker processes and a sweep's jobs: each request *reserves* its worst case and
*settles* its bill, in JSON ledgers under a file lock; a call that cannot fit raises ``BudgetExceeded`` or waits."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, TypeVar

from cupid_exp.aside import set_aside
from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.errors import ConfigError
from cupid_exp.llm.billing import lost_after_sending
from cupid_exp.llm.messages import Message
from cupid_exp.llm.usage import WorstCase

if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger(__name__)

_T = TypeVar("_T")
Ledgers = list[tuple["Account", dict[str, Any]]]  # each account with its ledger file's data

LEDGER_FILE = "budget.json"
_TOKENS_PER_MESSAGE = 16  # role and framing tokens a chat format adds per message (OpenAI's: 3-4)
_STALE_S = 24 * 3600  # a reservation of another host this old died with its process: charged in full
_WAIT_S = 0.05  # poll interval while other calls' reservations may come back unused


_ORDER: contextvars.ContextVar[float] = contextvars.ContextVar("cupid_budget_order", default=math.inf)
_STARTS = itertools.count()


def started_instance() -> None:
    """Mark the calls of the instance starting in this task (and the tasks it starts) as younger than any before."""
    _ORDER.set(next(_STARTS))


class BudgetExceeded(Exception):
    """A call not sent: its worst-case cost does not fit what is left of a budget (the job stops, exit 4)."""

    def __init__(self, account: "Account", spent: float, needed: float):
        self.account, self.spent, self.needed = account, spent, needed
        super().__init__(f"{account.key}={account.cap:g}: ${spent:.4f} spent, the next call may cost up to "
                         f"${needed:.4f}")


@dataclass(frozen=True)
class Prices:
    """USD per token, and the longest reply the model can give when a call does not bound it."""

    input: float
    output: float
    max_output_tokens: int | None = None


def model_prices(model: ModelConfig) -> Prices | None:
    """The model's prices: 0 for an embedded model, the config's own, else litellm's price map; None: unpriced."""
    if model.is_embedded:
        return Prices(0.0, 0.0, None)
    info: Mapping[str, Any] = {}
    given = model.model_info
    if not given.priced or not model.params.get("max_tokens"):
        import litellm

        provider, _, name = model.litellm_model.partition("/")
        try:
            info = litellm.get_model_info(model=name, custom_llm_provider=provider) or {}
        except (litellm.exceptions.ModelNotMappedError, litellm.exceptions.BadRequestError,
                litellm.exceptions.NotFoundError, ValueError):
            info = {}
    cost_in = given.input_cost_per_token if given.input_cost_per_token is not None else info.get("input_cost_per_token")
    cost_out = (given.output_cost_per_token if given.output_cost_per_token is not None
                else info.get("output_cost_per_token"))
    if cost_in is None or cost_out is None:
        return None
    return Prices(float(cost_in), float(cost_out), info.get("max_output_tokens") or info.get("max_tokens"))


def check_priced(models: Iterable[ModelConfig], settings: CallsConfig) -> None:
    """Before the first call: a budget needs every model's price and a bound on its replies (one-line ConfigError)."""
    key, cap = (("calls.max_cost_usd", settings.max_cost_usd) if settings.max_cost_usd is not None
                else ("calls.sweep_max_cost_usd", settings.sweep_max_cost_usd))
    if cap is None:  # no budget
        return
    for model in models:
        prices = model_prices(model)
        if prices is None:
            raise ConfigError(f"{key}={cap:g} needs a price for model {model.name!r} ({model.litellm_model}): "
                              "litellm's price map does not list it; set its model_info.input_cost_per_token and "
                              "model_info.output_cost_per_token")
        if not model.is_embedded and not (model.params.get("max_tokens") or model.params.get("max_completion_tokens")
                                          or prices.max_output_tokens):
            raise ConfigError(f"{key}={cap:g} needs a bound on the replies of model {model.name!r} "
                              f"({model.litellm_model}): set its params.max_tokens")


def priced(model: ModelConfig, settings: CallsConfig) -> Prices:
    """The prices of a model a budgeted client calls (checked by the job before, ``check_priced``)."""
    check_priced([model], settings)
    return model_prices(model)  # type: ignore[return-value]


def worst_case_usd(prices: Prices, messages: list[Message], kwargs: Mapping[str, Any]) -> float:
    """An upper bound on a call's cost: every prompt byte a token, plus framing and schema, and ``max_tokens`` out. Far
    cheaper than exact counting; it only stops a budget's last call a little early."""
    return in_flight_worst(prices, messages, kwargs).usd if prices.input or prices.output else 0.0


def worst_case_tokens(messages: list[Message], kwargs: Mapping[str, Any],
                      max_output: int | None) -> tuple[int, int]:
    """(prompt, reply): upper bounds on a call's tokens (``worst_case_usd``), for a price other than the live one."""
    prompt = sum(len(str(m.get("content") or "").encode()) + _TOKENS_PER_MESSAGE for m in messages)
    if kwargs.get("response_format") is not None:
        prompt += len(json.dumps(kwargs["response_format"]).encode())
    reply = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or max_output or 0
    return prompt, int(reply)


def in_flight_worst(prices: Prices | None, messages: list[Message], kwargs: Mapping[str, Any]) -> WorstCase:
    """A request's worst case while in flight, costed at ``prices`` (unpriced: nothing)."""
    prompt, reply = worst_case_tokens(messages, kwargs, prices.max_output_tokens if prices is not None else None)
    usd = prompt * prices.input + reply * prices.output if prices is not None else 0.0
    return WorstCase(usd, prompt, reply)


@dataclass(frozen=True)
class Account:
    """One limit: its ledger file, the cap in USD and the setting that set it (for the messages)."""

    path: str
    cap: float
    key: str
    floor: float = 0.0  #: where an unreadable ledger counts again from (``_restart``)

    @property
    def scope(self) -> str:
        return "sweep" if self.key.endswith("sweep_max_cost_usd") else "job"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _load(fd: int, account: Account) -> dict[str, Any]:
    raw = os.pread(fd, os.fstat(fd).st_size, 0)
    try:
        data = json.loads(raw) if raw.strip() else {}
        if not isinstance(data, dict) or not isinstance(data.get("spent", 0.0), (int, float)) or \
                not isinstance(data.get("reservations", {}), dict):
            raise ValueError("not a budget ledger")
    except ValueError as exc:  # JSON's errors and undecodable bytes are ValueErrors
        return _restart(account, exc)
    data.setdefault("spent", 0.0)
    data.setdefault("reservations", {})
    return data


def _restart(account: Account, error: Exception) -> dict[str, Any]:
    """An unreadable ledger: copied aside, and counted again from the account's ``floor``, never from nothing."""
    set_aside(Path(account.path), "budget ledger", error,
              f"it counts again from ${account.floor:.4f}, what the job's usage ledger counted of its earlier attempts "
              "(a request a killed attempt left in flight is not in it)", copy=True)
    return {"spent": account.floor, "reservations": {}, "restarted_from": account.floor}


def _save(fd: int, data: Mapping[str, Any]) -> None:
    """Rewrite in place under the lock, padded to the old length: never cut short, no rename paid."""
    raw = json.dumps(data, sort_keys=True).encode()
    os.pwrite(fd, raw.ljust(os.fstat(fd).st_size), 0)


def _purge_dead(data: dict[str, Any]) -> None:
    """Reservations of processes that died before settling are charged in full: their requests may have been paid."""
    host, now = socket.gethostname(), time.time()
    for rid, held in list(data["reservations"].items()):
        gone = (not _alive(int(held["pid"]))) if held.get("host") == host else now - held.get("at", now) > _STALE_S
        if gone:
            data["spent"] += float(held["usd"])
            data["charged_unsettled"] = data.get("charged_unsettled", 0.0) + float(held["usd"])
            del data["reservations"][rid]


@dataclass
class Budget:
    """The accounts a job's calls draw on (its own, its sweep's); picklable for the job's worker processes."""

    accounts: list[Account]
    refused: int = 0  #: calls this process did not send
    _locks: dict[str, FileLock] = field(default_factory=dict, repr=False, compare=False)
    _files: dict[str, int] = field(default_factory=dict, repr=False, compare=False)  #: path -> open descriptor
    _waiting: dict[str, float] = field(default_factory=dict, repr=False, compare=False)  #: rid -> instance order

    def __getstate__(self) -> dict[str, Any]:
        return {"accounts": self.accounts, "refused": self.refused, "_locks": {}, "_files": {}, "_waiting": {}}

    def _lock(self, account: Account) -> FileLock:
        from filelock import FileLock

        if account.path not in self._locks:
            Path(account.path).parent.mkdir(parents=True, exist_ok=True)
            # a short poll: the lock is held for one read and one write (well under a millisecond)
            self._locks[account.path] = FileLock(account.path + ".lock", timeout=60, poll_interval=0.001)
        return self._locks[account.path]

    def _file(self, account: Account) -> int:
        if account.path not in self._files:
            self._files[account.path] = os.open(account.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._files[account.path]

    def _update(self, change: Callable[[Ledgers], _T]) -> _T:
        """``change(ledgers)`` on every account's ledger at once, under all their locks (taken in path order)."""
        accounts = sorted(self.accounts, key=lambda a: a.path)
        with contextlib.ExitStack() as locked:  # released in reverse order
            for account in accounts:
                locked.enter_context(self._lock(account))
            ledgers = [(a, _load(self._file(a), a)) for a in accounts]
            for _, data in ledgers:
                _purge_dead(data)
            result = change(ledgers)
            for account, data in ledgers:
                data["cap"] = account.cap
                _save(self._file(account), data)
            return result

    async def reserve(self, usd: float) -> "Reservation":
        """Hold ``usd`` on every account, waiting while reservations may return; else BudgetExceeded."""
        rid, order = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}", _ORDER.get()

        def change(ledgers: Ledgers) -> BudgetExceeded | bool:
            """Held (True), or to wait while reservations may return (False), or the account's refusal."""
            waiting = False
            for account, data in ledgers:
                spent, held = data["spent"], sum(r["usd"] for r in data["reservations"].values())
                if spent + usd > account.cap * (1 + 1e-12):
                    data["refusals"] = data.get("refusals", 0) + 1
                    return BudgetExceeded(account, spent, usd)
                waiting = waiting or spent + held + usd > account.cap * (1 + 1e-12)
            if not waiting:
                entry = {"usd": usd, "pid": os.getpid(), "host": socket.gethostname(), "at": time.time()}
                for _, data in ledgers:
                    data["reservations"][rid] = entry
            return not waiting

        try:
            while True:
                if not any(o < order for o in self._waiting.values()):  # an older instance's call waits: after it
                    verdict = self._update(change)
                    if isinstance(verdict, BudgetExceeded):
                        self.refused += 1
                        raise verdict
                    if verdict:
                        return Reservation(self, rid, usd)
                self._waiting[rid] = order
                await asyncio.sleep(_WAIT_S)
        finally:
            self._waiting.pop(rid, None)

    def settle(self, rid: str, usd: float) -> None:
        def change(ledgers: Ledgers) -> None:
            for _, data in ledgers:
                if data["reservations"].pop(rid, None) is not None:
                    data["spent"] += usd
        self._update(change)

    def state(self) -> list[tuple[Account, float]]:
        """Each account with what was spent from it so far (settled, and charged for dead processes)."""
        return self._update(lambda ledgers: [(a, float(d["spent"])) for a, d in ledgers])


@dataclass
class Reservation:
    """A call's held worst case: ``settle`` with its actual cost, or ``failed`` when no reply came."""

    budget: Budget
    rid: str
    usd: float

    def settle(self, usd: float | None, beyond: float = 0.0) -> None:
        """``usd``: the request's cost; ``beyond``: what earlier unreserved requests of the call were billed."""
        if usd is None or not math.isfinite(usd):
            usd = self.usd  # a reply litellm could not price: charged its worst case
        elif usd > self.usd * (1 + 1e-9):
            log.warning("a call cost $%.6f, more than the $%.6f reserved for it", usd, self.usd)
        self.budget.settle(self.rid, max(0.0, usd) + beyond)

    def failed(self, exc: BaseException, beyond: float = 0.0) -> None:
        """No reply: returned in full, or charged its worst case if it may have been billed."""
        self.budget.settle(self.rid, (self.usd if lost_after_sending(exc) else 0.0) + beyond)


async def reserve_call(client: Any, messages: list[Message], kwargs: Mapping[str, Any],
                       step: str) -> Reservation | None:
    """Hold a request's worst case on the budget before sending (None without one); a refusal is counted on the step."""
    if client.budget is None:
        return None
    try:
        reservation: Reservation = await client.budget.reserve(worst_case_usd(client.pricing.worst, messages, kwargs))
        return reservation
    except BudgetExceeded:
        client.meter.refuse(step, "budget")
        raise
