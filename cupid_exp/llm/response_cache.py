"""Where litellm's response cache keeps its entries: on disk, as JSON, shared by every job on the machine.

litellm removed its disk backend, but its ``Cache`` still does the caching through a ``BaseCache``; this one is
diskcache's SQLite store holding JSON, never pickles (a pickle read from a shared folder can run code), and reads
the same under every litellm version the project accepts. litellm swallows a failed background write, so it is
kept and raised in the call's path (``raise_failed_write``: exit 5). A store SQLite cannot read is set aside whole
and replaced; one found unreadable later is a miss and no longer written. Reads and writes run on the store's own
threads, never on the event loop (``_on``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from litellm.caching.base_cache import BaseCache

from cupid_exp.aside import set_aside
from cupid_exp.outputs import writing

if TYPE_CHECKING:
    from diskcache import Cache as DiskCache
    from litellm.caching.caching import Cache

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the store's folder under ``calls.cache_dir`` (older litellm's disk cache pickled into the folder itself)
STORE_FOLDER = "responses"
#: a request's cache option (beside its namespace) saying that its model scores cut replies (``keep_cut_replies``): such
#: a reply is its answer, kept like any other, so a later job with the same request does not generate it again
KEEP_CUT = "cupid_keep_cut"


class DiskResponseStore(BaseCache):
    """litellm's cache backend over ``diskcache`` with JSON values. An entry that cannot be read back (another
    tool's format, a torn file) is a miss, never an error: the call is then simply made again."""

    def __init__(self, directory: str | Path):
        super().__init__(default_ttl=0)
        self.directory = Path(directory)
        self.failed: Exception | None = None  #: the first write that failed (``raise_failed_write``)
        self.broken = False  #: found unreadable after it opened: a miss on read, never written to again
        self._threads: dict[str, ThreadPoolExecutor] = {}  #: "read" and "write": one thread each (``_on``)
        self._threads_pid = 0
        try:
            self.store = self._open()
        except sqlite3.DatabaseError as exc:
            if not corrupt(exc):
                raise
            self.store = self._set_aside(exc)

    def _open(self) -> DiskCache:
        import diskcache

        with writing(self.directory):  # opening creates the SQLite store: a full disk is one line, exit 5
            return diskcache.Cache(str(self.directory), disk=diskcache.JSONDisk, disk_compress_level=1)

    def _set_aside(self, error: Exception) -> DiskCache:
        """Move the unreadable store's folder aside and open a new one, under a lock beside it: the jobs of a sweep
        that found it broken at once set it aside once (the later ones open the new one)."""
        from filelock import FileLock

        with FileLock(str(self.directory.with_name(f".{self.directory.name}.aside.lock"))):
            try:
                return self._open()
            except sqlite3.DatabaseError as again:
                if not corrupt(again):
                    raise
            set_aside(self.directory, "response cache", error,
                      "a new, empty one is used: the calls it answered are made again")
            return self._open()

    def _broke(self, exc: Exception) -> None:
        if not self.broken:
            self.broken = True
            log.warning("response cache %s became unreadable (%s: %s): not used for the rest of this job",
                        self.directory, type(exc).__name__, str(exc)[:200])

    def set_cache(self, key: str, value: object, **kwargs: Any) -> None:
        if self.broken or _cut(value) and not (kwargs.get("cache") or {}).get(KEEP_CUT):
            return  # a reply cut at max_tokens is no answer: a rerun asks again (``llm.steps.ask``)
        ttl = kwargs.get("ttl")
        try:
            with writing(self.directory):
                self.store.set(key, value, expire=float(ttl) if ttl else None)
        except Exception as exc:  # noqa: BLE001  # litellm would log it and go on: raised in the call's path instead
            if isinstance(exc, sqlite3.DatabaseError) and corrupt(exc):
                self._broke(exc)
            else:
                self.failed = self.failed or exc

    async def async_set_cache(self, key: str, value: object, **kwargs: object) -> None:
        await self._on("write", lambda: self.set_cache(key, value, **kwargs))

    async def async_set_cache_pipeline(self, cache_list: list[tuple[str, object]], **kwargs: object) -> None:
        def store_all() -> None:
            for key, value in cache_list:
                self.set_cache(key, value, **kwargs)

        await self._on("write", store_all)

    async def _on(self, role: str, work: Callable[[], T]) -> T:
        """``work`` on the store's thread for ``role`` ("read" or "write"), one at a time, off the event loop: on it, a
        lookup's SQLite read stalled every call in flight. Not on the loop's default executor: litellm prepares every
        request there (``completion`` in ``acompletion``), and writes queued on SQLite's write lock (one writer at a
        time; a waiting one sleeps in steps of up to 100 ms) held its few threads while the next requests waited.
        Reads have a thread (and so a diskcache connection) of their own and never wait behind a write (a WAL read
        takes no lock); a call awaits its own write (``flush_cache_writes``), so a later call reads it back."""
        if self._threads_pid != os.getpid():  # a forked process has not the parent's threads
            self._threads, self._threads_pid = {}, os.getpid()
        thread = self._threads.get(role)
        if thread is None:
            thread = self._threads[role] = ThreadPoolExecutor(1, thread_name_prefix=f"cupid-cache-{role}")
        return await asyncio.get_running_loop().run_in_executor(thread, work)

    def get_cache(self, key: str, **kwargs: object) -> object:
        if self.broken:
            return None
        try:
            return self.store.get(key)
        except sqlite3.DatabaseError as exc:
            if not corrupt(exc):
                raise
            self._broke(exc)
            return None
        except (ValueError, zlib.error) as exc:  # not JSON, not deflated: an entry this store never wrote
            log.warning("response cache: entry %s in %s unreadable (%s); treated as a miss", key[:16],
                        self.directory, type(exc).__name__)
            return None

    async def async_get_cache(self, key: str, **kwargs: object) -> object:
        return await self._on("read", lambda: self.get_cache(key, **kwargs))

    def batch_get_cache(self, keys: list[str], **kwargs: object) -> list[object]:
        return [self.get_cache(key, **kwargs) for key in keys]

    async def async_batch_get_cache(self, keys: list[str], **kwargs: object) -> list[object]:
        return await self._on("read", lambda: self.batch_get_cache(keys, **kwargs))

    def delete_cache(self, key: str) -> None:
        self.store.delete(key)

    def flush_cache(self) -> None:
        self.store.clear()

    async def disconnect(self) -> None:
        for thread in self._threads.values():
            thread.shutdown(wait=True)
        self._threads = {}
        self.store.close()


def corrupt(exc: sqlite3.DatabaseError) -> bool:
    """SQLite cannot read the file (not a database, a malformed page: ``DatabaseError`` itself), as against a busy or
    unwritable one (``OperationalError``: locked, a disk I/O error, a full disk) or a refused statement (its other
    subclasses), which are not the file's fault."""
    return type(exc) is sqlite3.DatabaseError


def _cut(value: object) -> bool:
    """Whether a cache entry holds a reply that ran into max_tokens (litellm keeps the response as compact JSON)."""
    response = value.get("response") if isinstance(value, dict) else None
    return isinstance(response, str) and '"finish_reason":"length"' in response


def raise_failed_write() -> None:
    """After a call's cache writes (``_litellm.flush_cache_writes``): the first write to litellm's cache that
    failed, raised (a full disk is an ``EnvironmentFailure`` naming the folder; anything else, a bug of ours)."""
    import litellm

    store = getattr(litellm.cache, "cache", None)
    if isinstance(store, DiskResponseStore) and store.failed is not None:
        raise store.failed


def response_cache(cache_dir: str | Path) -> Cache:
    """A litellm ``Cache`` (its keys and logic) whose entries live in ``cache_dir`` (``DiskResponseStore``)."""
    import inspect

    from litellm.caching.caching import Cache
    from litellm.types.caching import LiteLLMCacheType

    # litellm >= 1.10x neither looks up nor stores requests of more than 4 messages by default
    # (``max_messages``): a simulated dialogue's later turns and a second re-ask would never be cached.
    if "max_messages" in inspect.signature(Cache).parameters:
        cache = Cache(type=LiteLLMCacheType.LOCAL, max_messages=None)
    else:
        cache = Cache(type=LiteLLMCacheType.LOCAL)
    cache.cache = DiskResponseStore(Path(cache_dir) / STORE_FOLDER)
    return cache
