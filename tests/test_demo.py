"""scripts/demo.py (``make demo``) on a short slice of its document: both answers, the speed
lines and SparQ's counters are printed, and SparQ really ran."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.py"


@pytest.mark.real_model
def test_demo_short_slice(gemma_model, smollm2_model):
    r = subprocess.run([sys.executable, str(DEMO), "--model", str(gemma_model), "--doc-tokens", "2000",
                        "--answer-tokens", "6", "--threads", "2", "--chat-tokens", "1500"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    # the document slice and the note's depth
    m = re.search(r"pass-key note at token (\d+) \((\d+) % deep\)", out)
    assert m and 50 <= int(m.group(2)) <= 70, out
    # both answers, each checked against the inserted pass key (dense finds it at 2K tokens)
    dense = re.search(r"^dense attention  : '(.*)'  \[(correct|WRONG)\]$", out, re.M)
    sparq = re.search(r"^SparQ \(defaults\) : '(.*)'  \[(correct|WRONG)\]$", out, re.M)
    assert dense and sparq, out
    assert dense.group(2) == "correct", out
    assert "48613" in sparq.group(1), out
    # speed lines with measured numbers
    tps = re.findall(r"^(?:dense attention|SparQ \(defaults\)) *:\s+([0-9.]+) tokens/s \(5 steps", out, re.M)
    assert len(tps) == 2 and all(float(t) > 0 for t in tps), out
    assert re.search(r"^speedup +: [0-9.]+x", out, re.M), out
    # SparQ ran: the 3 global layers at each of the 6 steps; the sliding-window layers dense
    calls = re.search(r"^SparQ calls +: (\d+) \((\d+) full-attention layers x (\d+) steps\)", out, re.M)
    assert calls and int(calls.group(1)) == int(calls.group(2)) * int(calls.group(3)) > 0, out
    assert re.search(r"^dense calls +: swa \d+", out, re.M), out
    comp = re.search(r"^compression +: ([0-9.]+)", out, re.M)
    assert comp and 0 < float(comp.group(1)) < 0.5, out
    assert "dense answer     : SparQ off, 0 SparQ calls" in out
    # the llama.cpp tool part ran with --sparq
    assert "SparQ on: " in out and "Answer: The three primary colours are" in out, out
    # the chat model through llama-cli: both answers printed and checked, SparQ's counters
    chat = re.findall(r"^(dense attention|SparQ \(defaults\)) *: '(.*)'  \[(correct|WRONG)\]  \(", out, re.M)
    assert [c[0] for c in chat[-2:]] == ["dense attention", "SparQ (defaults)"], out
    m = re.search(r"^  counters: SparQ calls = (\d+)", out, re.M)
    assert m and int(m.group(1)) > 0, out
    assert re.search(r"^demo total: [0-9.]+ s$", out, re.M), out
