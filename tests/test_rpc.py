"""SparQ across machines on llama.cpp's RPC backend: two ``ggml-rpc-server`` processes on
loopback hold the model's layers, their KV cache and SparQ's data (K^T, the V sums); the op,
the appends and the rebuilds run there. The client's greedy tokens equal the single-process
run's, and the counters show every SparQ call ran on an RPC host."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from llama_sparq import tool_path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import free_port, stop_process  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
COUNTERS = re.compile(r"llama_sparq: counters: SparQ calls = (\d+), dense calls = (\d+).*"
                      r"SparQ calls on a device \(GPU, RPC host\) = (\d+)")


class RpcServers:
    """n ggml-rpc-server processes on 127.0.0.1, one thread each."""

    def __init__(self, n, log_dir: Path):
        self.ports = [free_port() for _ in range(n)]
        self.logs = [log_dir / f"rpc-{p}.log" for p in self.ports]
        self.procs = []

    def __enter__(self):
        for port, log in zip(self.ports, self.logs):
            f = open(log, "w")
            self.procs.append(subprocess.Popen([str(tool_path("ggml-rpc-server")), "-H", "127.0.0.1", "-p", str(port),
                                                "-t", "1"], stdout=f, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=ENV))
        deadline = time.monotonic() + 30
        for port, log, proc in zip(self.ports, self.logs, self.procs):
            while True:  # listening (its log is block-buffered)
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"ggml-rpc-server on port {port} not listening after 30 s"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            stop_process(p)

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)


@pytest.fixture(scope="module")
def model4(tmp_path_factory):
    from sparq_lab.models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("rpc") / "tiny-4l.gguf", n_layer=4, n_embd=64, n_head=4,
                           n_head_kv=2, seed=4)


SPARQ = ["--sparq", "--sparq-k", "16", "--sparq-r", "4", "--sparq-min-kv", "0"]
PROMPT = " ".join(f"{w} {i % 10}" for i, w in enumerate(["river", "copper", "lantern", "meadow"] * 50))


def _completion(model, extra, sched_debug=False):
    """sched_debug: the scheduler's splits in the log (GGML_SCHED_DEBUG=2 and -v), for _op_backends."""
    env = dict(ENV)
    if sched_debug:
        env["GGML_SCHED_DEBUG"] = "2"
    res = subprocess.run([str(tool_path("llama-completion")), "-m", str(model), "-p", PROMPT, "-n", "24", "-no-cnv",
                          "--temp", "0", "-t", "1", "-c", "2048", "-v" if sched_debug else "-lv", *([] if sched_debug else ["4"]),
                          *SPARQ, *extra],
                         capture_output=True, text=True, errors="replace", timeout=300, stdin=subprocess.DEVNULL,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    m = COUNTERS.search(res.stderr)
    assert m, res.stderr[-3000:]
    return res.stdout, [int(x) for x in m.groups()], res.stderr


def _op_backends(log):
    """The backends the scheduler gave the SparQ op's nodes (GGML_SCHED_DEBUG=2: each split's
    backend, then its nodes)."""
    cur, out = None, []
    for m in re.finditer(r"## SPLIT #\d+: (\S+)|node #\s*\d+ \((SPARQ_ATTN)\)", log):
        if m.group(1):
            cur = m.group(1)
        else:
            out.append(cur)
    return out


def test_sparq_on_two_rpc_servers_equals_one_process(model4, tmp_path):
    want, (n_sparq, _, n_dev), _ = _completion(model4, [])
    assert n_sparq == 4 * 23 and n_dev == 0  # 4 layers x 23 decode steps, all in this process
    with RpcServers(2, tmp_path) as rpc:
        got, (n_sparq_r, n_dense_r, n_dev_r), log = _completion(model4, ["--rpc", rpc.endpoints, "-ngl", "99",
                                                                         "-ts", "1,1"], sched_debug=True)
    assert got == want
    # the scheduler ran every SparQ node on an RPC host (the op is pinned where its K^T is)
    where = _op_backends(log)
    assert where and all(w.startswith("RPC") for w in where), sorted(set(where))
    # every layer's cache and SparQ data on an RPC host, both hosts holding some
    for port in rpc.ports:
        assert re.search(rf"RPC\d\[127\.0\.0\.1:{port}\] KV buffer size", log), log[-3000:]
    assert "SparQ data for 4 of 4 KV-cache layers" in log
    # the same SparQ calls, every one run by an RPC host's op (none copied back to this process)
    assert (n_sparq_r, n_dev_r) == (n_sparq, n_sparq), (n_sparq_r, n_dev_r, n_dense_r)


def test_calibrated_k_on_rpc_equals_one_process(model4, tmp_path):
    """The calibrated k (k = 0) with the layers on RPC hosts: each host's op cuts its selections at
    the coverage target itself, as this process's op does (it cannot report its cells back: the
    counters count the cap there): the same greedy tokens as one process, every SparQ call on a host."""
    calibrated = ["--sparq-k", "0"]
    want, (n_sparq, _, n_dev), _ = _completion(model4, calibrated)
    assert n_sparq == 4 * 23 and n_dev == 0
    with RpcServers(2, tmp_path) as rpc:
        got, (n_sparq_r, n_dense_r, n_dev_r), log = _completion(model4, [*calibrated, "--rpc", rpc.endpoints, "-ngl",
                                                                         "99", "-ts", "1,1"])
    assert got == want
    assert (n_sparq_r, n_dev_r) == (n_sparq, n_sparq), (n_sparq_r, n_dev_r, n_dense_r)


def test_kt8_on_rpc_equals_one_process(model4, tmp_path):
    """An 8-bit K^T (e5m2) on RPC hosts: its writes (the op's append mode, in the decode graph and in
    the hosts' graph rebuild) and its reads run there with the op's parameters as they are, and give
    one process's greedy tokens, every SparQ call on a host."""
    kt8 = ["--sparq-kt-bits", "8"]
    want, (n_sparq, _, n_dev), _ = _completion(model4, kt8)
    assert n_sparq == 4 * 23 and n_dev == 0
    with RpcServers(2, tmp_path) as rpc:
        got, (n_sparq_r, n_dense_r, n_dev_r), _ = _completion(model4, [*kt8, "--rpc", rpc.endpoints, "-ngl", "99",
                                                                       "-ts", "1,1"])
    assert got == want
    assert (n_sparq_r, n_dev_r) == (n_sparq, n_sparq), (n_sparq_r, n_dev_r, n_dense_r)


def test_default_dense_threshold_on_rpc_is_the_hosts(model4, tmp_path):
    """min_kv = -1 (the default) resolves by where the cache is: an RPC host runs the CPU op, so its
    threshold is the host's 1024 cells (a GPU's is LLAMA_SPARQ_MIN_KV_DEVICE, tests/test_cuda.py)."""
    with RpcServers(1, tmp_path) as rpc:
        res = subprocess.run([str(tool_path("llama-completion")), "-m", str(model4), "-p", "hello", "-n", "2", "-no-cnv",
                              "--temp", "0", "-t", "1", "-c", "512", "--sparq", "--sparq-k", "16", "--rpc", rpc.endpoints,
                              "-ngl", "99"], capture_output=True, text=True, errors="replace", timeout=300,
                             stdin=subprocess.DEVNULL, env=ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "dense below 1024 KV cells" in res.stderr, res.stderr[-3000:]


def test_nkvo_beside_an_rpc_host_runs_sparq_here(model4, tmp_path):
    """--no-kv-offload with the layers on an RPC host: the cache and SparQ's data stay in this
    process, so the op must run here too (its inputs there would be copied over the network at
    every step, and the report it writes is this process's memory: an RPC host running it
    would write to an address of another process). Same tokens as one process, every SparQ call counted here, the host still alive."""
    want, (n_sparq, _, _), _ = _completion(model4, [])
    with RpcServers(1, tmp_path) as rpc:
        got, (n_sparq_r, n_dense_r, n_dev_r), log = _completion(model4, ["--rpc", rpc.endpoints, "-ngl", "99", "-nkvo"],
                                                                sched_debug=True)
        assert all(p.poll() is None for p in rpc.procs), rpc.logs[0].read_text()[-2000:]
    assert "CPU KV buffer size" in log, log[-3000:]
    assert got == want
    where = _op_backends(log)
    assert where and set(where) == {"CPU"}, sorted(set(where))
    assert (n_sparq_r, n_dev_r) == (n_sparq, 0), (n_sparq_r, n_dev_r, n_dense_r)


def test_python_llama_with_rpc_servers_equals_one_process(model4, tmp_path):
    """Llama(..., rpc_servers=...) puts the hosts' devices in the model's device list (the tools'
    --rpc) before it loads: its layers, cache and SparQ's data go there, every SparQ call runs on
    a host, and the logits of the same decode steps equal one process's (to float rounding: the
    tiny random model's near ties make greedy tokens a poor check); a later model without
    rpc_servers does not use the hosts."""
    from llama_sparq import Llama

    kw = dict(n_ctx=1024, n_threads=1, verbose=False, seed=0, logits_all=True, sparq_k=16, sparq_r=4,
              sparq_min_kv=0)

    def steps(llm):
        rng = np.random.default_rng(3)
        llm.eval([1] + rng.integers(3, llm.n_vocab(), size=299).tolist())
        out = [np.array(llm.scores[llm.n_tokens - 1])]
        for t in rng.integers(3, llm.n_vocab(), size=12).tolist():
            llm.eval([t])
            out.append(np.array(llm.scores[llm.n_tokens - 1]))
        return np.stack(out), llm.sparq_stats()

    want, st = steps(Llama(str(model4), **kw))
    assert st["n_sparq"] > 0 and st["n_sparq_device"] == 0
    with RpcServers(2, tmp_path) as rpc:
        llm = Llama(str(model4), rpc_servers=rpc.endpoints, n_gpu_layers=99, **kw)
        got, st_r = steps(llm)
        llm.close()
    assert st_r["n_sparq"] == st["n_sparq"] and st_r["n_sparq_device"] == st_r["n_sparq"], st_r
    assert np.abs(want).max() > 0
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), np.abs(got - want).max()
    # the hosts are gone: a model without rpc_servers loads and decodes here
    again, st_a = steps(Llama(str(model4), **kw))
    assert st_a["n_sparq_device"] == 0 and np.array_equal(again, want)


def test_python_rpc_servers_bad_input(model4):
    from llama_sparq import Llama

    with pytest.raises(ValueError, match=r"rpc_servers: 'nohost' is not host:port"):
        Llama(str(model4), rpc_servers="nohost", verbose=False)
    with pytest.raises(ValueError, match=r"rpc_servers: an empty endpoint"):
        Llama(str(model4), rpc_servers="127.0.0.1:5,", verbose=False)
    with pytest.raises(ValueError, match=r"rpc_servers: expected"):
        Llama(str(model4), rpc_servers=5, verbose=False)
    port = free_port()
    with pytest.raises(ValueError, match=rf"rpc_servers: cannot connect to 127\.0\.0\.1:{port}: .*ggml-rpc-server"):
        Llama(str(model4), rpc_servers=f"127.0.0.1:{port}", verbose=False)
