"""An OpenAI-compatible HTTP server for tests: llama.cpp's own server through xllamacpp.

It stands in for ``python -m llama_cpp.server`` (llama-cpp-python, which needs a source build, is no
longer installed) with the same flags, and serves until SIGTERM or SIGINT:

    python tests/llm/xllamacpp_server.py --model PATH --model_alias NAME --host 127.0.0.1 --port 8000 \\
        --n_ctx 2048 --n_threads 2
"""

from __future__ import annotations

import argparse
import signal
import threading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model_alias")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n_ctx", type=int, default=2048)
    parser.add_argument("--n_threads", type=int, default=2)
    args = parser.parse_args()

    from cupid_exp.llm.local import import_xllamacpp

    xllamacpp = import_xllamacpp()  # sleeping, not spinning, threads: the suite's processes share the cores
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = args.n_ctx
    params.cpuparams.n_threads = args.n_threads
    params.cpuparams_batch.n_threads = args.n_threads
    params.hostnames = [args.host]
    params.port = args.port
    params.verbosity = -1
    if args.model_alias:
        params.model_alias = {args.model_alias}
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)  # listens from here on; the HTTP threads are the server's own
    print(f"serving {args.model} as {args.model_alias or 'default'} at {server.listening_address}", flush=True)
    stop.wait()
    del server


if __name__ == "__main__":
    main()
