"""The tools: --sparq flags in llama-cli / llama-completion (common arguments), and
llama-bench sweeping the SparQ parameters in every output format."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess

import pytest

from llama_sparq import tool_path


def run(args, timeout=600):
    return subprocess.run([str(a) for a in args], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)


def sparq_counters(log: str) -> dict:
    """The counters libllama logs when a context with SparQ goes (shown with -v)."""
    m = re.search(r"llama_sparq: counters: SparQ calls = (\d+), dense calls = (\d+)", log)
    assert m, "no SparQ counters in the log:\n" + log[-2000:]
    return {"n_sparq": int(m.group(1)), "n_dense": int(m.group(2))}


@pytest.mark.parametrize("tool", ["llama-cli", "llama-completion", "llama-server", "llama-perplexity"])
def test_help_documents_the_flags(tool):
    res = run([tool_path(tool), "--help"], timeout=60)
    text = res.stdout + res.stderr
    for flag in ("--sparq", "--no-sparq", "--sparq-r", "--sparq-k", "--sparq-l", "--sparq-min-kv", "--sparq-all-rows"):
        assert flag in text, (tool, flag)


def test_completion_sparq_tiny(tiny_model):
    res = run([tool_path("llama-completion"), "-m", tiny_model, "-p", "hello world", "-n", "16", "--temp", "0",
               "--ignore-eos", "-no-cnv", "-t", "2", "--sparq", "--sparq-r", "8", "--sparq-k", "4",
               "--sparq-min-kv", "0", "-v"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(res.stdout) > len(" hello world")
    # 2 layers x 15 decode steps ran SparQ (the 16th token needs no step)
    assert sparq_counters(res.stderr)["n_sparq"] >= 2 * 15


@pytest.mark.real_model
def test_cli_sparq_gemma(gemma_model):
    res = run([tool_path("llama-cli"), "-m", gemma_model, "-p", "Name three primary colours.", "-n", "24",
               "--temp", "0", "--single-turn", "--simple-io", "-t", "2", "--chat-template", "gemma",
               "--sparq", "--sparq-min-kv", "0", "-v"])
    assert res.returncode == 0, res.stderr[-2000:]
    reply = res.stdout.split("> Name three primary colours.", 1)[1].split("[ Prompt:", 1)[0]
    assert reply.strip(), res.stdout
    assert sparq_counters(res.stdout + res.stderr)["n_sparq"] > 0


@pytest.mark.parametrize("flags,needle", [
    # ranges: llama_sparq_set_params's message (the flags only parse)
    (["--sparq-k", "-1"], "SparQ: k = -1 is out of range: allowed 1..1048576, or 0 for the calibrated k"),
    (["--sparq-coverage", "0"], "SparQ: coverage = 0 is out of range: allowed (0, 1]"),
    (["--sparq-k-min", "-1"], "SparQ: k_min = -1 is out of range: allowed 1..1048576, or 0 for 128 on an f16 or "
                              "f32 cache, 256 on a quantized cache"),
    (["--sparq-k-frac", "1.5"], "SparQ: k_frac = 1.5 is out of range: allowed (0, 1]"),
    (["--sparq-r", "-3"], "SparQ: r = -3 is out of range: allowed 1..head size (head size = 16), or 0 for 3/8 of the head size (rounded)"),
    (["--sparq-l", "-7"], "SparQ: l = -7 is out of range: allowed 0..k_min (k_min = 128), or -1 for k_min / 4"),
    (["--sparq-min-kv", "-2"], "SparQ: min_kv = -2 is out of range: allowed min_kv >= 0, or -1 for the default of "
                               "where the cache is (1024 cells in host memory, 65536 on a GPU, 1048576 there with the "
                               "calibrated k)"),
    # names: the C API's list
    (["--sparq-basis", "svd"], "--sparq-basis: unknown value 'svd'; allowed: model, scaled, pca"),
    (["--sparq-r", "99"], "r = 99 is out of range: allowed 1..head size (head size = 16)"),
    (["--sparq-l", "50", "--sparq-k", "10"], "l = 50 is out of range"),
    (["--sparq", "-fa", "off"], "needs the flash-attention KV layout"),
])
def test_invalid_flags_are_refused(tiny_model, flags, needle):
    res = run([tool_path("llama-completion"), "-m", tiny_model, "-p", "hi", "-n", "2", "-no-cnv", "-t", "1", *flags],
              timeout=120)
    assert res.returncode != 0
    assert needle in res.stderr + res.stdout, res.stderr[-1500:]


def bench(model, *extra, fmt="json"):
    res = run([tool_path("llama-bench"), "-m", model, "-p", "0", "-n", "4", "-r", "1", "-t", "2", "-o", fmt, *extra])
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_bench_sweeps_sparq_json(tiny_model):
    rows = json.loads(bench(tiny_model, "--sparq", "0,1", "--sparq-k", "8,16", "--sparq-min-kv", "0", "-d", "0,256"))
    # per depth: one dense row and one row per k
    assert len(rows) == 2 * 3
    for r in rows:
        assert {"sparq", "sparq_r", "sparq_k", "sparq_l", "sparq_min_kv", "sparq_calls", "sparq_dense",
                "sparq_compr"} <= set(r)
        if r["sparq"] == 0:
            assert r["sparq_calls"] == 0
        else:
            assert r["sparq_calls"] > 0 and r["sparq_k"] in (8, 16)
            if r["n_depth"] == 256:
                assert 0 < r["sparq_compr"] < 1


def test_bench_sweeps_index_lists_and_probe(tiny_model):
    rows = json.loads(bench(tiny_model, "--sparq", "1", "--sparq-selector", "index", "--sparq-k", "16",
                            "--sparq-min-kv", "0", "--sparq-index-lists", "8,32", "--sparq-index-probe", "1,4",
                            "-d", "512", "--depth-fill", "synthetic"))
    got = [(r["sparq_index_lists"], r["sparq_index_probe"]) for r in rows]
    assert got == [(8, 1), (8, 4), (32, 1), (32, 4)]
    for r in rows:
        assert r["sparq_selector"] == "index" and r["sparq_calls"] > 0
    compr = {(r["sparq_index_lists"], r["sparq_index_probe"]): r["sparq_compr"] for r in rows}
    # the cost model: more probed lists read more keys, more lists (at the same probe) fewer
    assert compr[(8, 1)] < compr[(8, 4)] and compr[(32, 4)] < compr[(8, 4)]
    md = bench(tiny_model, "--sparq", "1", "--sparq-selector", "index", "--sparq-k", "16", "--sparq-index-lists", "32,64",
               fmt="md")
    assert "sparq_index_lists" in md.splitlines()[0] and "sparq_index_probe" not in md.splitlines()[0]
    res = run([tool_path("llama-bench"), "-m", tiny_model, "-p", "0", "-n", "2", "-r", "1", "--sparq", "1",
               "--sparq-k", "16", "--sparq-index-lists", "8", "--sparq-index-probe", "9"], timeout=60)
    assert res.returncode != 0
    assert "SparQ: index_probe = 9 is out of range: allowed 1..index_lists (index_lists = 8)" in res.stderr


@pytest.mark.parametrize("fmt", ["md", "csv", "jsonl", "sql"])
def test_bench_formats_have_sparq_columns(tiny_model, fmt):
    out = bench(tiny_model, "--sparq", "0,1", "--sparq-min-kv", "0", "-d", "128", fmt=fmt)
    if fmt == "md":
        header = out.splitlines()[0]
        for col in ("sparq", "sparq_r", "sparq_k", "sparq_l", "sparq_calls", "sparq_compr"):
            assert col in header
        assert len([l for l in out.splitlines() if l.startswith("|")]) == 4  # header, rule, 2 rows
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        assert [r["sparq"] for r in rows] == ["0", "1"] and int(rows[1]["sparq_calls"]) > 0
    elif fmt == "jsonl":
        rows = [json.loads(l) for l in out.splitlines() if l.strip()]
        assert [r["sparq"] for r in rows] == [0, 1]
    else:
        assert "sparq_calls INTEGER" in out and "sparq_compr REAL" in out


def test_bench_refuses_bad_sparq_values(tiny_model):
    # parsing errors from llama-bench itself, ranges from llama_sparq_set_params
    res = run([tool_path("llama-bench"), "-m", tiny_model, "--sparq-k", "8,x"], timeout=60)
    assert res.returncode != 0 and "--sparq-k: 'x' is not allowed (integers)" in res.stderr
    res = run([tool_path("llama-bench"), "-m", tiny_model, "--sparq-gqa", "per_query"], timeout=60)
    assert res.returncode != 0 and "--sparq-gqa: 'per_query' is not allowed (shared, per_head)" in res.stderr
    res = run([tool_path("llama-bench"), "-m", tiny_model, "-p", "0", "-n", "2", "-r", "1", "--sparq-k", "-2"], timeout=60)
    assert res.returncode != 0 and "llama-bench: error: SparQ: k = -2 is out of range: allowed 1.." in res.stderr
    # the calibrated k (k = 0, the default) is the sparq and oracle selectors': the others are told to give k
    res = run([tool_path("llama-bench"), "-m", tiny_model, "-p", "0", "-n", "2", "-r", "1", "--sparq-selector", "h2o"],
              timeout=60)
    assert res.returncode != 0 and "k = 0 (calibrated) needs the sparq or oracle selector" in res.stderr
    res = run([tool_path("llama-bench"), "-m", tiny_model, "-p", "0", "-n", "2", "-r", "1", "--sparq-coverage", "1.2"],
              timeout=60)
    assert res.returncode != 0 and "SparQ: coverage = 1.2 is out of range: allowed (0, 1]" in res.stderr
    res = run([tool_path("llama-bench"), "-m", tiny_model, "-p", "0", "-n", "2", "-r", "1", "--sparq-r", "64"], timeout=60)
    assert res.returncode != 0 and "r = 64 is out of range" in res.stderr
