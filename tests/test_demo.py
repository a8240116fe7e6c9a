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
                        "--answer-tokens", "6", "--threads", "2", "--chat-tokens", "1500", "--chat-questions", "2"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    # the document slice and the note's depth
    m = re.search(r"pass-key note at token (\d+) \((\d+) % deep\)", out)
    assert m and 50 <= int(m.group(2)) <= 70, out
    # the five answers, each checked against the inserted pass key (dense finds it at 2K tokens)
    labels = ("dense -fa 1", "dense -fa 0", "dense q8_0", "SparQ (defaults)", "SparQ, q8_0")
    ans = {lab: re.search(rf"^{re.escape(lab)} +: '(.*)'  \[(correct|WRONG)\]$", out, re.M) for lab in labels}
    assert all(ans.values()), out
    assert all(ans[lab].group(2) == "correct" for lab in labels[:3]), out
    assert "48613" in ans["SparQ (defaults)"].group(1) and "48613" in ans["SparQ, q8_0"].group(1), out
    # speed lines with measured numbers, the speed-up over the fastest dense way named
    tps = re.findall(rf"^(?:{'|'.join(map(re.escape, labels))}) *:\s+([0-9.]+) tokens/s \(5 steps", out, re.M)
    assert len(tps) == 5 and all(float(t) > 0 for t in tps), out
    assert re.search(r"^speedup +: [0-9.]+x over the fastest dense \(dense (?:-fa [01]|q8_0); [0-9.]+x over -fa 1",
                     out, re.M), out
    m = re.search(r"^on q8_0 +: SparQ [0-9.]+x over dense on the same q8_0 cache, reading ([0-9.]+) % of", out, re.M)
    assert m and 0 < float(m.group(1)) < 60, out
    # SparQ ran: the 3 global layers at each of the 6 steps; the sliding-window layers dense
    calls = re.search(r"^SparQ calls +: (\d+) of (\d+) \((\d+) full-attention layers x (\d+) steps;", out, re.M)
    assert calls and 0 < int(calls.group(1)) <= int(calls.group(2)) == int(calls.group(3)) * int(calls.group(4)), out
    # the full-attention layers' other steps dense by a named reason; the sliding-window layers dense
    dense = re.search(r"^dense calls +: (swa \d+(?:, \w+ \d+)*) ", out, re.M)
    assert dense, out
    reasons = {k: int(v) for k, v in (x.split() for x in dense.group(1).split(", "))}
    assert int(calls.group(1)) + sum(v for k, v in reasons.items() if k != "swa") == int(calls.group(2)), out
    comp = re.search(r"^bytes read +: SparQ read ([0-9.]+) % of the K/V bytes", out, re.M)
    assert comp and 0 < float(comp.group(1)) < 50, out
    assert "dense answer     : SparQ off, 0 SparQ calls" in out
    # the chat model: two questions, each answered by both, the score, speed and bytes of each
    qs = re.findall(r"^  q\d+ \((\d+) tokens", out, re.M)
    assert len(qs) == 2 and all(1400 <= int(n) <= 1600 for n in qs), out
    assert len(re.findall(r"^    (?:dense|SparQ): '.*' \[(?:right|wrong)\]$", out, re.M)) == 4, out
    assert re.search(r"^score +: dense [0-2]/2, SparQ [0-2]/2$", out, re.M), out
    assert re.search(r"^decode tokens/s +: dense -fa 1 [0-9.]+, dense -fa 0 [0-9.]+, dense q8_0 [0-9.]+ .*SparQ [0-9.]+$",
                     out, re.M), out
    assert re.search(r"^speedup +: [0-9.]+x over the fastest dense \(dense (?:-fa [01]|q8_0)\)$", out, re.M), out
    m = re.search(r"^bytes read +: SparQ read ([0-9.]+) % .*; (\d+) SparQ calls\)$", out, re.M)
    assert m and 0 < float(m.group(1)) <= 100 and int(m.group(2)) > 0, out
    # the llama.cpp tool part ran with --sparq
    assert "SparQ on: " in out and "Answer: The three primary colours are" in out, out
    assert re.search(r"^demo total: [0-9.]+ s$", out, re.M), out
