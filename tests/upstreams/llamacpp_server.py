"""Runs llama.cpp's own OpenAI-compatible HTTP server (via xllamacpp) as a real upstream.

``python -m tests.upstreams.llamacpp_server MODEL_PATH PORT`` serves until killed.
"""

from __future__ import annotations

import signal
import sys
import threading


def main(model_path: str, port: int) -> None:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.n_ctx = 4096
    params.n_parallel = 2
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.use_jinja = True
    params.warmup = False
    params.port = port
    params.hostnames = ["127.0.0.1"]
    params.verbosity = -1
    server = xllamacpp.Server(params)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"listening {server.listening_address}", flush=True)
    stop.wait()
    del server


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
