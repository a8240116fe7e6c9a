"""The servers the load driver and the tests run: llama-server (`Server`) and the Python server
(`PyServer`) on 127.0.0.1 with a free port, their logs, how they died, their requests, and a
process's resident memory. bench/server_load.py's subcommands and tests/ use them."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Terminate a server process (kill it when it does not exit within timeout s) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


class Server:
    """llama-server on 127.0.0.1 with a free port; the log goes to a file. Use as a context
    manager: the process is killed on exit, whatever happened."""

    name = "llama-server"

    def __init__(self, model, args=(), threads=2, start_timeout=300, log_path=None, preexec_fn=None):
        from llama_sparq import tool_path

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.cmd = [str(tool_path("llama-server")), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                    "-t", str(threads), "--metrics", "--log-prefix", "--log-colors", "off", "--no-webui",
                    *map(str, args)]
        self.start_timeout = start_timeout
        self.preexec_fn = preexec_fn  # run in the child before exec (a resource limit, say)
        self.proc = None

    def __enter__(self):
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=self.preexec_fn)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)
        if not self._log.closed:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def death(self) -> str:
        """How the exited server ended (its exit code, or the signal that killed it) and its log's end."""
        rc = self.proc.returncode
        sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else -rc
        how = f"exit code {rc}" if rc >= 0 else f"signal {sig}"
        return f"{self.name} died ({how}):\n{self.log()[-3000:]}"

    def _wait_ready(self):
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(self.death())
            try:
                if self.get("/health", timeout=5).get("status") == "ok":
                    return
            except (OSError, ServerError, ValueError):
                pass
            time.sleep(0.5)
        raise ServerError(f"llama-server not ready after {self.start_timeout} s:\n{self.log()[-3000:]}")

    def request(self, path, body=None, timeout=60) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            raise ServerError(f"{path}: HTTP {e.code}: {e.read()[:500]!r}") from e
        except (ConnectionError, http.client.HTTPException, urllib.error.URLError) as e:
            # a server that died says how (a signal) and what it logged last
            if self.proc is not None:
                rc = self.proc.poll()
                if rc is None and isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError)):
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        rc = self.proc.wait(timeout=2)  # closed mid-request: dying, or a reply cut off
                if rc is not None:
                    raise ServerError(f"{path}: {self.death()}") from e
            raise

    def get(self, path, timeout=60):
        return json.loads(self.request(path, timeout=timeout))

    def post(self, path, body, timeout=60):
        return json.loads(self.request(path, body, timeout=timeout))

    def metrics(self) -> dict:
        """/metrics as {name (labels included, prefix dropped): value}."""
        out = {}
        for line in self.request("/metrics", timeout=60).decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name.removeprefix("llamacpp:")] = float(value)
        return out

    def error_lines(self) -> list[str]:
        """Log lines at error level (--log-prefix writes "E " before them)."""
        return [ln for ln in self.log().splitlines() if ln.startswith("E ") or re.search(r"\b(abort|segfault)", ln, re.I)]


def read_rss(pid: int) -> int | None:
    """A process's resident memory in bytes (VmRSS of /proc/PID/status), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PyServer(Server):
    """python -m llama_sparq.server on 127.0.0.1 with a free port (Server's helpers: log, death,
    request); ready when /v1/models answers."""

    name = "llama_sparq.server"

    def __init__(self, model, args=(), threads=2, start_timeout=300, log_path=None, env=None, alias="soak"):
        super().__init__(model, (), threads, start_timeout, log_path)
        self.cmd = [sys.executable, "-m", "llama_sparq.server", "--model", str(model), "--model_alias", alias,
                    "--host", "127.0.0.1", "--port", str(self.port), "--n_threads", str(threads),
                    "--n_threads_batch", str(threads), *map(str, args)]
        self.env = env

    def __enter__(self):
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env)
        try:
            deadline = time.monotonic() + self.start_timeout
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(self.death())
                try:
                    self.get("/v1/models", timeout=5)
                    return self
                except (OSError, ServerError, ValueError):
                    if time.monotonic() > deadline:
                        raise ServerError(f"{self.name} not ready after {self.start_timeout} s:\n{self.log()[-3000:]}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def error_lines(self) -> list[str]:
        # uvicorn logs a request that raised as a traceback; a client that went away prints "disconnected"
        return [ln for ln in self.log().splitlines() if re.match(r"(Traceback|ERROR:|Exception)", ln)]
