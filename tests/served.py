"""The two OpenAI-compatible servers on loopback, for tests that drive both the same way:
llama-server (bench/server_load.py's ``Server``) and ``python -m llama_sparq.server``. Each is
started on a free 127.0.0.1 port, used as a context manager, and killed on exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import Server, ServerError, free_port, stop_process  # noqa: E402

LLAMA, PYTHON = "llama-server", "python"
KINDS = (LLAMA, PYTHON)
HOST = "127.0.0.1"


class PyServer:
    """``python -m llama_sparq.server`` on 127.0.0.1 with a free port; the log goes to a file."""

    def __init__(self, args, log_path, start_timeout=120):
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.args = [str(a) for a in args]
        self.log_path = Path(log_path)
        self.start_timeout = start_timeout
        self.proc = None

    def __enter__(self):
        self._log = open(self.log_path, "w")
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        env.pop("CONFIG_FILE", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "llama_sparq.server", "--host", HOST,
                                      "--port", str(self.port), *self.args],
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(f"python server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
                try:
                    urllib.request.urlopen(self.base + "/v1/models", timeout=5).read()
                    return self
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    if time.monotonic() > deadline:
                        raise ServerError(f"python server not up after {self.start_timeout} s:\n{self.log()[-3000:]}")
                    time.sleep(0.3)
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)
        if not self._log.closed:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


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
        srv = PyServer(["--model", model, "--model_alias", "m", "--n_ctx", n_ctx, "--n_threads", threads,
                        "--n_threads_batch", threads, *py_args], log_path, start_timeout=start_timeout)
        srv.__enter__()
    return Served(kind, srv)
