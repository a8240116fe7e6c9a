"""``python bench/real_text.py split``: where a decode step's time goes on real text, depth 0 against
the prompt's length, dense against SparQ, by ``perf record`` (real_text.py's fifth subcommand)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, loadavg, md_bullets, md_table, out_stem, run_meta, write_json, write_md  # noqa: E402


SPLIT_DOC = """Where a decode step's time goes, by perf: the weights' matmuls, attention, barriers, the rest.

``real_text.py speed`` gives SparQ's share of its Amdahl bound; this says where a shortfall sits.
Each run is ``real_text.py profile``'s steady greedy decode from a saved prefill of the Python
documentation, under ``perf record -F --freq``, sampling only the ``--steps`` decode steps (perf's
control FIFO: no load, no prefill). The runs: dense ``-fa 1`` and ``-fa 0`` at depth 0 (a 16-token
prompt) and at ``--tokens``, and SparQ's defaults at ``--tokens`` per K^T width of ``--kt-bits``;
an f16 cache (a quantized one's attention kernels share names with the weights').

A sample is 1/F s of one CPU; per run and step, CPU milliseconds of:

- weights: the quantized matmuls (``ggml_vec_dot_<quant>_*``, ``ggml_gemv_*``, ``ggml_gemm_*``,
  llamafile's ``tinyBLAS``) and the activations' ``quantize_row_*``;
- attention: upstream's flash attention or ``-fa 0`` path (``ggml_vec_dot_f16``, ``ggml_vec_mad_f16``,
  ``soft_max``, libm's ``exp``, the f16 conversions) or SparQ (every symbol naming ``sparq``, the op's
  ISA kernels, the standard library's selections in libggml-cpu);
- barriers: the threads' waits (libgomp, ``ggml_barrier``);
- other: the rest of the step (norms, RoPE, graph building, Python).

From these: the weights' slowdown at the prompt's length against depth 0 (a cache that no longer
holds them), the Amdahl bound as ``speed`` computes it (depth 0's step, the fastest dense step at
``--tokens``, the compression SparQ's counters measured), the bound again with the non-attention
time of the prompt's length (depth 0's plus the fastest dense path's weights' slowdown), SparQ's
share of each, what SparQ's step has over depth 0 per part, and SparQ's top symbols.

    python bench/real_text.py split --model smollm2 --tokens 8000 --tag step_split_smollm2_8k

Writes bench/results/<tag>.json and .md. Needs perf (Debian: linux-perf) allowed to sample this
user's processes (``kernel.perf_event_paranoid`` <= 2).
"""

# libllama's and libggml-cpu's symbols (perf's names, demangled, without arguments)
_WEIGHTS = re.compile(r"^(ggml_vec_dot_(?!f16|f32|bf16)\w+|quantize_row_\w+|ggml_gemv_\w+|ggml_gemm_\w+)$|tinyBLAS")
_ATTN = re.compile(r"flash_attn|soft_max|^ggml_vec_(dot|mad|scale)_f16|^ggml_v_expf|fp32_to_fp16|fp16_to_fp32|sparq")
# perf report -n --sort dso,symbol: "  35.30%  18841  libggml-cpu.so  [.] ggml_vec_dot_q4_1_q8_1"
_LINE = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")
PARTS = ("weights", "attention", "barriers", "other")


def classify(dso: str, sym: str) -> str:
    """The part of a step a sampled symbol of shared object dso belongs to (PARTS)."""
    if dso.startswith("libgomp") or sym == "ggml_barrier":
        return "barriers"
    if _WEIGHTS.search(sym):
        return "weights"
    # the op's ISA kernels live in anonymous namespaces of libggml-cpu (upstream's there are tinyBLAS),
    # and the standard library's selections there are the op's but for upstream's argsort and top-k
    # (a MoE's routing), which name their comparators cmp_argsort, cmp_top_k
    ours = "(anonymous namespace)::" in sym or (sym.startswith("std::") and "cmp_" not in sym)
    if _ATTN.search(sym) or (dso.startswith("libm.") and "exp" in sym) or (dso.startswith("libggml-cpu") and ours):
        return "attention"
    return "other"


def parse_report(text: str) -> dict:
    """perf report's lines -> {"samples": {part: n}, "symbols": {part: {symbol: n}}}."""
    samples = dict.fromkeys(PARTS, 0)
    symbols = {p: {} for p in PARTS}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        n, dso, sym = int(m.group(1)), m.group(2), m.group(4)
        sym = re.split(r"\s{2,}", sym)[0]
        part = classify(dso, sym)
        samples[part] += n
        symbols[part][sym] = symbols[part].get(sym, 0) + n
    return {"samples": samples, "symbols": symbols}


def perf_usable() -> str | None:
    """None when perf can sample a process of this user, else why not."""
    if not shutil.which("perf"):
        return "perf is not installed (Debian: linux-perf)"
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(["perf", "record", "-F", "100", "-o", str(Path(d) / "t.data"), "--", "true"],
                           capture_output=True, text=True)
    if p.returncode != 0:
        return f"perf record fails: {p.stderr.strip()[-400:]}"
    return None


def run_profiled(args, work: Path, name: str, tokens: int, dense: str | None, kt_bits: int | None) -> dict:
    """One run of real_text.py profile (the dense path dense, a key of real_text.DENSE, or SparQ's
    defaults at kt_bits): the prefill kept first (unsampled), then the decode steps under perf record."""
    from real_text import DENSE, profile_cmd, profile_result

    state_dir = work / f"state_{tokens}"
    cmd = profile_cmd(args, dense, kt_bits, tokens=tokens, steps=1, state_dir=state_dir)
    profile_result(subprocess.run(cmd, capture_output=True, text=True), f"{name}: real_text.py profile")
    ctl, ack, data = work / f"{name}.ctl", work / f"{name}.ack", work / f"{name}.data"
    for f in (ctl, ack):
        f.unlink(missing_ok=True)
        os.mkfifo(f)
    profile = profile_cmd(args, dense, kt_bits, tokens=tokens, state_dir=state_dir)
    cmd = ["perf", "record", "-D", "-1", "--control", f"fifo:{ctl},{ack}", "-F", str(args.freq), "-o", str(data),
           "--", *profile, "--perf-control", f"{ctl},{ack}"]
    run = profile_result(subprocess.run(cmd, capture_output=True, text=True),
                         f"{name}: perf record of real_text.py profile")
    rep = subprocess.run(["perf", "report", "-i", str(data), "-n", "--sort", "dso,symbol", "--stdio"],
                         capture_output=True, text=True)
    if rep.returncode != 0:
        raise SystemExit(f"{name}: perf report failed: {rep.stderr[-2000:]}")
    parsed = parse_report(rep.stdout)
    if sum(parsed["samples"].values()) == 0:
        raise SystemExit(f"{name}: perf recorded no sample of the decode steps")
    ms = 1000.0 / args.freq / args.steps  # CPU ms a step per sample
    return {"tokens": tokens, "mode": "dense" if dense else "sparq", "flash_attn": DENSE[dense][1] if dense else 1,
            "kt_bits": kt_bits, **run,
            "cpu_ms": {k: round(v * ms, 3) for k, v in parsed["samples"].items()},
            "top": {part: [[s, round(n * ms, 3)] for s, n in sorted(d.items(), key=lambda x: -x[1])[:args.top]]
                    for part, d in parsed["symbols"].items()}}


def analyse(runs: dict, threads: int) -> dict:
    """The weights' slowdowns, the two bounds and SparQ's shares, SparQ's step over depth 0 by part."""
    step = {k: 1000.0 / r["tokens_per_s"] for k, r in runs.items()}
    d0 = min(("depth0_fa1", "depth0_fa0"), key=lambda k: step[k])
    dS = min(("dense_fa1", "dense_fa0"), key=lambda k: step[k])
    t0, tS = step[d0], step[dS]
    w0 = runs[d0]["cpu_ms"]["weights"]
    # depth 0's step plus what the fastest dense path's weights lose at the prompt's length (wall: over the threads)
    t0S = t0 + max(0.0, runs[dS]["cpu_ms"]["weights"] - w0) / threads
    out = {"depth0_fastest": d0, "dense_fastest": dS, "depth0_step_ms": round(t0, 3), "dense_step_ms": round(tS, 3),
           "weights_over_depth0": {k: round(r["cpu_ms"]["weights"] / w0, 3) for k, r in runs.items() if w0 > 0},
           "sparq": {}}
    for k, r in runs.items():
        if r["mode"] != "sparq":
            continue
        c = r["compression"]
        speedup = tS / step[k]
        b0 = tS / (t0 + c * max(0.0, tS - t0))
        bS = tS / (t0S + c * max(0.0, tS - t0S))
        out["sparq"][k] = {
            "speedup": round(speedup, 3), "compression": c,
            "bound_depth0": round(b0, 3), "share_depth0": round(speedup / b0, 3),
            "bound_at_length": round(bS, 3), "share_at_length": round(speedup / bS, 3),
            # CPU ms a step over depth 0's fastest, per part; the bound allows attention c (tS - t0) ms of wall
            "over_depth0_cpu_ms": {p: round(r["cpu_ms"][p] - runs[d0]["cpu_ms"][p], 3) for p in PARTS},
            "allowed_over_depth0_wall_ms": round(c * max(0.0, tS - t0), 3),
        }
    return out


# (run, depth 0?, dense path): an f16 cache
RUNS = (("depth0_fa1", True, "f16_fa1"), ("depth0_fa0", True, "f16_fa0"),
        ("dense_fa1", False, "f16_fa1"), ("dense_fa0", False, "f16_fa0"))


def split_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=SPLIT_DOC.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a GGUF path (default smollm2)")
    ap.add_argument("--tokens", type=int, default=8000, help="prompt tokens of the Python documentation (default 8000)")
    ap.add_argument("--steps", type=int, default=200, help="decode steps sampled per run (default 200)")
    from llama_sparq import _sparq

    kt_default = str(_sparq.default_params()["kt_bits"])
    ap.add_argument("--kt-bits", default=kt_default, help="SparQ's K^T widths, comma list of 16, 8, 4 (default "
                    f"{kt_default}, the fork's default)")
    ap.add_argument("--freq", type=int, default=2000, help="perf's samples a second per CPU (default 2000)")
    ap.add_argument("--top", type=int, default=12, help="symbols listed per part and run (default 12)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    bits = a.kt_bits.split(",")
    if not bits or any(b not in ("16", "8", "4") for b in bits):
        ap.error(f"--kt-bits takes a comma list of 16, 8, 4; got {a.kt_bits!r}")
    if a.tokens < 1024 or a.steps < 1 or not 1 <= a.freq <= 20000 or a.top < 1 or a.threads < 1:
        ap.error("--tokens must be >= 1024, --steps >= 1, --freq 1..20000, --top >= 1, --threads >= 1")
    why = perf_usable()
    if why:
        raise SystemExit(f"real_text.py split needs perf: {why}")
    load0 = loadavg()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="sparq_split_") as d:
        work = Path(d)
        plan = [(n, 16 if d0 else a.tokens, dense, None) for n, d0, dense in RUNS]
        plan += [(f"sparq_kt{b}", a.tokens, None, int(b)) for b in bits]
        for name, tokens, dense, kt in plan:
            runs[name] = run_profiled(a, work, name, tokens, dense, kt)
            r = runs[name]
            print(f"{name}: {r['tokens_per_s']:.2f} t/s; CPU ms a step: "
                  + ", ".join(f"{p} {r['cpu_ms'][p]:.2f}" for p in PARTS), flush=True)
    for name, r in runs.items():
        if r["mode"] == "sparq" and r["sparq_calls"] == 0:
            raise SystemExit(f"{name}: no SparQ call ran")
    if runs["depth0_fa1"]["cpu_ms"]["weights"] == 0:
        raise SystemExit(f"{a.model}: no quantized matmul was sampled: split needs a model whose weights are "
                         "quantized (f16 and f32 weights' matmuls run the kernels of dense attention's -fa 0 path)")
    res = {"tokens": a.tokens, "steps": a.steps, "freq": a.freq, "runs": runs, "analysis": analyse(runs, a.threads)}
    meta = {**run_meta(a.threads, load0), "model": a.model, "sampling": f"perf record -F {a.freq}, the {a.steps} "
            "decode steps of each run only (perf's control FIFO); perf slows each run a little"}
    stem = out_stem(a.out_dir, a.tag)
    write_json(stem.with_suffix(".json"), {"meta": meta, "result": res}, newline=True)
    write_md(stem.parent, a.tag, report_lines(a.tag, meta, res))
    return 0


def report_lines(tag: str, meta: dict, res: dict) -> list[str]:
    runs, an = res["runs"], res["analysis"]
    rows = []
    for k, r in runs.items():
        sq = r["mode"] == "sparq"
        rows.append([k, str(r["tokens"]), f"{r['tokens_per_s']:.2f}", f"{1000.0 / r['tokens_per_s']:.2f}",
                     *(f"{r['cpu_ms'][p]:.2f}" for p in PARTS), f"{an['weights_over_depth0'].get(k, 0):.2f}x",
                     str(r["sparq_calls"]) if sq else "", f"{r['compression']:.4f}" if sq else ""])
    lines = [f"# Where a decode step's time goes on real text: {tag}", "", *md_bullets(meta.items()), "",
             "Per step, CPU milliseconds (the threads together; a step's wall time is about their sum over the "
             "threads):", "",
             *md_table(["run", "prompt tokens", "t/s (under perf)", "wall ms a step", *PARTS, "weights / depth 0",
                        "SparQ calls", "compression"], rows), ""]
    for k, s in an["sparq"].items():
        over = ", ".join(f"{p} {v:+.2f}" for p, v in s["over_depth0_cpu_ms"].items())
        lines += [f"- `{k}`: **{s['speedup']:.2f}x** the fastest dense (`{an['dense_fastest']}`); the depth-0 bound "
                  f"{s['bound_depth0']:.2f}x (depth 0 `{an['depth0_fastest']}`, compression {s['compression']:.4f}), "
                  f"**{s['share_depth0'] * 100:.0f} %** of it; with the non-attention time at this length "
                  f"{s['bound_at_length']:.2f}x, {s['share_at_length'] * 100:.0f} %. Over depth 0, CPU ms a step: "
                  f"{over}; the bound allows {s['allowed_over_depth0_wall_ms']:.2f} ms of wall time over depth 0."]
    for k, r in runs.items():
        if r["mode"] == "sparq":
            lines += ["", f"`{k}`'s attention, top symbols (CPU ms a step): " + "; ".join(
                f"`{s}` {v:.2f}" for s, v in r["top"]["attention"])]
    return lines
