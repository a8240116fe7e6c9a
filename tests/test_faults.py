"""Faults: a server killed in the middle of a generation and started again, slot save and
restore, state files written under other SparQ settings (or with SparQ off), and a full disk
(a file-size limit) while a state or a slot is saved; ggml's graph allocator given a graph whose
leafs differ from the last one's.

What each test checks is in its docstring; the server helpers are bench/server_load.py's."""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sparq_ctx import Ctx, Model, llama_cpp, prefill, rand_tokens, step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import Server, ServerError, build_prompts  # noqa: E402

TOL = 1e-3
SPARSE = dict(enabled=True, r=4, k=16, l=4, min_kv=0)
SERVER_SPARQ = ["--sparq", "--sparq-k", 16, "--sparq-r", 4, "--sparq-min-kv", 0]


# -- state files ---------------------------------------------------------------------------

def _save(c: Ctx, path: Path, toks, seq=None) -> int:
    lc = llama_cpp()
    arr = (ctypes.c_int32 * len(toks))(*toks)
    if seq is None:
        return int(lc.llama_state_save_file(c.ctx, str(path).encode(), arr, len(toks)))
    return int(lc.llama_state_seq_save_file(c.ctx, str(path).encode(), seq, arr, len(toks)))


def _load(c: Ctx, path: Path, seq=None, cap=4096):
    lc = llama_cpp()
    out, n = (ctypes.c_int32 * cap)(), ctypes.c_size_t(0)
    if seq is None:
        ok = int(lc.llama_state_load_file(c.ctx, str(path).encode(), out, cap, ctypes.byref(n)))
    else:
        ok = int(lc.llama_state_seq_load_file(c.ctx, str(path).encode(), seq, out, cap, ctypes.byref(n)))
    return ok, list(out[:n.value])


@pytest.fixture(scope="module")
def model(tiny_gqa_model):
    return Model(tiny_gqa_model)


@pytest.mark.parametrize("saved_with", ["sparq_off", "other_settings"])
@pytest.mark.parametrize("kind", ["whole", "seq"])
def test_state_file_from_other_settings_loads_and_rebuilds(model, tmp_path, saved_with, kind):
    """A state file written by a context with SparQ off, or with other SparQ settings (another
    r, k and the PCA basis, whose rotation is derived data too), loaded into a context running
    SparQ: the derived data (K^T, the V sums, the basis) is rebuilt from the loaded cache
    (llama_sparq_debug_check against a recomputation) and the decode steps' logits equal those
    of a context that prefilled the same prompt itself."""
    rng = np.random.default_rng(5)
    prompt, toks = rand_tokens(rng, 300, model.n_vocab), rand_tokens(rng, 4, model.n_vocab)
    seq = None if kind == "whole" else 0
    src = Ctx(model)
    if saved_with == "other_settings":
        src.sparq(enabled=True, r=8, k=64, l=8, min_kv=0, basis=2)  # pca
    prefill(src, 0, prompt)
    step(src, 0, toks[0])  # a decode step in the saving context (SparQ's upkeep ran there)
    path = tmp_path / "state.bin"
    assert _save(src, path, prompt + toks[:1], seq) > 0
    src.free()

    ref = Ctx(model)
    ref.sparq(**SPARSE)
    prefill(ref, 0, prompt)
    want = [step(ref, 0, t) for t in toks]
    ref.free()

    dst = Ctx(model)
    dst.sparq(**SPARSE)
    prefill(dst, 0, rand_tokens(rng, 310, model.n_vocab))  # other content at the same cells first
    if seq is not None:
        dst.seq_rm(0, -1, -1)
    ok, got_toks = _load(dst, path, seq)
    assert ok and got_toks == prompt + toks[:1]
    got = [want[0]] + [step(dst, 0, t) for t in toks[1:]]
    assert 0.0 <= dst.check() <= TOL
    for a, b in zip(got, want):
        assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()
    st = dst.stats()
    assert st["n_sparq"] > 0 and st["n_rebuilds"] > 0, st
    dst.free()


_FSIZE_SCRIPT = textwrap.dedent("""
    import ctypes, json, os, resource, signal, sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np
    from sparq_ctx import Ctx, Model, llama_cpp, prefill, rand_tokens
    from test_faults import _save, _load
    out = {}
    m = Model(sys.argv[1])
    c = Ctx(m)
    c.sparq(enabled=True, r=4, k=16, l=4, min_kv=0)
    toks = rand_tokens(np.random.default_rng(0), 300, m.n_vocab)
    prefill(c, 0, toks)
    d = sys.argv[3]
    good = os.path.join(d, "good.bin")
    out["good_saved"] = _save(c, good, toks)
    size = os.path.getsize(good)
    before = open(good, "rb").read()
    seq_size = _save(c, os.path.join(d, "good-seq.bin"), toks, seq=0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    out["limits"] = []
    # mid-file, and inside the writer's last buffered block (its final flush is the one
    # upstream's writer never checked)
    for lim in (size // 2, size - 10, seq_size - 10):
        new, over, seq = (os.path.join(d, f"{n}-{lim}.bin") for n in ("new", "over", "seq"))
        open(over, "wb").write(before)  # a good file, then a save over it under the limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim, resource.RLIM_INFINITY))
        r = {"limit": lim, "new": _save(c, new, toks), "over": _save(c, over, toks),
             "seq": _save(c, seq, toks, seq=0)}
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        r["new_exists"], r["seq_exists"] = os.path.exists(new), os.path.exists(seq)
        r["over_intact"] = open(over, "rb").read() == before
        c2 = Ctx(m)
        r["over_loads"] = _load(c2, over)[0]
        c2.free()
        r["left"] = sorted(f for f in os.listdir(d) if "partial" in f)
        out["limits"].append(r)
    print("RESULT " + json.dumps(out))
""")


def test_state_save_under_a_file_size_limit_fails_whole(tiny_gqa_model, tmp_path):
    """A full disk while saving (RLIMIT_FSIZE: writes past it fail): llama_state_save_file and
    llama_state_seq_save_file report the failure, leave no file (nor a temporary) behind, and a
    good file at the same path stays as it was and loads. Before: the savers wrote in place, and
    a limit inside the last buffered block gave a truncated file reported as saved."""
    script = tmp_path / "fsize.py"
    script.write_text(_FSIZE_SCRIPT)
    work = tmp_path / "files"
    work.mkdir()
    res = subprocess.run([sys.executable, str(script), str(tiny_gqa_model), str(Path(__file__).parent), str(work)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["good_saved"] == 1
    for r in out["limits"]:
        assert (r["new"], r["over"], r["seq"]) == (0, 0, 0), r
        assert not r["new_exists"] and not r["seq_exists"] and r["over_intact"] and r["over_loads"] == 1, r
        assert r["left"] == [], r


# -- the server ----------------------------------------------------------------------------

def _post(srv, path, body, timeout=120):
    return srv.post(path, body, timeout=timeout)


def _complete(srv, prompt, n_predict, cache_prompt=False):
    return _post(srv, "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                                      "seed": 0, "cache_prompt": cache_prompt, "return_tokens": True})


def _kill_during_stream(srv, prompt, n_events=5):
    """Starts a long streamed generation, reads n_events tokens, SIGKILLs the server."""
    body = json.dumps({"prompt": prompt, "n_predict": 3000, "temperature": 0.0, "top_k": 1, "stream": True,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(srv.base + "/completion", data=body, headers={"Content-Type": "application/json"})
    seen = 0
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: "):
                seen += 1
                if seen >= n_events:
                    srv.proc.send_signal(signal.SIGKILL)
                    break
    srv.proc.wait(timeout=30)
    return srv.proc.returncode


def test_server_killed_during_generation_serves_after_restart(tiny_model, tmp_path):
    """llama-server with SparQ killed (SIGKILL) while it streams a long generation, then started
    again with the same arguments: the next request is served with SparQ, its greedy tokens
    equal to the same request's before the kill, and the new server logs no error."""
    args = ["-c", 4096, "-np", 1, *SERVER_SPARQ]
    with Server(tiny_model, args, log_path=tmp_path / "s1.log", start_timeout=120) as srv:
        q, p = build_prompts(srv, 2, 300, 400, seed=7)
        want = _complete(srv, q, 16)
        assert _kill_during_stream(srv, p) == -signal.SIGKILL
    with Server(tiny_model, args, log_path=tmp_path / "s2.log", start_timeout=120) as srv:
        got = _complete(srv, q, 16)
        assert got["tokens"] == want["tokens"] and len(got["tokens"]) == 16
        assert srv.metrics()["sparq_calls_total"] > 0
        assert srv.error_lines() == []


def test_server_that_dies_during_a_request_is_reported_so(tiny_model, tmp_path):
    """A request whose server dies under it (SIGSEGV, as a crash) fails with the signal and the
    end of the server's log, not a bare "Remote end closed connection" (the load tests' report)."""
    with Server(tiny_model, ["-c", 4096, "-np", 1, *SERVER_SPARQ], log_path=tmp_path / "s.log", start_timeout=120) as srv:
        (prompt,) = build_prompts(srv, 1, 300, 300, seed=3)
        body = {"prompt": prompt, "n_predict": 100000, "temperature": 0.0, "top_k": 1, "ignore_eos": True}
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(srv.post, "/completion", body, 300)
            deadline = time.monotonic() + 60
            while srv.metrics()["requests_processing"] < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            srv.proc.send_signal(signal.SIGSEGV)
            with pytest.raises(ServerError, match=r"(?s)/completion: llama-server died \(signal SIGSEGV\):.*slot"):
                fut.result(timeout=60)


def _slot(srv, action, filename, timeout=120):
    return _post(srv, f"/slots/0?action={action}", {"filename": filename}, timeout=timeout)


def test_slot_save_restore_equals_the_uninterrupted_run(tiny_model, tmp_path):
    """--slot-save-path with SparQ: a slot saved after its prompt, the server killed and started
    again, the slot restored: the continuation's greedy tokens equal those of the server that
    was never interrupted (both reuse the cached prompt; the restored one rebuilds SparQ's data
    from the loaded cache), with SparQ calls on the restored cache."""
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ["-c", 4096, "-np", 1, "--slot-save-path", slots, *SERVER_SPARQ]
    with Server(tiny_model, args, log_path=tmp_path / "s1.log", start_timeout=120) as srv:
        (p,) = build_prompts(srv, 1, 500, 600, seed=11)
        _complete(srv, p, 1, cache_prompt=True)
        saved = _slot(srv, "save", "a.bin")
        assert saved["n_saved"] > len(p) - 1, saved
        want = _complete(srv, p, 24, cache_prompt=True)
        assert want["timings"]["prompt_n"] <= 2, want["timings"]  # the cached prompt was reused
        srv.proc.send_signal(signal.SIGKILL)
    with Server(tiny_model, args, log_path=tmp_path / "s2.log", start_timeout=120) as srv:
        m0 = srv.metrics()["sparq_calls_total"]
        restored = _slot(srv, "restore", "a.bin")
        assert restored["n_restored"] == saved["n_saved"], restored
        got = _complete(srv, p, 24, cache_prompt=True)
        assert got["timings"]["prompt_n"] == want["timings"]["prompt_n"], got["timings"]
        assert got["tokens"] == want["tokens"]
        assert srv.metrics()["sparq_calls_total"] - m0 >= 23 * 2  # 2 layers, every decode step
        assert srv.error_lines() == []


def _limit_file_size(n):
    def f():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited across exec: writes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    return f


def test_slot_save_on_a_full_disk_is_an_error(tiny_model, tmp_path):
    """A slot save that cannot be written whole (a file-size limit below the slot's size) answers
    an error, leaves no file, and restoring that name is an error too; the server goes on
    serving with SparQ."""
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ["-c", 4096, "-np", 1, "--slot-save-path", slots, *SERVER_SPARQ]
    # the slot (2 layers x 600 cells x 64 x 2 x f16 = 300 KB) is over the limit, the log is not
    with Server(tiny_model, args, log_path=tmp_path / "s.log", start_timeout=120,
                preexec_fn=_limit_file_size(120_000)) as srv:
        (p,) = build_prompts(srv, 1, 500, 600, seed=12)
        _complete(srv, p, 1, cache_prompt=True)
        with pytest.raises(ServerError, match="HTTP 500.*Unable to save slot"):
            _slot(srv, "save", "full.bin")
        assert os.listdir(slots) == []
        with pytest.raises(ServerError, match="HTTP 400.*Unable to restore slot"):
            _slot(srv, "restore", "full.bin")
        assert len(_complete(srv, p, 8)["tokens"]) == 8
        assert srv.metrics()["sparq_calls_total"] > 0


# -- the graph allocator -------------------------------------------------------------------

def test_graph_allocator_allocates_a_graph_with_other_leafs_anew():
    """A graph whose nodes match the last allocated graph's but whose leafs do not (an input where
    the last had a weight) is allocated anew and computes right (tests/ggml_gallocr_leafs.py).
    Before the series' fix: a segfault; llama-server died of it under load."""
    from llama_sparq import lib_dir

    script = Path(__file__).resolve().parent / "ggml_gallocr_leafs.py"
    res = subprocess.run([sys.executable, str(script), str(lib_dir())], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.returncode, res.stdout[-500:], res.stderr[-2000:])
