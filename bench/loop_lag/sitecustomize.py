"""Event-loop lag of a process's ``asyncio.run`` (a bench hook, not part of cupid-exp): with ``CUPID_BENCH_LOOP_LAG``
set to a folder and this folder first on ``PYTHONPATH``, every ``asyncio.run`` in the process is watched by a thread
that every 10 ms hands the loop a callback and records how late the loop ran it (a stall of the loop delays every
call's next step), and the collections of the GC's oldest generation, with their times. Written as ``<pid>.json`` in
that folder when the run ends (``bench/versus_official.py`` reads it). The job ends with ``os._exit``, after its
``asyncio.run``.

The watcher is a thread, not a task on the loop: the job's last step waits for every task still pending on its loop
(``llm.client.drain_background_tasks``, up to 10 s), so a sampling task would have held each run's end by that much."""

import os

if os.environ.get("CUPID_BENCH_LOOP_LAG"):
    import asyncio
    import gc
    import json
    import threading
    import time

    _run = asyncio.run
    _EVERY_S = 0.01

    def _collections(start: float, found: list) -> object:
        began: dict = {}

        def callback(phase: str, info: dict) -> None:
            if info.get("generation") != 2:
                return
            if phase == "start":
                began["t"] = time.perf_counter()
            elif "t" in began:
                found.append([round(began["t"] - start, 3), round(time.perf_counter() - began.pop("t"), 4)])

        return callback

    def _watch(loop: asyncio.AbstractEventLoop, start: float, lags: list, stalls: list, stop: threading.Event) -> None:
        while not stop.wait(_EVERY_S):
            ran = threading.Event()
            sent = time.perf_counter()
            try:
                loop.call_soon_threadsafe(ran.set)
            except RuntimeError:  # the loop closed
                return
            while not ran.wait(0.05):
                if stop.is_set():
                    return
            lag = time.perf_counter() - sent
            lags.append(lag)
            if lag > 0.1:
                stalls.append([round(sent - start, 3), round(lag, 3)])

    def run(main, **kwargs):  # type: ignore[no-untyped-def]
        async def sampled():  # type: ignore[no-untyped-def]
            loop = asyncio.get_running_loop()
            start, lags, stalls, collections = time.perf_counter(), [], [], []
            callback = _collections(start, collections)
            gc.callbacks.append(callback)
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(loop, start, lags, stalls, stop), daemon=True)
            watcher.start()
            try:
                return await main
            finally:
                stop.set()
                gc.callbacks.remove(callback)
                lags.sort()
                out = {"seconds": round(time.perf_counter() - start, 2), "samples": len(lags),
                       "max_s": lags[-1] if lags else 0.0, "p99_s": lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
                       "stalls_over_100ms": stalls, "gen2_collections": collections}
                folder = os.environ["CUPID_BENCH_LOOP_LAG"]
                with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
                    json.dump(out, f)

        return _run(sampled(), **kwargs)

    asyncio.run = run
