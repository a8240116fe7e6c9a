"""The soak of bench/server_load.py, short: a few dozen mixed requests (real text of 100-700
tokens, streamed and not, some cancelled mid-stream, completions and chat) against a server with
SparQ and one without, for llama-sparq-server and for the Python server, on the tiny model. No
error, memory sampled after every request, latencies and SparQ's counters recorded. The full
soak (500 requests of 1K-7.5K tokens on SmolLM2 and Gemma 3) is in bench/README.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import main as load_main  # noqa: E402

TINY_SPARQ = "--sparq --sparq-k 16 --sparq-r 4 --sparq-min-kv 0"


def soak(tmp_path, model, server, requests, block):
    # a loose memory bound: the slots' buffers are still being touched this early in a short run
    rc = load_main(["soak", "--model", str(model), "--server", server, "--requests", str(requests),
                    "--block", str(block), "--min-tokens", "100", "--max-tokens", "700", "--ctx-per-slot", "1024",
                    "--sparq-args", TINY_SPARQ, "--rss-from", "8", "--rss-bound", "0.5", "--seed", "3",
                    "--cancel-share", "0.3", "--turns", "4", "--tag", "soak", "--out-dir", str(tmp_path)])
    doc = json.loads((tmp_path / "soak.json").read_text())
    return rc, doc


def check(rc, doc, requests):
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"sparq", "dense"}
    for v, r in rows.items():
        assert r["requests"] == requests and not r["errors"] and not r["error_lines"], (v, r["errors"], r["error_lines"])
        assert r["alive_at_end"], v
        assert r["ok"] + r["cancelled"] == requests and r["cancelled"] >= 1, (v, r["ok"], r["cancelled"])
        after = r["rss"]["after_each_request_mib"]
        assert len(after) == requests and all(x and x > 0 for x in after), after
        assert r["rss"]["growth"] is not None and not [b for b in r["verdict"] if "RSS" in b], r["verdict"]
        assert 0 < r["latency_s"]["p50"] <= r["latency_s"]["p99"] and r["ttft_s"]["p50"] > 0, r["latency_s"]
        assert (r["sparq"]["calls"] > 0) == (v == "sparq"), (v, r["sparq"])
    assert 0 < rows["sparq"]["sparq"]["compression"] < 1
    assert any(q["chat"] for q in doc["requests"]) and any(q["stream"] for q in doc["requests"])
    assert doc["meta"]["machine"]["cpu"] and doc["meta"]["commit"]
    assert rc == 0


def test_soak_llama_server_tiny(tiny_model, tmp_path):
    rc, doc = soak(tmp_path, tiny_model, "llama", 32, 16)
    check(rc, doc, 32)
    assert doc["meta"]["concurrency"] == 4
    assert "PASS" in (tmp_path / "soak.md").read_text()


def test_soak_python_server_tiny(tiny_model, tmp_path):
    for mod in ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"):
        pytest.importorskip(mod, reason="the server extra (pip install 'llama-sparq[server]') is not installed")
    rc, doc = soak(tmp_path, tiny_model, "python", 24, 12)
    check(rc, doc, 24)
    assert doc["meta"]["concurrency"] == 1  # one request decodes at a time there
