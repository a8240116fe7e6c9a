#!/usr/bin/env python3
"""SparQ on an NVIDIA GPU (the CUDA build, `make install CUDA=1`):

    python bench/gpu.py sweep [--only e2e|op] ...     end to end (batch 1, batch 4, -nkvo) and the op
    python bench/gpu.py timeline ...                  where a decode step's time goes, by kernel (nsys or CUPTI)
    python bench/gpu.py lines ...                     Nsight Compute on the op's kernels, by source line

`python bench/gpu.py SUBCOMMAND -h` lists a subcommand's options; scripts/gpu_session.sh runs
them on a borrowed GPU machine. Results: bench/results/gpu_<tag>.*.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, command_line, dispatch, fit_line, git_commit, iqr_points, llama_bench,  # noqa: E402
                      now_iso, run_tool, write_csv, write_json)
from llama_sparq import lib_dir, tool_path  # noqa: E402
from sparq_lab import cost  # noqa: E402
from sparq_lab.models import paper_shape_path  # noqa: E402


# ============================================================================================= sweep

SWEEP_DOC = """SparQ on the GPU: the end-to-end decode sweep and the op microbenchmark.

Needs an NVIDIA GPU and the CUDA build (``make install CUDA=1``). One command runs it all:

    .venv/bin/python bench/gpu.py sweep                 # e2e (batch 1 and 4) + op microbenchmark
    .venv/bin/python bench/gpu.py sweep --only e2e      # or: --only op

End to end (``e2e``), the paper-shape synthetic model (Llama 2 7B attention: 32 heads of
128, MHA; ``--n-layer 8`` layers), F16 cache, all layers on the GPU (``-ngl 99``):

- batch 1: the fork's ``llama-bench -p 0 -n N -d S --depth-fill synthetic -fa 1`` with
  ``--sparq 0,1`` (dense flash attention and SparQ in one process; SparQ with the dense
  threshold 0) at each depth S, plus dense ``-fa 0``; per-token decode time y(S), the
  Appendix D fit y = a*S + b over the interquartile range of the runs, z(S) =
  (y(S) - y(0)) / y(S), the speedup against the faster dense path, the cost model's
  transfer ratio M_dense / M_sparq and the Amdahl bound 1 / ((1 - z) + z * M_sparq / M_dense);
- batch 4: ``llama-batched-bench -npl 4 -npp S -ntg N`` (four sequences, each in its own KV
  stream, a real prefill of S tokens each), dense and ``--sparq``; decode tokens/s;
- ``-nkvo`` (cache in host memory, weights on the GPU) at ``--nkvo-depths``: SparQ's op runs on
  the CPU where the cache is; dense ``-fa 0`` too (upstream puts its attention on the CPU), while
  upstream's dense ``-fa 1`` runs flash attention on the GPU and copies the layer's K and V there
  at every step, so both dense ways are recorded.

The op (``op``): ``test-backend-ops perf -b CUDA0 -o SPARQ_ATTN`` and ``-o FLASH_ATTN_EXT``
with ``SPARQ_PERF_GPU=1`` (ggml-sparq/tools/test-backend-ops-sparq.h: Llama 2 7B attention shapes,
S 4K..256K, batch 1 and 8, r 16/32/64 at k = 128, k 64/256 at r = 32): us/run of each, the
speedup of SparQ over CUDA flash attention on the same shapes, the bound M_dense / M_sparq
and the fraction of it reached.

Every result file (bench/results/gpu_<tag>.{json,csv,md}) records the device (nvidia-smi),
the commit, the exact commands and, for SparQ runs, the fork's counters: sparq_calls (from
llama-bench) and "SparQ calls on a device (GPU, RPC host)" (from the tools' exit log), which must equal the calls,
or the op ran on the CPU. Recorded on an H100: bench/results/gpu_h100*.md (bench/README.md, "GPU").
"""


OUT = RESULTS
# the fork's counters line at exit (llama-bench prints it with -v only)
COUNTERS_RE = re.compile(r"SparQ calls = (\d+), dense calls = (\d+).*SparQ calls on a device \(GPU, RPC host\) = (\d+)")
# the calibrated k's dense stretches among the dense calls ("(..., diffuse N)"), and the op's reports
# folded into the counters (a GPU's op reports too)
DIFFUSE_RE = re.compile(r"SparQ calls = \d+, dense calls = \d+ \([^)]*\bdiffuse (\d+)")
REPORTED_RE = re.compile(r"the op reported (\d+) calls: ([\d.]+) cells attended per KV head and step, ([\d.]+) of the")


def cuda_env() -> dict:
    """The LLAMA_SPARQ_CUDA_* variables set for this run (the op's launch choices, an A/B's one side),
    so that a result file says which way its kernels ran."""
    return {k: v for k, v in os.environ.items() if k.startswith("LLAMA_SPARQ_CUDA_") and v}


def device() -> dict:
    smi = shutil.which("nvidia-smi")
    if not smi:
        sys.exit("gpu.py sweep: no nvidia-smi: this sweep needs an NVIDIA GPU")
    q = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                        "--format=csv,noheader"], capture_output=True, text=True)
    if q.returncode != 0 or not q.stdout.strip():
        sys.exit(f"gpu.py sweep: nvidia-smi lists no GPU: {q.stderr.strip()}")
    if not (lib_dir() / "libggml-cuda.so").is_file():
        sys.exit(f"gpu.py sweep: {lib_dir()} has no libggml-cuda.so: build the CUDA variant with `make install CUDA=1`")
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), "unknown")
    return {"gpu": q.stdout.strip().splitlines()[0], "cuda_lib": str(lib_dir() / "libggml-cuda.so"),
            "host_cpu": f"{cpu}, {os.cpu_count()} cores"}


def counters(stderr: str) -> dict | None:
    """The counters lines of every context the process made, summed (None: no line)."""
    ms = COUNTERS_RE.findall(stderr)
    if not ms:
        return None
    rep = REPORTED_RE.findall(stderr)
    n_rep = sum(int(m[0]) for m in rep)
    return {"contexts": len(ms), "sparq_calls": sum(int(m[0]) for m in ms), "dense_calls": sum(int(m[1]) for m in ms),
            "sparq_calls_gpu": sum(int(m[2]) for m in ms),
            "diffuse_calls": sum(int(m) for m in DIFFUSE_RE.findall(stderr)),
            "reported_calls": n_rep,
            "reported_mean_cells": sum(int(m[0]) * float(m[1]) for m in rep) / n_rep if n_rep else None}


def iqr_fit(S, samples):
    """y = a*S + b over the runs inside the interquartile range at each S (Appendix D)."""
    xs, ys = iqr_points(S, samples)
    return fit_line(np.array(xs, float), np.array(ys, float))


def summarize(args, rows, meta):
    """The fit and the bounds, batch 1 (rows of both interleaved repeats of a config pooled)."""
    pooled = {}
    for r in rows:
        if r.get("batch") != 1 or "error" in r or r["config"] not in ("dense_fa0", "dense_fa1", "sparq"):
            continue
        q = pooled.setdefault((r["config"], r["S"]), dict(r, samples_s_per_token=[]))
        q["samples_s_per_token"] = q["samples_s_per_token"] + r["samples_s_per_token"]
        q["median_ms_per_token"] = 1e3 * float(np.median(q["samples_s_per_token"]))
    dense = {c: {S: q for (cc, S), q in pooled.items() if cc == c} for c in ("dense_fa0", "dense_fa1", "sparq")}
    S_list = sorted(dense["dense_fa1"])
    a, b = iqr_fit(S_list, [dense["dense_fa1"][s]["samples_s_per_token"] for s in S_list])
    meta["fit_dense_fa1"] = {"a": a, "b": b, "what": "y(S) = a*S + b seconds per token, IQR runs (Appendix D)"}
    y0 = dense["dense_fa1"].get(0, {}).get("median_ms_per_token")
    summary = []
    for s in S_list:
        d1 = dense["dense_fa1"][s]["median_ms_per_token"]
        d0 = dense["dense_fa0"].get(s, {}).get("median_ms_per_token", float("inf"))
        spq = dense["sparq"].get(s, {}).get("median_ms_per_token")
        base_ms = min(d1, d0)
        z = (d1 - y0) / d1 if y0 is not None and s > 0 else 0.0
        # the calibrated k (k = 0) chooses its cells per step: its compression is the one llama-bench measured
        spq_row = dense["sparq"].get(s, {})
        if args.k > 0 or s == 0:
            ratio = cost.compression(s, 128, args.r, args.k, kt_bits=args.kt_bits) if s > 0 else 1.0
        else:
            ratio = float(spq_row.get("sparq_compr") or 1.0)
        amdahl = 1.0 / ((1.0 - z) + z * ratio) if s > 0 else 1.0
        summary.append({"S": s, "dense_fa1_ms": d1, "dense_fa0_ms": d0, "sparq_ms": spq,
                        "speedup_vs_fa1": d1 / spq if spq else None, "speedup_vs_best_dense": base_ms / spq if spq else None,
                        "z": z, "z_fit": a * s / (a * s + b) if s > 0 else 0.0, "compression": ratio, "transfer_bound": 1.0 / ratio, "amdahl_bound": amdahl,
                        "sparq_counters": dense["sparq"].get(s, {}).get("exit_counters")})

    return summary


def add_kt_bits(ap):
    """--kt-bits, as every subcommand that runs SparQ takes it."""
    ap.add_argument("--kt-bits", type=int, choices=(4, 8, 16), default=8,
                    help="K^T width (sparq_kt_bits; default 8: the width the GPU rows were timed with at r = 32)")


def resolve_r(r, kt_bits):
    """r as given, or for 0 the fork's default for a K^T of kt_bits at the paper shape's head size."""
    return r or cost.default_r(128, kt_bits)


def e2e(args, meta):
    model = paper_shape_path(args.n_layer)
    bench = str(tool_path("llama-bench"))
    sp = ["--sparq-r", str(args.r), "--sparq-k", str(args.k), "--sparq-l", str(args.l), "--sparq-min-kv", "0",
          "--sparq-basis", args.basis, "--sparq-kt-bits", str(args.kt_bits)] + (["--sparq-topk-buckets", str(args.topk_buckets)] if args.topk_buckets else [])
    rows, cmds = [], []
    # one process per configuration over every depth (the model loads once; each depth gets its own
    # context, and a synthetic fill of S cells before every repetition)
    if args.depths:
        dl = ",".join(str(S) for S in args.depths)
        base = ["-m", str(model), "-ngl", "99", "-p", "0", "-n", str(args.n_gen), "-d", dl,
                "-r", str(args.reps), "-o", "json", "-v", "--depth-fill", "synthetic"]
    for label, extra in ((("dense_fa1_sparq", ["-fa", "1", "--sparq", "0,1,0,1"] + sp), ("dense_fa0", ["-fa", "0"]))
                         if args.depths else ()):
        cmds.append(shlex.join([bench, *base, *extra]))
        try:
            res, _, p = llama_bench(base + extra, exe=bench, what="failed", timeout=3600, echo=True)
        except (RuntimeError, subprocess.TimeoutExpired) as e:  # recorded; the sweep goes on
            print(e, flush=True)
            rows.append({"batch": 1, "S": -1, "config": label, "error": str(e)[-2000:]})
            continue
        for r in res:
            cfg = "sparq" if int(r.get("sparq", 0)) else ("dense_fa1" if label != "dense_fa0" else "dense_fa0")
            t = (np.array(r["samples_ns"], float) / 1e9 / args.n_gen).tolist()
            row = {"batch": 1, "S": int(r["n_depth"]), "config": cfg, "samples_s_per_token": t,
                   "median_ms_per_token": 1e3 * float(np.median(t))}
            if cfg == "sparq":
                row.update({k: r[k] for k in ("sparq_calls", "sparq_dense", "sparq_compr", "sparq_r", "sparq_k",
                                              "sparq_l", "sparq_min_kv")})
                if "sparq_mean_k" in r:
                    row["sparq_mean_k"] = r["sparq_mean_k"]
                # the exit counters are the process's: every depth's SparQ contexts together
                row["exit_counters"] = counters(p.stderr)
            rows.append(row)

    summary = []
    if args.depths:
        summary = summarize(args, rows, meta)
        # written now too: a later part that fails or runs out of time keeps batch 1
        write(f"e2e_{args.tag}", dict(meta, commands=cmds), rows, {"summary": summary})

    # batch 4: llama-batched-bench, four sequences in their own streams
    bb = str(tool_path("llama-batched-bench"))
    for S in args.depths_batch:
        if S == 0:
            continue
        # both dense paths beside SparQ (the faster of them is the baseline)
        for cfg, fa in (("dense_fa1", "on"), ("dense_fa0", "off"), ("sparq", "on")):
            sparq = cfg == "sparq"
            cmd = [bb, "-m", str(model), "-ngl", "99", "-fa", fa, "-c", str(4 * (S + args.n_gen + 64)),
                   "-b", "2048", "-ub", "512", "-npp", str(S), "-ntg", str(args.n_gen), "-npl", "4",
                   "--output-format", "jsonl"] + (["--sparq", "-v"] + sp if sparq else [])
            cmds.append(shlex.join(cmd))
            try:
                p = run_tool(cmd, what="failed", timeout=3600, echo=True)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(e, flush=True)
                rows.append({"batch": 4, "S": S, "config": cfg, "error": str(e)[-2000:]})
                continue
            for line in (p.stdout + "\n" + p.stderr).splitlines():
                line = line.strip()
                if line.startswith("{") and '"speed_tg"' in line:
                    r = json.loads(line)
                    rows.append({"batch": 4, "S": S, "config": cfg,
                                 "speed_tg_tokens_per_s": r["speed_tg"], "t_tg_s": r["t_tg"], "raw": r,
                                 "exit_counters": counters(p.stderr) if sparq else None})

    # -nkvo: the cache in host memory, the weights on the GPU; SparQ's op and dense -fa 0's attention
    # run on the CPU, upstream's -fa 1 copies K and V to the GPU at every step
    for S in args.nkvo_depths:
        base = ["-m", str(model), "-ngl", "99", "-nkvo", "1", "-p", "0", "-n", str(args.n_gen), "-d", str(S),
                "--depth-fill", "synthetic", "-r", str(args.reps), "-t", str(args.threads), "-o", "json", "-v"]
        for args_ in (base + ["-fa", "1", "--sparq", "0,1"] + sp, base + ["-fa", "0"]):
            cmds.append(shlex.join([bench, *args_]))
            try:
                res, _, p = llama_bench(args_, exe=bench, what="failed", timeout=3600, echo=True)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(e, flush=True)
                rows.append({"batch": 1, "S": S, "config": "nkvo", "error": str(e)[-2000:]})
                continue
            for r in res:
                t = (np.array(r["samples_ns"], float) / 1e9 / args.n_gen).tolist()
                fa = "dense_fa1" if int(r.get("flash_attn", r.get("fa", 1)) or 0) else "dense_fa0"
                rows.append({"batch": 1, "S": S, "config": ("sparq" if int(r.get("sparq", 0)) else fa) + "_nkvo",
                             "median_ms_per_token": 1e3 * float(np.median(t)), "tokens_per_s": 1.0 / float(np.median(t)),
                             "samples_s_per_token": t, "sparq_calls": r.get("sparq_calls"),
                             "exit_counters": counters(p.stderr)})
    return rows, summary, cmds


def parse_perf(text):
    """test-backend-ops perf lines: name(vars): runs - us/run - ..."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*(\w+)\((.*)\):\s+(\d+) runs -\s+([\d.]+) us/run", line)
        if m:
            kv = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,]*)", m.group(2)))
            out.append({"op": m.group(1), "vars": kv, "us_per_run": float(m.group(4))})
    return out


def op(args, meta):
    exe = str(tool_path("test-backend-ops"))
    env = dict(os.environ, SPARQ_PERF_GPU="1")
    cmds, res = [], []
    # upstream's own flash-attention perf cases are many: only the shapes ours are set against
    fa_shapes = r"hsk=128,hsv=128,nh=32,nr23=\[1,(1|8)\],kv=(4096|16384|65536|262144),nb=1,mask=1,"
    env.pop("LLAMA_SPARQ_CUDA_SELECT", None)
    env.pop("LLAMA_SPARQ_CUDA_ATTEND", None)
    for o, extra in (("SPARQ_ATTN", []), ("FLASH_ATTN_EXT", ["-p", fa_shapes])):
        cmd = [exe, "perf", "-b", "CUDA0", "-o", o] + extra
        p = run_tool(cmd, what="failed", env=env, timeout=7200, echo=True)
        cmds.append("SPARQ_PERF_GPU=1 " + shlex.join(cmd))
        res += parse_perf(p.stdout)
    # the selection's other way on the same cases: radix passes over each list everywhere (the
    # default ranks the cells of the bin at the k-th key in shared memory), so each row shows both,
    # and the attend stage's: one block per (row, KV head) everywhere (the default splits each
    # one's cells over several blocks while there are few of them, as at batch 1)
    alt = {}
    for on, var, val in ((args.select_ab, "LLAMA_SPARQ_CUDA_SELECT", "radix"),
                         (args.attend_ab, "LLAMA_SPARQ_CUDA_ATTEND", "single")):
        if not on:
            continue
        cmd = [exe, "perf", "-b", "CUDA0", "-o", "SPARQ_ATTN"]
        p = run_tool(cmd, what="failed", env=dict(env, **{var: val}), timeout=7200, echo=True)
        cmds.append(f"SPARQ_PERF_GPU=1 {var}={val} " + shlex.join(cmd))
        alt[val] = {tuple(sorted(r["vars"].items())): r["us_per_run"] for r in parse_perf(p.stdout)}
    radix, single = alt.get("radix", {}), alt.get("single", {})
    fa = {}
    for r in res:
        v = r["vars"]
        if r["op"] == "FLASH_ATTN_EXT" and v.get("hsk") == "128" and v.get("nh") == "32" and v.get("nb") == "1":
            ns = int(v.get("nr23", "[1,1]").strip("[]").split(",")[-1]) if "nr23" in v else 1
            fa[(int(v["kv"]), ns)] = r["us_per_run"]
    rows = []
    for r in res:
        if r["op"] != "SPARQ_ATTN":
            continue
        v = r["vars"]
        S, ns, rr, k = int(v["kv"]), int(v["ns"]), int(v["r"]), int(v["k"])
        if v.get("nh") != "32" or v.get("d") != "128":
            continue
        dense_us = fa.get((S, ns))
        ratio = cost.compression(S, 128, rr, k)
        sp = dense_us / r["us_per_run"] if dense_us else None
        # bytes each op must read (the cost model: K^T's r rows, k rows of K and V, per KV head and sequence)
        b_sp = ns * float(cost.bytes_moved(S, 128, rr, k, 2, 32))
        b_fa = ns * float(cost.bytes_moved(S, 128, rr, k, 2, 32, sparq=False))
        rows.append({"S": S, "batch": ns, "r": rr, "k": k, "calibrated": float(v.get("cov_p", "0") or 0) > 0,
                     "sparq_us": r["us_per_run"], "flash_attn_us": dense_us,
                     "sparq_us_radix_select": radix.get(tuple(sorted(v.items()))),
                     "sparq_us_single_attend": single.get(tuple(sorted(v.items()))),
                     "speedup": sp, "compression": ratio, "bound": 1.0 / ratio,
                     "fraction_of_bound": sp * ratio if sp else None,
                     "sparq_GBps": b_sp / (r["us_per_run"] * 1e3), "flash_attn_GBps": b_fa / (dense_us * 1e3) if dense_us else None})
    return rows, cmds


def write(tag, meta, rows, extra=None):
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": rows, **(extra or {})}
    write_json(OUT / f"gpu_{tag}.json", doc)
    flat = [{k: v for k, v in r.items() if not isinstance(v, (list, dict))} for r in rows]
    cols = sorted({k for r in flat for k in r})
    comments = [f"{k}: {meta.get(k)}" for k in ("device", "commit", "date")]
    comments += [f"command: {c}" for c in meta.get("commands", [])]
    write_csv(OUT / f"gpu_{tag}.csv", comments, cols, ([r.get(c, "") for c in cols] for r in flat))
    print(f"wrote {OUT / f'gpu_{tag}.json'} and .csv")


def _fmt(x, nd=2):
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def report(tag) -> None:
    """bench/results/gpu_{e2e,op}_<tag>.json -> gpu_<tag>.md (tables) and gpu_<tag>.png (plots)."""
    e2e_p, op_p = OUT / f"gpu_e2e_{tag}.json", OUT / f"gpu_op_{tag}.json"
    e = json.loads(e2e_p.read_text()) if e2e_p.exists() else None
    o = json.loads(op_p.read_text()) if op_p.exists() else None
    meta = (e or o)["meta"]
    lines = [f"# SparQ on the GPU ({tag})", "",
             f"- device: {meta['device']['gpu']}", f"- commit: {meta['commit']}", f"- date: {meta['date']}",
             f"- command: `{meta['argv']}`",
             f"- SparQ: r = {meta['sparq']['r']}, k = {meta['sparq']['k']}, l = {meta['sparq']['l']}, "
             f"basis {meta['sparq']['basis']}, dense threshold 0"]
    if meta.get("cuda_env"):
        lines.append("- the CUDA op's launch set from the environment: "
                     + ", ".join(f"`{k}={v}`" for k, v in sorted(meta["cuda_env"].items())))
    lines.append("")
    if e and e.get("summary"):
        fit = e["meta"].get("fit_dense_fa1", {})
        lines += ["## End to end, batch 1 (llama-bench, paper-shape model: Llama 2 7B per-layer shapes, "
                  f"{e['meta'].get('n_layer', 8)} layers, Q8_0 weights, F16 cache, all on the GPU)", "",
                  f"Appendix D fit of dense `-fa 1`: y(S) = {fit.get('a', 0) * 1e9:.3f} ns * S + {fit.get('b', 0) * 1e3:.3f} ms per token.", "",
                  "| S | dense -fa 1 ms | dense -fa 0 ms | SparQ ms | speedup vs -fa 1 | vs best dense | z(S) | compression | Amdahl bound | SparQ calls (on GPU) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in e["summary"]:
            c = r.get("sparq_counters") or {}
            calls = f"{c.get('sparq_calls', '-')} ({c.get('sparq_calls_gpu', '-')})" if c else "-"
            if c.get("diffuse_calls") or c.get("reported_calls"):
                # the calibrated k: its dense stretches (upstream's attention) and the op's reports
                calls += (f"; dense {c.get('dense_calls', '-')}, diffuse {c.get('diffuse_calls', 0)}, "
                          f"reported {c.get('reported_calls', 0)}")
            lines.append(f"| {r['S']} | {_fmt(r['dense_fa1_ms'], 3)} | {_fmt(r['dense_fa0_ms'], 3)} | {_fmt(r['sparq_ms'], 3)} | "
                         f"{_fmt(r['speedup_vs_fa1'])} | {_fmt(r['speedup_vs_best_dense'])} | {_fmt(r['z'], 3)} | "
                         f"{_fmt(r['compression'], 3)} | {_fmt(r['amdahl_bound'])} | {calls} |")
    if e:
        b4 = [r for r in e["rows"] if r.get("batch") == 4 and "error" not in r]
        if b4:
            lines += ["", "## End to end, batch 4 (llama-batched-bench: 4 sequences, each its own stream, real prefill of S)", "",
                      "| S | dense `-fa 1` tokens/s | dense `-fa 0` tokens/s | SparQ tokens/s | speedup vs `-fa 1` | "
                      "vs the faster dense | SparQ calls (on GPU) |", "|---|---|---|---|---|---|---|"]
            missing_fa0 = False
            for S in sorted({r["S"] for r in b4}):
                tps = {cfg: next((r["speed_tg_tokens_per_s"] for r in b4 if r["S"] == S and r["config"] == cfg), None)
                       for cfg in ("dense_fa1", "dense_fa0", "sparq")}
                q = next((r for r in b4 if r["S"] == S and r["config"] == "sparq"), None)
                c = (q or {}).get("exit_counters") or {}
                dense = [t for cfg, t in tps.items() if cfg != "sparq" and t]
                missing_fa0 = missing_fa0 or tps["dense_fa0"] is None
                sp1 = tps["sparq"] / tps["dense_fa1"] if tps["sparq"] and tps["dense_fa1"] else None
                spb = tps["sparq"] / max(dense) if tps["sparq"] and dense else None
                lines.append(f"| {S} | {_fmt(tps['dense_fa1'], 1)} | {_fmt(tps['dense_fa0'], 1)} | {_fmt(tps['sparq'], 1)} | "
                             f"{_fmt(sp1)} | {_fmt(spb)} | {c.get('sparq_calls', '-')} ({c.get('sparq_calls_gpu', '-')}) |")
            if missing_fa0:
                lines += ["", "Dense `-fa 0` was not run at batch 4 here (the sweep added it after this run): the "
                          "speed-up over the faster dense path is over `-fa 1` alone. The cache is F16: SparQ's CUDA "
                          "op does not take a q8_0 cache, so no q8_0 row."]
        nk = [r for r in e["rows"] if str(r.get("config", "")).endswith("_nkvo")]
        if nk:
            lines += ["", "## -nkvo (weights on the GPU, cache in host memory; SparQ and dense `-fa 0` attend on the "
                      "CPU, upstream's `-fa 1` copies K and V to the GPU at every step)", "",
                      "| S | dense `-fa 1` tokens/s | dense `-fa 0` tokens/s | SparQ tokens/s | speedup over the faster dense | "
                      "SparQ calls (on GPU) |", "|---|---|---|---|---|---|"]
            for S in sorted({r["S"] for r in nk}):
                d1 = next((r for r in nk if r["S"] == S and r["config"] == "dense_fa1_nkvo"), None)
                d0 = next((r for r in nk if r["S"] == S and r["config"] == "dense_fa0_nkvo"), None)
                q = next((r for r in nk if r["S"] == S and r["config"] == "sparq_nkvo"), None)
                if q and (d1 or d0):
                    c = q.get("exit_counters") or {}
                    best = max(r["tokens_per_s"] for r in (d1, d0) if r)
                    lines.append(f"| {S} | {_fmt(d1 and d1['tokens_per_s'], 1)} | {_fmt(d0 and d0['tokens_per_s'], 1)} | "
                                 f"{_fmt(q['tokens_per_s'], 1)} | {_fmt(q['tokens_per_s'] / best)} | "
                                 f"{c.get('sparq_calls', '-')} ({c.get('sparq_calls_gpu', '-')}) |")
        errs = [r for r in e["rows"] if "error" in r]
        if errs:
            lines += ["", "Failed runs: " + "; ".join(f"{r['config']} at S = {r['S']}" for r in errs)]
    if o:
        lines += ["", "## The op against CUDA flash attention (test-backend-ops perf, Llama 2 7B attention: 32 heads of 128, F16)", "",
                  "| commit | S | batch | r | k | SparQ us | SparQ us, select by radix passes | SparQ us, one attend block per unit | flash attn us | speedup | bound M_dense/M_sparq | fraction of bound | SparQ GB/s | flash attn GB/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(o["rows"], key=lambda r: (r["batch"], r["S"], r["r"], r["k"], r.get("commit", ""))):
            kcol = f"{r['k']} (calibrated: its cap; bound and fraction by the cap)" if r.get("calibrated") else r["k"]
            lines.append(f"| {r.get('commit', str(o['meta']['commit'])[:12])} | {r['S']} | {r['batch']} | {r['r']} | {kcol} | {_fmt(r['sparq_us'], 1)} | {_fmt(r.get('sparq_us_radix_select'), 1)} | {_fmt(r.get('sparq_us_single_attend'), 1)} | {_fmt(r['flash_attn_us'], 1)} | "
                         f"{_fmt(r['speedup'])} | {_fmt(r['bound'])} | {_fmt(r['fraction_of_bound'])} | "
                         f"{_fmt(r.get('sparq_GBps'), 0)} | {_fmt(r.get('flash_attn_GBps'), 0)} |")
    (OUT / f"gpu_{tag}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT / f'gpu_{tag}.md'}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(1, 3 if o else 2, figsize=(15 if o else 10, 4))
    if e and e.get("summary"):
        sm = [r for r in e["summary"]]
        S = [r["S"] for r in sm]
        for key, lab in (("dense_fa1_ms", "dense -fa 1"), ("dense_fa0_ms", "dense -fa 0"), ("sparq_ms", "SparQ")):
            ax[0].plot(S, [r[key] for r in sm], "o-", label=lab)
        ax[0].set(xscale="symlog", xlabel="context S", ylabel="ms per token", title="decode, batch 1")
        ax[0].legend()
        ax[1].plot(S, [r["speedup_vs_fa1"] or np.nan for r in sm], "o-", label="SparQ / dense -fa 1")
        ax[1].plot(S, [r["amdahl_bound"] for r in sm], "--", label="Amdahl bound")
        ax[1].plot(S, [r["z"] for r in sm], ":", label="z(S): attention share")
        ax[1].set(xscale="symlog", xlabel="context S", title="speedup and bound")
        ax[1].legend()
    if o:
        for ns in sorted({r["batch"] for r in o["rows"]}):
            rr = sorted((r for r in o["rows"] if r["batch"] == ns and r["r"] == 32 and r["k"] == 128), key=lambda r: r["S"])
            ax[-1].plot([r["S"] for r in rr], [r["speedup"] or np.nan for r in rr], "o-", label=f"op speedup, batch {ns}")
            ax[-1].plot([r["S"] for r in rr], [r["bound"] for r in rr], "--", label=f"bound, batch {ns}")
        ax[-1].set(xscale="log", xlabel="S", title="op vs CUDA flash attention (r=32, k=128)")
        ax[-1].legend()
    fig.suptitle(f"{meta['device']['gpu']} - commit {meta['commit'][:12]}")
    fig.tight_layout()
    fig.savefig(OUT / f"gpu_{tag}.png", dpi=110)
    print(f"wrote {OUT / f'gpu_{tag}.png'}")


def sweep_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=SWEEP_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("e2e", "op"), default=None)
    ap.add_argument("--n-layer", type=int, default=8, help="layers of the paper-shape model (default 8: per layer the 7B model's weights-to-cache ratio)")
    ap.add_argument("--depths", default="0,1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--depths-batch", default="4096,16384,32768,65536", help="batch-4 depths (real prefill)")
    ap.add_argument("--nkvo-depths", default="16384,65536", help="-nkvo depths (cache and attention on the CPU)")
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=16, help="CPU threads for -nkvo")
    ap.add_argument("--r", type=int, default=32, help="components kept (default 32; 0: the fork's default for "
                    "--kt-bits at head size 128)")
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    add_kt_bits(ap)
    ap.add_argument("--basis", default="model", help="the paper's basis (default), or scaled/pca")
    ap.add_argument("--topk-buckets", type=int, default=0, help="SparQ's approximate bucketed top-k with this many "
                    "buckets (>= k; 0, the default: the exact top-k)")
    ap.add_argument("--tag", default="h100")
    ap.add_argument("--no-attend-ab", dest="attend_ab", action="store_false",
                    help="op: skip the SPARQ_ATTN run with one attend block per unit (LLAMA_SPARQ_CUDA_ATTEND=single)")
    ap.add_argument("--no-select-ab", dest="select_ab", action="store_false",
                    help="op: skip the second SPARQ_ATTN run with the select's radix passes forced (LLAMA_SPARQ_CUDA_SELECT=radix)")
    ap.add_argument("--report", action="store_true", help="only write gpu_<tag>.md and .png from the result files")
    args = ap.parse_args(argv)
    if args.report:
        report(args.tag)
        return 0
    args.r = resolve_r(args.r, args.kt_bits)
    args.depths = [int(x) for x in args.depths.split(",") if x]
    args.depths_batch = [int(x) for x in args.depths_batch.split(",") if x]
    args.nkvo_depths = [int(x) for x in args.nkvo_depths.split(",") if x]

    meta = {"device": device(), "commit": git_commit(), "date": now_iso(timespec="auto"), "n_layer": args.n_layer,
            "argv": command_line(), "sparq": {"r": args.r, "k": args.k, "l": args.l,
                                                                       "kt_bits": args.kt_bits, "basis": args.basis,
                                                                       "topk_buckets": args.topk_buckets},
            "cuda_env": cuda_env()}
    if args.only in (None, "e2e"):
        me = dict(meta)
        rows, summary, cmds = e2e(args, me)
        m = dict(me, commands=cmds)
        write(f"e2e_{args.tag}", m, rows, {"summary": summary})
        for s in summary:
            print(s)
    if args.only in (None, "op"):
        rows, cmds = op(args, meta)
        write(f"op_{args.tag}", dict(meta, commands=cmds), rows)
        for r in rows:
            print(r)
    try:
        report(args.tag)
    except Exception as e:  # the result files are written; the report can be made again with --report
        print(f"gpu.py sweep: report failed: {e}")
    return 0

# ============================================================================================= timeline

TIMELINE_DOC = """Where a GPU decode step's time goes, dense and SparQ: a CUDA trace of llama-bench's decode steps.

Needs an NVIDIA GPU, the CUDA build and a tracer: Nsight Systems (``nsys``, ``--nsys PATH`` or on
PATH) or, where it is missing (the borrowed GPU machines have only Nsight Compute), this
project's CUPTI tracer ``bench/cupti/sparq_cupti_trace.cpp`` (``--cupti-lib``, built into
``build/gpu-wheel/`` by ``make gpu-wheel``; loaded through ``CUDA_INJECTION64_PATH``), which
writes the same three summaries ``nsys stats`` does plus the GPU's busy time:

    .venv/bin/python bench/gpu.py timeline --tag h100_0123abc     # 4K and 64K, dense -fa 1 and SparQ

For each depth S and configuration (dense ``-fa 1``; SparQ at the paper's fixed k; SparQ with the
calibrated k) it profiles ``llama-bench -p 0 -n N -d S --depth-fill synthetic`` on the paper-shape
model (Llama 2 7B per-layer shapes, 8 layers, Q8_0 weights, F16 cache, ``-ngl 99``) twice, with
N = ``--n-short`` and ``--n-long`` decode steps, under ``nsys profile -t cuda --cuda-graph-trace=node``
(kernels inside CUDA graphs traced one by one) or the CUPTI tracer. ``nsys stats`` (or the tracer) gives the totals per kernel name
(``cuda_gpu_kern_sum``), per CUDA API call (``cuda_api_sum``) and per copy (``cuda_gpu_mem_time_sum``);
the long run's totals less the short run's, over the extra steps, are what one decode step does:
the model load, the synthetic fill and the warm-up cancel out. Reduced per step and per layer:

- every kernel with its time and launches, grouped as the SparQ op (``k_sparq_*``), attention
  (flash attention, soft max), the weights' products and everything else;
- what SparQ adds beside the op: each kernel whose time or count per step is above dense's;
- launches per layer and step, copies per step, and the CUDA API per step: ``cudaGraphLaunch``
  against ``cudaLaunchKernel`` says whether ggml's CUDA graphs captured the step (a captured
  step launches its kernels from the graph), ``cudaGraphInstantiate`` / ``cudaGraphExecUpdate``
  / ``cudaStreamBeginCapture`` whether the graph was rebuilt, ``cudaStreamSynchronize`` and
  ``cudaMemcpy*`` the host synchronisations and copies;
- with the CUPTI tracer, the wall time of a step (llama-bench's) against the GPU's busy time
  (the union of the kernels' intervals): the difference is time no kernel ran (launch gaps,
  copies, synchronisations, host work).

Result: gpu_timeline_<tag>.{json,md} under bench/results/, with the device, the commit and every command.
``--reduce DIR`` only reduces the stats CSVs already in DIR (the tests use it).
"""


from gpu_reports import REPORTS, timeline_markdown, timeline_reduce_dir  # noqa: E402,F401

def timeline_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=TIMELINE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="4096,65536")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-short", type=int, default=4)
    ap.add_argument("--n-long", type=int, default=20)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    add_kt_bits(ap)
    ap.add_argument("--nsys", default=None, help="the nsys executable (default: on PATH or under /usr/local/cuda, /opt/nvidia)")
    ap.add_argument("--tracer", choices=("auto", "nsys", "cupti"), default="auto",
                    help="auto (default): nsys where found, else the CUPTI tracer")
    ap.add_argument("--cupti-lib", default="build/gpu-wheel/libsparq_cupti_trace.so",
                    help="the CUPTI tracer library (make gpu-wheel builds it next to the wheel)")
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--work", default=None, help="where the reports and stats go (default build/gpu-timeline/<tag>)")
    ap.add_argument("--reduce", default=None, help="only reduce the stats CSVs in this folder")
    args = ap.parse_args(argv)
    steps = args.n_long - args.n_short
    if steps <= 0:
        ap.error("--n-long must be larger than --n-short")
    sp = {"r": args.r, "k": args.k, "l": args.l, "kt_bits": args.kt_bits, "basis": "model", "min_kv": 0}
    if args.reduce:
        res = timeline_reduce_dir(Path(args.reduce), args.n_layer, steps)
        meta = {"tag": args.tag, "n_short": args.n_short, "n_long": args.n_long, "sparq": sp, "commands": []}
        print(timeline_markdown(meta, res, args.n_layer))
        return 0 if res else 1

    nsys = args.nsys or shutil.which("nsys") or next(
        (str(p) for p in sorted(Path("/opt/nvidia").glob("nsight-systems*/*/bin/nsys")) + [Path("/usr/local/cuda/bin/nsys")]
         if Path(p).is_file()), None)
    tracer = args.tracer if args.tracer != "auto" else ("nsys" if nsys else "cupti")
    cupti = Path(args.cupti_lib).resolve()
    if tracer == "nsys" and not nsys:
        sys.exit("gpu.py timeline: no nsys (Nsight Systems) found: give --nsys PATH, or --tracer cupti")
    if tracer == "cupti" and not cupti.is_file():
        sys.exit(f"gpu.py timeline: no CUPTI tracer at {cupti} (--cupti-lib; 'make gpu-wheel' builds it)"
                 + ("" if args.tracer == "cupti" else " and no nsys (Nsight Systems; --nsys PATH)"))

    from llama_sparq import tool_path
    from sparq_lab.models import paper_shape_path

    work = Path(args.work or f"build/gpu-timeline/{args.tag}")
    work.mkdir(parents=True, exist_ok=True)
    model = paper_shape_path(args.n_layer)
    bench = str(tool_path("llama-bench"))
    kt = ["--sparq-kt-bits", str(args.kt_bits)]
    fixed = ["--sparq", "1", "--sparq-r", str(args.r), "--sparq-k", str(args.k), "--sparq-l", str(args.l),
             "--sparq-basis", "model", "--sparq-min-kv", "0"] + kt
    configs = {"dense_fa1": ["--sparq", "0"], "sparq": fixed,
               "sparq_calibrated": ["--sparq", "1", "--sparq-r", str(args.r), "--sparq-k", "0", "--sparq-min-kv", "0"] + kt}
    meta = {"tag": args.tag, "device": device(), "commit": git_commit(), "date": now_iso(timespec="auto"),
            "argv": command_line(), "n_short": args.n_short, "n_long": args.n_long, "sparq": sp, "commands": [],
            "tracer": (subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip()
                       if tracer == "nsys" else f"CUPTI ({cupti.name})")}
    for S in [int(x) for x in args.depths.split(",") if x]:
        for cfg, extra in configs.items():
            for which, n in (("short", args.n_short), ("long", args.n_long)):
                rep = work / f"{cfg}_{S}_{which}"
                bargs = ["-m", str(model), "-ngl", "99", "-fa", "1", "-p", "0", "-n", str(n), "-d", str(S),
                         "--depth-fill", "synthetic", "-r", "1", "-o", "json", "-v", *extra]
                env, prefix = None, []
                if tracer == "nsys":
                    prefix = [nsys, "profile", "-t", "cuda", "--cuda-graph-trace=node", "--force-overwrite", "true",
                              "-o", str(rep)]
                else:
                    env = dict(os.environ, CUDA_INJECTION64_PATH=str(cupti), SPARQ_TRACE_PREFIX=str(rep))
                line = shlex.join([*prefix, bench, *bargs])
                meta["commands"].append(line if env is None else
                                        f"CUDA_INJECTION64_PATH={cupti} SPARQ_TRACE_PREFIX={rep} {line}")
                try:
                    _, _, p = llama_bench(bargs, exe=bench, prefix=prefix, what="failed", env=env, timeout=900,
                                          echo=True)
                    (work / f"{cfg}_{S}_{which}_bench.json").write_text(p.stdout[p.stdout.find("["):] if "[" in p.stdout else "")
                    if tracer == "nsys":
                        st = [nsys, "stats", "-r", ",".join(REPORTS), "-f", "csv", "--force-export", "true", "-o", str(rep),
                              f"{rep}.nsys-rep"]
                        meta["commands"].append(shlex.join(st))
                        run_tool(st, what="failed", timeout=900, echo=True)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # recorded; the others go on
                    print(e, flush=True)
                    meta.setdefault("errors", []).append(f"{cfg} S={S} n={n}: {str(e)[-500:]}")
    res = timeline_reduce_dir(work, args.n_layer, steps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"gpu_timeline_{args.tag}.json", {"meta": meta, "results": res})
    (RESULTS / f"gpu_timeline_{args.tag}.md").write_text(timeline_markdown(meta, res, args.n_layer))
    print(f"wrote {RESULTS / f'gpu_timeline_{args.tag}.md'}")
    return 0

# ============================================================================================= lines

LINES_DOC = """Where SparQ's CUDA kernels spend their time, line by line, inside a real decode step.

Needs an NVIDIA GPU, the CUDA build (whose kernels carry line tables: ``-lineinfo``) and Nsight
Compute (``ncu``, ``--ncu PATH`` or on PATH or under /usr/local/cuda/bin). For each depth S it
profiles one launch of each of the op's kernels in llama-bench's decode on the paper-shape model
(Llama 2 7B per-layer shapes, 8 layers, Q8_0 weights, F16 cache, ``-ngl 99``, the synthetic fill,
the paper's fixed k), after the first ``--skip-steps`` steps:

    ncu -k 'regex:k_sparq_(score|select|attend)' --launch-skip N --launch-count 3 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SourceCounters --import-source yes \
        -o sel_S llama-bench ... -d S
    ncu -i sel_S.ncu-rep --page details --csv          (duration, SMs active, occupancy)
    ncu -i sel_S.ncu-rep --page source --csv --print-source cuda,sass   (warp samples per source line)

and reduces them to gpu_ncu_lines_<tag>.md (and .json) under bench/results: per kernel its duration, the
share of cycles its SMs were active, registers, occupancy, and the source lines where most warps
were sampled. Unlike ``test-backend-ops perf`` (whose tie-proof inputs put thousands of cells in
the select's crossing bin), these are the scores of a decode step. ``--reduce DIR`` only reduces
the CSVs already in DIR (the tests use it).
"""


from gpu_reports import lines_markdown, lines_reduce_dir  # noqa: E402,F401

def lines_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=LINES_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="4096,65536")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--skip-steps", type=int, default=2, help="decode steps before the profiled one")
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    add_kt_bits(ap)
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--work", default=None, help="where the reports and CSVs go (default build/gpu-ncu/<tag>)")
    ap.add_argument("--reduce", default=None, help="only reduce details_<S>.csv and source_<S>.csv in this folder")
    args = ap.parse_args(argv)
    sp = {"r": args.r, "k": args.k, "l": args.l, "kt_bits": args.kt_bits, "basis": "model", "min_kv": 0}
    if args.reduce:
        res = lines_reduce_dir(Path(args.reduce))
        print(lines_markdown({"tag": args.tag, "sparq": sp}, res))
        return 0 if res else 1
    ncu = args.ncu or shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if Path("/usr/local/cuda/bin/ncu").is_file() else None)
    if not ncu:
        sys.exit("gpu.py lines: no ncu (Nsight Compute) found: give --ncu PATH")

    from llama_sparq import tool_path
    from sparq_lab.models import paper_shape_path

    work = Path(args.work or f"build/gpu-ncu/{args.tag}")
    work.mkdir(parents=True, exist_ok=True)
    model, bench = paper_shape_path(args.n_layer), str(tool_path("llama-bench"))
    meta = {"tag": args.tag, "device": device(), "commit": git_commit(), "date": now_iso(timespec="auto"),
            "argv": command_line(), "sparq": sp, "commands": [],
            "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]}
    # score, select, attend: one launch each per layer (the op's upkeep kernels, k_sparq_sum_append and
    # k_sparq_kt_append, are left out of the filter so that the skip counts steps)
    n_kernels = 3
    for S in [int(x) for x in args.depths.split(",") if x]:
        rep = work / f"rep_{S}"
        prefix = [ncu, "-k", "regex:k_sparq_(score|select|attend)", "--launch-skip",
                  str(n_kernels * args.n_layer * args.skip_steps), "--launch-count", str(n_kernels), "--section",
                  "SpeedOfLight", "--section", "Occupancy", "--section", "LaunchStats", "--section", "WarpStateStats",
                  "--section", "SourceCounters", "--import-source", "yes", "-f", "-o", str(rep)]
        _, line, _ = llama_bench(["-m", str(model), "-ngl", "99", "-fa", "1", "-p", "0",
                                  "-n", str(args.skip_steps + 2), "-r", "1", "-d", str(S), "--depth-fill", "synthetic",
                                  "--sparq", "1", "--sparq-r", str(args.r), "--sparq-k", str(args.k), "--sparq-l",
                                  str(args.l), "--sparq-basis", "model", "--sparq-min-kv", "0",
                                  "--sparq-kt-bits", str(args.kt_bits)],
                                 exe=bench, prefix=prefix, what="failed", timeout=900, echo=True)
        meta["commands"].append(line)
        for page, extra in (("details", []), ("source", ["--print-source", "cuda,sass"])):
            q = run_tool([ncu, "-i", f"{rep}.ncu-rep", "--page", page, "--csv", *extra], what="failed", timeout=600,
                         echo=True)
            (work / f"{page}_{S}.csv").write_text(q.stdout)
    res = lines_reduce_dir(work)
    doc = {"meta": meta, "results": res}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"gpu_ncu_lines_{args.tag}.json", doc)
    (RESULTS / f"gpu_ncu_lines_{args.tag}.md").write_text(lines_markdown(meta, res) + "\n")
    print(f"wrote {RESULTS / f'gpu_ncu_lines_{args.tag}.md'}")
    return 0


# ============================================================================================= the subcommands

SUBCOMMANDS = {"sweep": sweep_main, "timeline": timeline_main, "lines": lines_main}


def main(argv=None) -> int:
    return dispatch(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
