"""llama-server with SparQ: its default slots decode with SparQ (one KV stream per slot instead of
the unified stream where SparQ runs dense), the counters in /metrics and /props, a load test
with every concurrent response equal to the same request run alone; and SparQ's need for the
flash-attention layout in every common tool (-fa auto becomes on, never "SparQ on" with no layer).

The server helpers (start on a free loopback port, prompts, load, comparison) are those of
bench/server_load.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparq import tool_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import Server, build_prompts, run_load  # noqa: E402


def run(args, timeout=300):
    return subprocess.run([str(a) for a in args], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)


def check_load(res, n_requests):
    assert not res["incomplete"], res["incomplete"]
    assert not res["mismatches"], res["mismatches"][:3]
    assert len(res["texts"]) == n_requests and all(res["texts"])
    # decode steps ran SparQ while the slots decoded together, none dense for a shared stream
    assert res["sparq_calls_concurrent"] > 0, res
    assert res["sparq_dense_concurrent"].get("shared_stream", 0) == 0, res
    assert res["busy_slots_per_decode"] > 1, res


def test_server_default_slots_sparq_tiny(tiny_model, tmp_path):
    """The server's defaults (-np auto: 4 slots) with --sparq: one KV stream per slot, SparQ
    calls while 8 requests share the slots, each response equal to the request run alone.
    Before: one unified stream, every decode step dense (shared_stream), SparQ calls 0."""
    with Server(tiny_model, ["-c", 4096, "--sparq", "--sparq-k", 8, "--sparq-r", 4, "--sparq-min-kv", 0],
                log_path=tmp_path / "server.log", start_timeout=120) as srv:
        props = srv.get("/props")
        assert props["total_slots"] == 4
        assert props["default_generation_settings"]["n_ctx"] == 1024  # n_ctx / slots: its own stream
        sp = props["sparq"]
        assert sp["enabled"] and sp["n_layers"] == 2 and (sp["k"], sp["r"], sp["min_kv"]) == (8, 4, 0)
        prompts = build_prompts(srv, 8, 60, 200, seed=1)
        res = run_load(srv, prompts, n_predict=12, request_timeout=120)
        check_load(res, 8)
        m = srv.metrics()
        assert m["sparq_enabled"] == 1 and m["sparq_layers"] == 2
        assert m["sparq_calls_total"] == res["sparq_calls_concurrent"] + res["sparq_calls_alone"]
        assert 0 < m["sparq_compression"] < 1
        assert m['sparq_dense_calls_total{reason="prefill"}'] > 0
        props = srv.get("/props")["sparq"]
        assert props["n_sparq"] == m["sparq_calls_total"] and props["n_dense"]["shared_stream"] == 0
        assert srv.error_lines() == []
        assert "one KV stream each" in srv.log()


def test_server_without_sparq_reports_it_off(tiny_model, tmp_path):
    with Server(tiny_model, ["-c", 2048], log_path=tmp_path / "server.log", start_timeout=120) as srv:
        assert srv.get("/props")["sparq"]["enabled"] is False
        m = srv.metrics()
        assert m["sparq_enabled"] == 0 and m["sparq_calls_total"] == 0


def test_server_refuses_sparq_with_unified_kv(tiny_model):
    res = run([tool_path("llama-server"), "-m", tiny_model, "--port", "0", "--sparq", "--kv-unified", "-np", "4"],
              timeout=120)
    assert res.returncode != 0
    assert "--sparq with --kv-unified and several slots" in res.stdout + res.stderr, res.stderr[-1500:]


def test_sparq_forces_flash_attention_layout(tiny_model):
    """-fa auto (the default) with --sparq becomes -fa on: the context is made with it."""
    res = run([tool_path("llama-completion"), "-m", tiny_model, "-p", "hello", "-n", "4", "-no-cnv", "-t", "1",
               "--sparq", "--sparq-min-kv", "0", "-lv", "4"])  # verbosity 4 logs the context's parameters
    assert res.returncode == 0, res.stderr[-2000:]
    assert "flash_attn            = enabled" in res.stderr, res.stderr[-3000:]
    assert "SparQ on: " in res.stderr and "; 2 layers" in res.stderr


def test_sparq_refused_when_no_layer_can_run_it(tmp_path):
    """A quantized K/V cache leaves SparQ no layer: refused, never "SparQ on" with 0 layers.
    Before: "SparQ on: ...; 0 layers" and a run with every step dense."""
    from llama_sparq.models import make_tiny_llama

    model = make_tiny_llama(tmp_path / "tiny-d32.gguf", n_layer=2, n_embd=64, n_head=2)  # q8_0 needs head size % 32
    res = run([tool_path("llama-completion"), "-m", model, "-p", "hello", "-n", "4", "-no-cnv", "-t", "1",
               "--sparq", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert res.returncode != 0
    assert "no KV-cache layer of this context can run SparQ" in res.stderr, res.stderr[-2000:]
    assert "SparQ on: " not in res.stderr


@pytest.mark.real_model
def test_server_load_gemma(gemma_model, tmp_path):
    """Issue 10 item 8: llama-server on loopback with its default 4 slots and --sparq, 16
    concurrent greedy completions of 2K-6K-token prompts; every response complete and equal
    to the same request run alone, SparQ calls > 0, no error line in the log."""
    with Server(gemma_model, ["-c", 32768, "--sparq"], log_path=tmp_path / "server.log", start_timeout=300) as srv:
        props = srv.get("/props")
        assert props["total_slots"] == 4 and props["sparq"]["enabled"] and props["sparq"]["n_layers"] > 0
        prompts = build_prompts(srv, 16, 2048, 6144, seed=0)
        res = run_load(srv, prompts, n_predict=8, request_timeout=900)
        check_load(res, 16)
        assert srv.error_lines() == []
