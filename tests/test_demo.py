"""scripts/demo.py (``make demo`` and ``make demo-full``) on short slices of its documents: the
answers, the speed lines and SparQ's counters are printed, and SparQ really ran."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.py"


def run_demo(gemma_model, *args: str) -> str:
    r = subprocess.run([sys.executable, str(DEMO), "--model", str(gemma_model), "--threads", "2", *args],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def check_gemma(out: str, labels: tuple[str, ...], steps: int) -> None:
    """The pass-key part: every path's answer and speed, the speed-up over the fastest dense path
    timed (named, with the paths timed), and the SparQ answer's counters."""
    m = re.search(r"pass-key note at token (\d+) \((\d+) % deep\)", out)
    assert m and 50 <= int(m.group(2)) <= 70, out
    # each answer checked against the inserted pass key (dense finds it at these lengths)
    ans = {lab: re.search(rf"^{re.escape(lab)} +: '(.*)'  \[(correct|WRONG)\]$", out, re.M) for lab in labels}
    assert all(ans.values()), out
    assert all(ans[lab].group(2) == "correct" for lab in labels if lab.startswith("dense")), out
    assert all("48613" in ans[lab].group(1) for lab in labels if lab.startswith("SparQ")), out
    tps = re.findall(rf"^(?:{'|'.join(map(re.escape, labels))}) *:\s+([0-9.]+) tokens/s \({steps} steps", out, re.M)
    assert len(tps) == len(labels) and all(float(t) > 0 for t in tps), out
    dense = ", ".join(lab for lab in labels if lab.startswith("dense"))
    assert re.search(rf"^speedup +: [0-9.]+x over the fastest dense \(dense (?:-fa [01]|q8_0); dense timed: "
                     rf"{re.escape(dense)}\), [0-9.]+x over -fa 1", out, re.M), out
    # SparQ ran: the 3 global layers at each step; the sliding-window layers dense
    calls = re.search(r"^SparQ calls +: (\d+) of (\d+) \((\d+) full-attention layers x (\d+) steps;", out, re.M)
    assert calls and 0 < int(calls.group(1)) <= int(calls.group(2)) == int(calls.group(3)) * int(calls.group(4)), out
    # the full-attention layers' other steps dense by a named reason; the sliding-window layers dense
    dense_calls = re.search(r"^dense calls +: (swa \d+(?:, \w+ \d+)*) ", out, re.M)
    assert dense_calls, out
    reasons = {k: int(v) for k, v in (x.split() for x in dense_calls.group(1).split(", "))}
    assert int(calls.group(1)) + sum(v for k, v in reasons.items() if k != "swa") == int(calls.group(2)), out
    comp = re.search(r"^bytes read +: SparQ read ([0-9.]+) % of the K/V bytes dense attention reads in", out, re.M)
    assert comp and 0 < float(comp.group(1)) < 50, out
    assert "dense answer     : SparQ off, 0 SparQ calls" in out


def check_chat(out: str, n: int, lo: int, hi: int, others: str) -> None:
    """The chat part: n questions, each answered by both (SparQ's answer compared with dense's),
    the scores, the speed of every path timed and the fastest dense one, bytes read and calls."""
    qs = re.findall(r"^  q\d+ = candidate (\d+) \((\d+) tokens", out, re.M)
    assert len(qs) == n and all(lo <= int(t) <= hi for _, t in qs), out
    assert len(re.findall(r"^    dense: '.*' \[(?:right|wrong)\]$", out, re.M)) == n, out
    same = re.findall(r"^    SparQ: '.*' \[(?:right|wrong); (the same text as dense|DIFFERS from dense)\]$", out, re.M)
    assert len(same) == n, out
    assert re.search(rf"^score +: dense [0-{n}]/{n}, SparQ [0-{n}]/{n}$", out, re.M), out
    m = re.search(rf"^same answers +: SparQ's answer is dense's text on (\d+)/{n}(; it differs on (q\d+(?:, q\d+)*))?$",
                  out, re.M)
    assert m and int(m.group(1)) == same.count("the same text as dense"), out
    assert (m.group(3) or "").count("q") == n - int(m.group(1)), out
    assert re.search(rf"^decode tokens/s +: dense -fa 1 [0-9.]+, {others} \(.*: q1's prompt only\), SparQ [0-9.]+$",
                     out, re.M), out
    assert re.search(r"^speedup +: [0-9.]+x over the fastest dense \(dense (?:-fa [01]|q8_0); dense timed: "
                     r"dense -fa 1, dense -fa 0", out, re.M), out
    m = re.search(r"^bytes read +: SparQ read ([0-9.]+) % .*mean over the questions\)$", out, re.M)
    assert m and 0 < float(m.group(1)) <= 100, out
    m = re.search(r"^SparQ calls +: (\d+) in the SparQ answers' decode steps .*; the dense answers 0$", out, re.M)
    assert m and int(m.group(1)) > 0, out
    assert re.search(r"^demo total: [0-9.]+ s", out, re.M), out


@pytest.mark.real_model
def test_demo_short_slice(gemma_model, smollm2_model):
    """make demo: dense -fa 1 and SparQ from one prefill, dense -fa 0; the chosen chat questions."""
    out = run_demo(gemma_model, "--doc-tokens", "1500", "--answer-tokens", "6", "--chat-tokens", "1500",
                   "--chat-questions", "2")
    check_gemma(out, ("dense -fa 1", "dense -fa 0", "SparQ (defaults)"), 5)
    assert "q8_0" not in out.split("== SmolLM2")[0], out
    check_chat(out, 2, 1400, 1600, r"dense -fa 0 [0-9.]+")
    assert re.search(r"^questions: candidates \d+, \d+, the first 2 of chat_qa's candidates on which dense answers "
                     r"right", out, re.M), out
    assert "llama-completion" not in out.split("demo total")[0], out


@pytest.mark.real_model
def test_demo_full_short_slice(gemma_model, smollm2_model):
    """make demo-full: every dense path, SparQ on a q8_0 cache too, the unchosen chat questions
    and llama-completion --sparq."""
    out = run_demo(gemma_model, "--full", "--doc-tokens", "1500", "--answer-tokens", "6", "--chat-tokens", "1100",
                   "--chat-questions", "1")
    check_gemma(out, ("dense -fa 1", "dense -fa 0", "dense q8_0", "SparQ (defaults)", "SparQ, q8_0"), 5)
    m = re.search(r"^on q8_0 +: SparQ [0-9.]+x over dense on the same q8_0 cache, reading ([0-9.]+) % of", out, re.M)
    assert m and 0 < float(m.group(1)) < 60, out
    check_chat(out, 1, 1000, 1200, r"dense -fa 0 [0-9.]+, dense q8_0 [0-9.]+")
    assert "questions: candidates 1, not chosen" in out, out
    # the llama.cpp tool part ran with --sparq
    assert "SparQ on: " in out and "Answer: The three primary colours are" in out, out
