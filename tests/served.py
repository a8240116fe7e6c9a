"""The two OpenAI-compatible servers on loopback, for tests that drive both the same way:
llama-server and ``python -m llama_sparq.server`` (bench/serverlib.py's ``Server`` and ``PyServer``). Each is
started on a free 127.0.0.1 port, used as a context manager, and killed on exit."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import Server  # noqa: E402
from serverlib import PyServer  # noqa: E402

LLAMA, PYTHON = "llama-server", "python"
KINDS = (LLAMA, PYTHON)
HOST = "127.0.0.1"


class Served:
    """One running server of either kind, with what the tests ask of both."""

    def __init__(self, kind, srv):
        self.kind, self.srv = kind, srv
        self.port, self.base, self.proc = srv.port, srv.base, srv.proc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.srv.log()

    def get_json(self, path, timeout=30):
        with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
            return json.loads(r.read())

    def sparq_calls(self) -> int:
        """SparQ attention calls so far: llama-server's /metrics, the Python server's /sparq/stats."""
        if self.kind == LLAMA:
            return int(self.srv.metrics()["sparq_calls_total"])
        (entry,) = self.get_json("/sparq/stats")["data"]
        return int(entry["stats"]["n_sparq"])

    def openai(self, timeout=60):
        """The official client on this server: no retries (a failure shows at once), no proxy
        from the environment (loopback only)."""
        import openai

        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=timeout,
                             http_client=openai.DefaultHttpxClient(trust_env=False))


def start(kind, model, log_dir, *, n_ctx, llama_args=(), py_args=(), start_timeout=180, threads=2):
    """A started server of this kind (the caller exits it): one slot for llama-server (so
    n_ctx is the request's context, as in the Python server), 2 threads unless told."""
    log_path = Path(log_dir) / f"{kind}.log"
    if kind == LLAMA:
        srv = Server(model, ["-c", n_ctx, "-np", 1, *llama_args], threads=threads, log_path=log_path,
                     start_timeout=start_timeout)
        # OpenMP's threads sleep when idle, as the Python server's: spinning, they take the
        # cores that the test's other processes need (Server passes this environment on)
        old = os.environ.get("OMP_WAIT_POLICY")
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        try:
            srv.__enter__()
        finally:
            if old is None:
                del os.environ["OMP_WAIT_POLICY"]
            else:
                os.environ["OMP_WAIT_POLICY"] = old
    else:
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        env.pop("CONFIG_FILE", None)  # a config file in the environment would replace the model
        srv = PyServer(model, ["--n_ctx", n_ctx, *py_args], threads=threads, start_timeout=start_timeout,
                       log_path=log_path, env=env, alias="m")
        srv.__enter__()
    return Served(kind, srv)
