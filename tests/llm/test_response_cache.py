"""The response cache's store on disk: litellm's caching over JSON entries that outlive the process."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import zlib
from pathlib import Path

from cupid_exp.config import CallsConfig, ModelConfig
from cupid_exp.llm import client as client_module
from cupid_exp.llm.client import LLMClient, configure_litellm
from cupid_exp.llm.response_cache import STORE_FOLDER
from cupid_exp.llm.usage import UsageMeter
from cupid_exp.testing.fault_server import ScriptedServer, completion_body

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"},
            {"role": "assistant", "content": "four"}, {"role": "user", "content": "five?"}]  # > 4 messages


def fresh_client(tmp_path: Path, url: str, **model: object) -> LLMClient:
    """A client on a newly built cache object (as in a new process): only the disk carries entries over."""
    client_module._CACHE_DIR = None
    runtime = CallsConfig(cache_dir=str(tmp_path / "cache"), num_retries=0, timeout=30)
    configure_litellm(runtime)
    return LLMClient(ModelConfig(name="m", litellm_model="openai/scripted", api_base=url, **model), runtime,
                     UsageMeter())


def rows(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "cache" / STORE_FOLDER / "cache.db") as db:
        return db.execute("SELECT rowid, mode, value, filename FROM Cache").fetchall()


def test_a_reply_is_served_from_disk_to_a_new_cache_object(tmp_path) -> None:
    with ScriptedServer([(200, completion_body("six"), {})]) as server:
        first = asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
        again = asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
    assert (first.text, first.cached) == ("six", False)
    assert (again.text, again.cached) == ("six", True)
    assert len(server.requests) == 1


def test_entries_are_stored_as_json_never_as_pickles(tmp_path) -> None:
    with ScriptedServer([(200, completion_body("six"), {})]) as server:
        asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
    (rowid, mode, value, filename), = rows(tmp_path)
    assert mode != 4, "diskcache's MODE_PICKLE"
    raw = value if value is not None else (tmp_path / "cache" / STORE_FOLDER / filename).read_bytes()
    entry = json.loads(zlib.decompress(raw))
    assert json.loads(entry["response"])["choices"][0]["message"]["content"] == "six"


def test_an_unreadable_entry_is_a_miss_and_the_call_is_made_again(tmp_path, caplog) -> None:
    with ScriptedServer([(200, completion_body("six"), {})]) as server:
        asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
        (rowid, *_), = rows(tmp_path)
        with sqlite3.connect(tmp_path / "cache" / STORE_FOLDER / "cache.db") as db:
            db.execute("UPDATE Cache SET value = ?, mode = 1, filename = NULL WHERE rowid = ?",
                       (b"not deflated json", rowid))
        with caplog.at_level(logging.WARNING, logger="cupid_exp.llm.response_cache"):
            again = asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
    assert (again.text, again.cached) == ("six", False)
    assert len(server.requests) == 2
    assert any("unreadable" in r.getMessage() for r in caplog.records)


GARBAGE = b"\x00\x17not a database, as a torn copy leaves it\xff" * 64


def test_a_store_sqlite_cannot_read_is_set_aside_and_the_call_made_again(tmp_path, caplog) -> None:
    """A corrupt cache file stops nothing: its folder is renamed aside whole, said in one warning naming both, and
    the call goes to the provider and into a new store."""
    store = tmp_path / "cache" / STORE_FOLDER
    with ScriptedServer([(200, completion_body("six"), {})]) as server:
        asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
        for extra in store.glob("cache.db-*"):
            extra.unlink()
        (store / "cache.db").write_bytes(GARBAGE)
        with sqlite3.connect(store / "cache.db") as db:  # the fault: SQLite cannot read it
            try:
                db.execute("SELECT 1 FROM Cache")
                raise AssertionError("still a database")
            except sqlite3.DatabaseError as exc:
                assert "not a database" in str(exc)
        with caplog.at_level(logging.WARNING, logger="cupid_exp.aside"):
            again = asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
            after = asyncio.run(fresh_client(tmp_path, server.url).complete(MESSAGES, step="s"))
    assert (again.text, again.cached, after.cached) == ("six", False, True)  # the new store keeps the reply
    assert len(server.requests) == 2
    (aside,) = tmp_path.glob(f"cache/{STORE_FOLDER}.corrupt-*")
    assert (aside / "cache.db").read_bytes() == GARBAGE
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"response cache {store} is unreadable (DatabaseError: file is not a database): set "
                           f"aside as {aside.name}; a new, empty one is used"), line


def test_a_store_found_malformed_after_it_opened_is_a_miss_said_once_and_no_longer_written(tmp_path, caplog) -> None:
    from cupid_exp.llm.response_cache import DiskResponseStore

    store = DiskResponseStore(tmp_path / "responses")
    store.set_cache("k", {"v": 1})
    calls = []

    def malformed(*args, **kwargs):
        calls.append(args)
        raise sqlite3.DatabaseError("database disk image is malformed")

    store.store.get = store.store.set = malformed
    with caplog.at_level(logging.WARNING, logger="cupid_exp.llm.response_cache"):
        assert store.get_cache("k") is None and store.get_cache("k") is None
        store.set_cache("k2", {"v": 2})
    assert len(calls) == 1 and store.failed is None  # one read failed; nothing after it touched the store
    (line,) = [r.getMessage() for r in caplog.records]
    assert "became unreadable (DatabaseError: database disk image is malformed)" in line


def test_writes_run_on_the_stores_own_thread_not_the_loops_executor(tmp_path, monkeypatch) -> None:
    """litellm prepares each request on the event loop's default executor (a few threads); the cache's writes have one
    thread of their own, so writes waiting on SQLite's write lock never hold the threads the next requests need."""
    import threading

    from cupid_exp.llm.response_cache import DiskResponseStore

    seen: list[str] = []
    real = DiskResponseStore.set_cache
    monkeypatch.setattr(DiskResponseStore, "set_cache",
                        lambda self, *a, **k: seen.append(threading.current_thread().name) or real(self, *a, **k))
    with ScriptedServer([(200, completion_body(text), {}) for text in ("a", "b", "c")]) as server:
        client = fresh_client(tmp_path, server.url)

        async def three() -> None:
            await asyncio.gather(*(client.complete([{"role": "user", "content": f"q{i}"}], step="s") for i in range(3)))

        asyncio.run(three())
    assert len(rows(tmp_path)) == 3 and len(seen) == 3  # each reply written once
    assert set(seen) == {seen[0]} and seen[0].startswith("cupid-cache-write"), seen


def test_a_twin_queued_behind_its_call_is_served_the_reply_that_call_wrote(tmp_path, monkeypatch) -> None:
    """Two identical requests at once on a model that takes one at a time (the embedded model, a sweep's instances
    that see the same prompt): the second, let in as the first ends, is served from the entry the first wrote on the
    store's thread (slowed here, so that it is still being written), and only one request is sent."""
    import time

    from cupid_exp.llm.response_cache import DiskResponseStore

    real = DiskResponseStore.set_cache
    monkeypatch.setattr(DiskResponseStore, "set_cache", lambda self, *a, **k: time.sleep(0.3) or real(self, *a, **k))
    with ScriptedServer([(200, completion_body(text), {}) for text in ("six", "seven")]) as server:
        client = fresh_client(tmp_path, server.url, max_concurrency=1)

        async def twins() -> list:
            return await asyncio.gather(*(client.complete(MESSAGES, step="s") for _ in range(2)))

        first, second = asyncio.run(twins())
    assert len(server.requests) == 1, server.requests
    assert not first.cached and second.cached and second.text == first.text == "six"


def test_a_cut_reply_is_cached_only_for_a_model_that_scores_cut_replies(tmp_path) -> None:
    """A reply cut at max_tokens is no answer (its step asks again, then fails): never kept, a rerun asks again. For a
    model that scores its cut replies (``keep_cut_replies``: the embedded model, whose free text always runs to the
    cap) it is the answer: kept, so a later job with the same request (the README's commands) does not generate it
    again."""
    cut = completion_body("a reply that ran on")
    cut["choices"][0]["finish_reason"] = "length"
    sent = {}
    for keep in (False, True):
        with ScriptedServer([(200, cut, {})] * 2) as server:
            client = fresh_client(tmp_path / str(keep), server.url, keep_cut_replies=keep)

            async def twice(client: LLMClient) -> list:
                return [await client.complete(MESSAGES, step="s") for _ in range(2)]

            replies = asyncio.run(twice(client))
        assert all(r.finish_reason == "length" and r.text == "a reply that ran on" for r in replies)
        sent[keep] = len(server.requests)
    assert sent == {False: 2, True: 1}, sent


def test_a_call_computes_its_cache_key_once_and_the_key_is_litellms_own(tmp_path, monkeypatch) -> None:
    """litellm computed the key for the lookup and again for the write; given as ``cache_key`` it is computed once
    per request. The key is the one litellm computes itself: a reply it stored under its own key (as older runs did)
    is served from the cache."""
    import litellm
    from litellm.caching.caching import Cache

    from cupid_exp.llm import _litellm

    keys: list[str] = []
    real = Cache._get_hashed_cache_key
    monkeypatch.setattr(Cache, "_get_hashed_cache_key", staticmethod(lambda material: keys.append(material) or
                                                                     real(material)))
    with ScriptedServer([(200, completion_body(text), {}) for text in ("six", "seven")]) as server:
        client = fresh_client(tmp_path, server.url)

        async def calls() -> tuple:
            older = [{"role": "user", "content": "stored by litellm alone"}]
            sent = {**client.request_params(None, client.step_params("s", None)), **client._send_params}
            await litellm.acompletion(messages=older, **sent)  # the key litellm computes itself, for both
            await _litellm.flush_cache_writes()
            keys.clear()
            miss = await client.complete(MESSAGES, step="s")  # a lookup and a write
            hit = await client.complete(MESSAGES, step="s")  # a lookup
            return miss, hit, await client.complete(older, step="s")

        miss, hit, older = asyncio.run(calls())
    assert len(server.requests) == 2 and not miss.cached and hit.cached and older.cached
    assert len(keys) == 3, keys  # one per request: 2 before
    assert all("cache_key" not in body for body in server.requests)  # litellm's option, never sent


def test_the_event_loop_never_runs_a_statement_on_the_store(tmp_path, monkeypatch) -> None:
    """A lookup is a SQLite read (and a decompression); on the loop it blocked every call in flight. Each statement
    on the store's connections is recorded with the thread that runs it: during the calls (a miss, then hits read
    back from the store) none is the loop's."""
    import threading

    import diskcache.core

    from cupid_exp.llm.response_cache import DiskResponseStore

    statements: list[tuple[int, str]] = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):  # every connection the store opens, from before it opens
        con = connect(*args, **kwargs)
        con.set_trace_callback(lambda sql: statements.append((threading.get_ident(), sql)))
        return con

    monkeypatch.setattr(diskcache.core.sqlite3, "connect", traced)
    lookups = []
    real = DiskResponseStore.get_cache
    monkeypatch.setattr(DiskResponseStore, "get_cache", lambda self, *a, **k: lookups.append(a) or real(self, *a, **k))
    with ScriptedServer([(200, completion_body("six"), {})]) as server:
        client = fresh_client(tmp_path, server.url)
        statements.clear()  # opening the store, before any call

        async def calls() -> tuple[int, list]:
            first = await client.complete(MESSAGES, step="s")
            return threading.get_ident(), [first] + list(await asyncio.gather(
                *(client.complete(MESSAGES, step="s") for _ in range(3))))

        loop_thread, done = asyncio.run(calls())
    assert [c.cached for c in done] == [False, True, True, True] and len(server.requests) == 1
    assert len(lookups) == 4 and any(sql.startswith("INSERT") for _, sql in statements)  # 4 reads, the reply written
    on_loop = [sql for thread, sql in statements if thread == loop_thread]
    assert not on_loop, on_loop
