"""Event-loop lag of a process's ``asyncio.run`` (a bench hook, not part of cupid-exp): with ``CUPID_BENCH_LOOP_LAG``
set to a folder and this folder first on ``PYTHONPATH``, every ``asyncio.run`` in the process also runs a task that
sleeps 10 ms at a time and records how late each wake-up came (a stall of the loop delays every call's next step),
and the collections of the GC's oldest generation, with their times. Written as ``<pid>.json`` in that folder when the
run ends (``bench/versus_official.py`` reads it). The job ends with ``os._exit``, after its ``asyncio.run``."""

import os

if os.environ.get("CUPID_BENCH_LOOP_LAG"):
    import asyncio
    import gc
    import json
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

    def run(main, **kwargs):  # type: ignore[no-untyped-def]
        async def sampled():  # type: ignore[no-untyped-def]
            loop = asyncio.get_running_loop()
            start, lags, stalls, collections = loop.time(), [], [], []
            callback = _collections(time.perf_counter(), collections)
            gc.callbacks.append(callback)

            async def sample() -> None:
                while True:
                    before = loop.time()
                    await asyncio.sleep(_EVERY_S)
                    lag = loop.time() - before - _EVERY_S
                    lags.append(lag)
                    if lag > 0.1:
                        stalls.append([round(before - start, 3), round(lag, 3)])

            task = loop.create_task(sample())
            try:
                return await main
            finally:
                task.cancel()
                gc.callbacks.remove(callback)
                lags.sort()
                out = {"seconds": round(loop.time() - start, 2), "samples": len(lags),
                       "max_s": lags[-1] if lags else 0.0, "p99_s": lags[int(0.99 * (len(lags) - 1))] if lags else 0.0,
                       "stalls_over_100ms": stalls, "gen2_collections": collections}
                folder = os.environ["CUPID_BENCH_LOOP_LAG"]
                with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
                    json.dump(out, f)

        return _run(sampled(), **kwargs)

    asyncio.run = run
