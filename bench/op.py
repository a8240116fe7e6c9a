#!/usr/bin/env python3
"""The SparQ op alone, through the native sparq-op-bench (bench/native/sparq-op-bench.cpp):

    python bench/op.py bench [--quick] ...           the op against upstream's CPU flash attention
    python bench/op.py ab --before DIR ...           two builds of the op timed in alternation
    python bench/op.py upkeep ...                    the cache's upkeep and rebuild time against its size

`python bench/op.py SUBCOMMAND -h` lists a subcommand's options.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics as st
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (REPO, RESULTS, command_line, cpu_model, dispatch, git_commit, kernel_isa, loadavg,  # noqa: E402
                      md_bullets, md_table, mem_available, now_iso, op_bench_times, out_stem, pyplot, run_meta,
                      write_csv, write_json)

# bytes of a K^T element by --kt-bits (the cost model's b_t on an f16 cache; 4: a block of 32 in 20 bytes)
KT_BYTES = {16: 2.0, 8: 1.0, 4: 20.0 / 32.0}


# ============================================================================================= bench

BENCH_DOC = """Op microbenchmark sweep: GGML_OP_SPARQ_ATTN against upstream's CPU flash attention.

Drives the native ``sparq-op-bench`` (bench/native/sparq-op-bench.cpp), which times
``ggml_sparq_attn`` and ``ggml_flash_attn_ext`` on the same random f16 K and V (and the
K^T copy for SparQ) on ggml's CPU backend, one decode query row per sequence and one KV
stream per sequence. Shapes are Llama 2 7B attention: 32 heads of 128, MHA (32 KV heads).

For each point: median / IQR / min of the per-repetition times of both ops (run in the same
process, dense first, after 2 warm-up runs each), bytes moved per the cost model of
docs/algorithm.md (``sparq_lab.cost``; f16 = 2 bytes per element, times KV heads, times batch),
achieved GB/s, speedup (dense / SparQ medians), the bandwidth bound M_dense / M_sparq and
the fraction of it reached.

Default sweep (about 5-10 minutes on 2 cores):
  * main config r=32, k=128, l=k/4, batch 1, S in 1K, 4K, 16K, 64K, 128K
  * the r x k grid {16, 32, 64} x {64, 128, 256} (l = k/4) at S = 16K and 64K, batch 1
  * batch 4 at S = 4K and 16K, r=32, k=128
Points whose K + V + K^T f16 bytes exceed 60 % of MemAvailable are skipped with a note.

Writes <tag>.csv, <tag>.json, <tag>.png and <tag>.md into --out-dir (default
bench/results), each carrying the command, machine, commit, date, parameters and ISA.

    python bench/op.py bench                 # the full sweep (make bench-op)
    python bench/op.py bench --quick --out-dir /tmp/opb    # smoke test, ~1 minute
"""


try:
    from llama_sparq import LibraryError, tool_path
    from sparq_lab import cost
except ImportError as e:  # pragma: no cover - depends on the environment
    sys.exit(f"op.py bench: cannot import llama_sparq ({e}); run `make install` and use "
             f"{REPO / '.venv/bin/python'} (or `make bench-op`)")

ELEM_BYTES = 2  # f16 K and V
MAIN_R, MAIN_K = 32, 128
MEM_FRACTION = 0.60

COLUMNS = [
    "S", "batch", "heads", "head_kv", "d", "r", "k", "l", "threads", "reps",
    "dense_us_median", "dense_us_iqr", "sparq_us_median", "sparq_us_iqr",
    "speedup", "compression", "bound", "fraction_of_bound",
    "dense_bytes", "sparq_bytes", "dense_GBps", "sparq_GBps",
    "dense_us_min", "sparq_us_min", "groups",
]


# ----------------------------------------------------------------------------- sweep

def build_points(quick: bool):
    """Ordered list of (S, batch, r, k, groups); duplicate configurations are merged."""
    if quick:
        main_S, grid_S, b4_S = [1024, 4096], [4096], [1024, 4096]
    else:
        main_S, grid_S, b4_S = [1024, 4096, 16384, 65536, 131072], [16384, 65536], [4096, 16384]
    pts: dict[tuple, list[str]] = {}

    def add(S, batch, r, k, group):
        pts.setdefault((S, batch, r, k), [])
        if group not in pts[(S, batch, r, k)]:
            pts[(S, batch, r, k)].append(group)

    for S in main_S:
        add(S, 1, MAIN_R, MAIN_K, "main")
    for S in grid_S:
        for r in (16, 32, 64):
            for k in (64, 128, 256):
                add(S, 1, r, k, "grid")
    for S in b4_S:
        add(S, 4, MAIN_R, MAIN_K, "batch4")
    return [(S, b, r, k, g) for (S, b, r, k), g in pts.items()]


def kv_bytes(S, batch, head_kv, d):
    """f16 bytes of K + V + K^T for one point."""
    return 3 * S * d * head_kv * batch * ELEM_BYTES


# ----------------------------------------------------------------------------- metadata

def make_meta(args, points) -> dict:
    main_S = sorted({S for S, b, r, k, g in points if "main" in g})
    comp_main = {str(S): round(float(cost.compression(S, args.d, MAIN_R, MAIN_K)), 4) for S in main_S}
    return {
        "command": command_line(),
        "machine": {
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "threads": args.threads,
            "mem_available_bytes": mem_available(),
            "loadavg_1min_start": loadavg(),
            "platform": platform.platform(),
        },
        "commit": git_commit(),
        "date": now_iso(local=True),
        "isa": kernel_isa(),
        "program": str(args.exe),
        "shapes": f"{args.heads} query heads, {args.head_kv} KV heads, d = {args.d} "
                  f"(Llama 2 7B attention: MHA)",
        "sparq_params": {
            "main": {"r": MAIN_R, "k": MAIN_K, "l": MAIN_K // 4,
                     "compression_by_S": comp_main,
                     "compression_limit_r_over_2d": MAIN_R / (2 * args.d)},
            "grid": "r in {16, 32, 64} x k in {64, 128, 256}, l = k/4 "
                    "(compression per point in the 'compression' column)",
        },
        "cost_model": "bytes = M (elements per KV head, sparq_lab.cost) * 2 (f16) * head_kv * batch; "
                      "M_dense = 2*S*d + 2*d, M_sparq = S*r + 2*k*d + 4*d; compression = M_sparq/M_dense, "
                      "bound = M_dense/M_sparq",
        "data": "K, V (and K^T) are random f16, q random f32 (a few heavy components); one KV stream "
                "per sequence, every sequence has S valid cells (mask all 0)",
        "timing": f"dense (ggml_flash_attn_ext, F32 accumulation) and SparQ (ggml_sparq_attn) in the same "
                  f"process per point, warmup {args.warmup}, reps {args.reps}; median, IQR (p75 - p25) "
                  f"and min of the per-repetition graph compute times",
        "skipped": [],
        "failed": [],
    }


def meta_lines(meta) -> list[str]:
    m = meta["machine"]
    mp = meta["sparq_params"]["main"]
    comp = ", ".join(f"S={S}: {c:.4g}" for S, c in mp["compression_by_S"].items())
    la = [m.get("loadavg_1min_start"), m.get("loadavg_1min_end")]
    la_s = " / ".join("?" if v is None else f"{v:.2f}" for v in la)
    lines = [
        f"command: {meta['command']}",
        f"machine: {m['cpu']}, {m['cpu_count']} cores (os.cpu_count), {m['threads']} threads used; "
        f"SparQ kernels ISA: {meta['isa']}; 1-min load average at start / end: {la_s}",
        f"commit: {meta['commit']}   date: {meta['date']}",
        f"shapes: {meta['shapes']}",
        f"SparQ bench_main config: r={mp['r']}, k={mp['k']}, l={mp['l']}; compression M_sparq/M_dense: {comp} "
        f"(-> r/2d = {mp['compression_limit_r_over_2d']:.4g})",
        f"grid: {meta['sparq_params']['grid']}",
        f"cost model: {meta['cost_model']}",
        f"data: {meta['data']}",
        f"timing: {meta['timing']}",
    ]
    for s in meta["skipped"]:
        lines.append(f"skipped: {s}")
    for s in meta["failed"]:
        lines.append(f"FAILED: {s}")
    return lines


# ----------------------------------------------------------------------------- running

def run_point(args, S, batch, r, k):
    l = k // 4
    times = op_bench_times(args.exe, S=S, batch=batch, heads=args.heads, head_kv=args.head_kv, d=args.d, r=r, k=k,
                           l=l, threads=args.threads, reps=args.reps, warmup=args.warmup,
                           timeout=args.timeout)

    def stats(t):
        a = np.asarray(t)
        q25, q50, q75 = np.percentile(a, [25, 50, 75])
        return float(q50), float(q75 - q25), float(a.min())

    dm, diqr, dmin = stats(times["dense"])
    sm, siqr, smin = stats(times["sparq"])
    dense_bytes = float(cost.bytes_moved(S, args.d, r, k, ELEM_BYTES, args.head_kv, sparq=False)) * batch
    sparq_bytes = float(cost.bytes_moved(S, args.d, r, k, ELEM_BYTES, args.head_kv, sparq=True)) * batch
    comp = float(cost.compression(S, args.d, r, k))
    bound = float(cost.attention_bound(S, args.d, r, k))
    speedup = dm / sm
    return {
        "S": S, "batch": batch, "heads": args.heads, "head_kv": args.head_kv, "d": args.d,
        "r": r, "k": k, "l": l, "threads": args.threads, "reps": args.reps,
        "dense_us_median": dm, "dense_us_iqr": diqr, "sparq_us_median": sm, "sparq_us_iqr": siqr,
        "speedup": speedup, "compression": comp, "bound": bound, "fraction_of_bound": speedup / bound,
        "dense_bytes": int(round(dense_bytes)), "sparq_bytes": int(round(sparq_bytes)),
        "dense_GBps": dense_bytes / dm / 1e3, "sparq_GBps": sparq_bytes / sm / 1e3,
        "dense_us_min": dmin, "sparq_us_min": smin,
        "dense_times_us": times["dense"], "sparq_times_us": times["sparq"],
    }


# ----------------------------------------------------------------------------- output

def fmt(v, col):
    if isinstance(v, float):
        if col.endswith("_us_median") or col.endswith("_us_iqr") or col.endswith("_us_min"):
            return f"{v:.1f}"
        if col.endswith("GBps"):
            return f"{v:.2f}"
        return f"{v:.4g}"
    if isinstance(v, list):
        return "+".join(v)
    return str(v)


def csv_value(v):
    if isinstance(v, list):
        return "+".join(v)
    if isinstance(v, float):
        return f"{v:.8g}"
    return v


def write_csv_file(path, rows, meta):
    write_csv(path, meta_lines(meta), COLUMNS, ([csv_value(row[c]) for c in COLUMNS] for row in rows))


def write_json_file(path, rows, meta):
    write_json(path, {"meta": meta, "columns": COLUMNS, "rows": rows}, newline=True)


def write_md(path, rows, meta):
    cols = [c for c in COLUMNS if c not in ("heads", "head_kv", "d", "threads", "reps")]
    lines = ["# Op microbenchmark: SparQ attention vs upstream CPU flash attention", ""]
    lines += md_bullets(line.partition(": ")[::2] for line in meta_lines(meta))
    if rows:
        r0 = rows[0]
        lines.append(f"- **columns held fixed**: heads={r0['heads']}, head_kv={r0['head_kv']}, d={r0['d']}, "
                     f"threads={r0['threads']}, reps={r0['reps']}; times in us, bytes per decode step "
                     f"(all heads, all sequences)")
    lines += [""] + md_table(cols, ([fmt(row[c], c) for c in cols] for row in rows))
    Path(path).write_text("\n".join(lines) + "\n")


def write_png(path, rows, meta, d):
    plt = pyplot()
    from matplotlib.lines import Line2D

    footer = []
    for line in meta_lines(meta):
        footer += textwrap.wrap(line, 190, subsequent_indent="    ") or [""]
    plot_h, foot_h = 5.6, 0.35 + 0.125 * len(footer)  # inches
    H = plot_h + foot_h
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, H))
    fig.subplots_adjust(left=0.06, right=0.98, top=1 - 0.75 / H, bottom=(foot_h + 0.6) / H, wspace=0.22)

    # panel 1: speedup vs S, bench_main config, with the bound
    bench_main = sorted((r for r in rows if "main" in r["groups"]), key=lambda r: r["S"])
    b4 = sorted((r for r in rows if "batch4" in r["groups"]), key=lambda r: r["S"])
    allS = [r["S"] for r in bench_main + b4]
    if allS:
        Sc = np.geomspace(min(allS) / 1.3, max(allS) * 1.3, 200)
        ax1.plot(Sc, cost.attention_bound(Sc, d, MAIN_R, MAIN_K), "k--", lw=1.3,
                 label=f"bound M_dense/M_sparq (r={MAIN_R}, k={MAIN_K})")
        ax1.axhline(2 * d / MAIN_R, color="grey", ls=":", lw=1, label=f"limit 2d/r = {2 * d / MAIN_R:g}")
    ytop = 1.12 * max([2 * d / MAIN_R] + [r["speedup"] for r in bench_main + b4])
    if bench_main:
        ax1.plot([r["S"] for r in bench_main], [r["speedup"] for r in bench_main], "o-", color="C0", ms=7,
                 label=f"measured, batch 1 (r={MAIN_R}, k={MAIN_K}, l={MAIN_K // 4})")
        for r in bench_main:
            low = r["speedup"] < 0.15 * ytop  # near the x axis: label above the point
            ax1.annotate(f"{r['speedup']:.2f}x\n({r['fraction_of_bound']:.0%} of bound)", (r["S"], r["speedup"]),
                         textcoords="offset points", xytext=(0, 8 if low else -10), ha="center",
                         va="bottom" if low else "top", fontsize=8, color="C0")
    if b4:
        ax1.plot([r["S"] for r in b4], [r["speedup"] for r in b4], "s", color="C3", ms=8,
                 label="measured, batch 4 (same r, k)")
        for r in b4:
            ax1.annotate(f"{r['speedup']:.2f}x", (r["S"], r["speedup"]), textcoords="offset points",
                         xytext=(9, 6), fontsize=8, color="C3")
    ax1.set_xscale("log", base=2)
    if allS:
        ticks = sorted(set(allS))
        ax1.set_xticks(ticks)
        ax1.set_xticklabels([f"{s // 1024}K" if s >= 1024 else str(s) for s in ticks])
    ax1.set_ylim(0, ytop)
    ax1.set_xlabel("S (KV length per sequence, log2 scale)")
    ax1.set_ylabel("speedup  (dense median / SparQ median)")
    ax1.set_title("Speedup vs S, batch 1 and 4")
    ax1.grid(True, which="major", alpha=0.3)
    ax1.legend(loc="best", fontsize=8)

    # panel 2: speedup vs bound for the r x k grid
    grid = [r for r in rows if "grid" in r["groups"]]
    gridS = sorted({r["S"] for r in grid})
    fills = {S: i for i, S in enumerate(gridS)}
    markers = {64: "o", 128: "s", 256: "^"}
    colors = {16: "C0", 32: "C1", 64: "C2"}
    for r in grid:
        filled = fills[r["S"]] == len(gridS) - 1
        c = colors.get(r["r"], "k")
        ax2.plot(r["bound"], r["speedup"], markers.get(r["k"], "D"), ms=8, mec=c,
                 mfc=c if filled else "none", mew=1.6)
    if grid:
        hi = max(max(r["bound"] for r in grid), max(r["speedup"] for r in grid)) * 1.08
        xs = np.array([0, hi])
        ax2.plot(xs, xs, "k--", lw=1.2)
        for frac in (0.5, 0.25):
            ax2.plot(xs, frac * xs, ":", color="grey", lw=1)
            ax2.annotate(f"{frac:.0%} of bound", (hi * 0.97, frac * hi * 0.97), fontsize=7, color="grey",
                         ha="right", va="bottom")
        ax2.set_xlim(0, hi)
        ax2.set_ylim(0, hi)
    handles = [Line2D([], [], ls="--", color="k", label="speedup = bound")]
    handles += [Line2D([], [], ls="", marker="o", color=c, ms=8, label=f"r = {rr}") for rr, c in colors.items()]
    handles += [Line2D([], [], ls="", marker=m, color="k", mfc="none", ms=8, label=f"k = {kk} (l = {kk // 4})")
                for kk, m in markers.items()]
    for S in gridS:
        filled = fills[S] == len(gridS) - 1
        handles.append(Line2D([], [], ls="", marker="o", color="k", mfc="k" if filled else "none", ms=8,
                              label=f"S = {S} ({'filled' if filled else 'hollow'})"))
    ax2.legend(handles=handles, loc="best", fontsize=8)
    ax2.set_xlabel("bound M_dense / M_sparq (cost model)")
    ax2.set_ylabel("measured speedup")
    ax2.set_title("r x k grid, batch 1: speedup vs bound")
    ax2.grid(True, alpha=0.3)

    fig.suptitle(f"GGML_OP_SPARQ_ATTN vs ggml_flash_attn_ext (CPU, f16 K/V), "
                 f"{meta['machine']['threads']} threads, {meta['shapes']}", fontsize=11, y=1 - 0.15 / H)
    fig.text(0.01, 0.01, "\n".join(footer), fontsize=7, family="monospace", va="bottom", ha="left")
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- bench_main

def bench_main(argv=None):
    ap = argparse.ArgumentParser(description=BENCH_DOC.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sweep for smoke tests (S 1024 and 4096, reps 3)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per op (default 10; 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs per op before timing (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="ggml CPU threads (default 2)")
    ap.add_argument("--heads", type=int, default=32, help="query heads (default 32, Llama 2 7B)")
    ap.add_argument("--head-kv", type=int, default=32, help="KV heads (default 32: MHA)")
    ap.add_argument("--d", type=int, default=128, help="head size (default 128)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS,
                    help="where the results go (default bench/results)")
    ap.add_argument("--tag", default="op_bench", help="file name stem (default op_bench)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per point (default 900)")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 3 if args.quick else 10
    for name in ("reps", "threads", "heads", "head_kv", "d"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.heads % args.head_kv:
        ap.error("--heads must be a multiple of --head-kv")

    try:
        args.exe = tool_path("sparq-op-bench")
    except LibraryError as e:
        sys.exit(f"op.py bench: the benchmark program sparq-op-bench is missing ({e}).\n"
                 f"Run `make install` in {REPO} (it builds and installs the fork's programs), then retry.")

    from tqdm import tqdm

    points = build_points(args.quick)
    meta = make_meta(args, points)
    print(f"op.py bench: {len(points)} points, {args.threads} threads, reps {args.reps}, "
          f"ISA {meta['isa']}, commit {meta['commit']}", flush=True)

    la = meta["machine"]["loadavg_1min_start"]
    if la is not None and la > 0.5:
        print(f"op.py bench: note: the 1-minute load average is {la:.2f}; other processes on this "
              f"{os.cpu_count()}-core machine will disturb the timings", flush=True)

    rows = []
    bar = tqdm(points, unit="point", dynamic_ncols=True)
    for S, batch, r, k, groups in bar:
        bar.set_description(f"S={S} b={batch} r={r} k={k}")
        need = kv_bytes(S, batch, args.head_kv, args.d)
        avail = mem_available()
        if avail is not None and need > MEM_FRACTION * avail:
            note = (f"S={S} batch={batch} r={r} k={k}: K+V+K^T = {need / 2**30:.2f} GiB > "
                    f"{MEM_FRACTION:.0%} of MemAvailable ({avail / 2**30:.2f} GiB)")
            tqdm.write(f"skipping {note}")
            meta["skipped"].append(note)
            continue
        try:
            row = run_point(args, S, batch, r, k)
        except (RuntimeError, json.JSONDecodeError) as e:
            note = f"S={S} batch={batch} r={r} k={k}: {e}"
            tqdm.write(f"FAILED {note}")
            meta["failed"].append(note)
            continue
        row["groups"] = groups
        rows.append(row)
        noisy = [op for op in ("dense", "sparq") if row[f"{op}_us_iqr"] > 0.25 * row[f"{op}_us_median"]]
        if noisy:
            tqdm.write(f"note: S={S} batch={batch} r={r} k={k}: noisy {' and '.join(noisy)} timings "
                       f"(IQR > 25 % of the median); is something else running?")
        tqdm.write(f"S={S:>6} batch={batch} r={r:>2} k={k:>3}: dense {row['dense_us_median']:9.1f} us "
                   f"({row['dense_GBps']:5.1f} GB/s), sparq {row['sparq_us_median']:8.1f} us "
                   f"({row['sparq_GBps']:5.1f} GB/s), speedup {row['speedup']:5.2f}x of bound "
                   f"{row['bound']:5.2f} ({row['fraction_of_bound']:.0%})")
    bar.close()
    meta["machine"]["loadavg_1min_end"] = loadavg()

    stem = out_stem(args.out_dir, args.tag)
    write_csv_file(stem.with_suffix(".csv"), rows, meta)
    write_json_file(stem.with_suffix(".json"), rows, meta)
    write_md(stem.with_suffix(".md"), rows, meta)
    write_png(stem.with_suffix(".png"), rows, meta, args.d)
    print(f"op.py bench: {len(rows)} points written to {stem}.{{csv,json,md,png}}"
          + (f"; {len(meta['skipped'])} skipped for memory" if meta["skipped"] else "")
          + (f"; {len(meta['failed'])} FAILED" if meta["failed"] else ""))
    return 1 if meta["failed"] or not rows else 0

# ============================================================================================= ab

AB_DOC = """Two builds of the SparQ op timed against each other, interleaved, on the same machine.

A change that should cost no speed (a restructure, a refactor of a kernel) is checked by
timing the op of the build before it (``--before``: a folder holding that build's
``sparq-op-bench``, e.g. a copy of an installed ``llama_sparq/lib``) and of this build
(``--after``, default the installed package's) in alternation: per round and per point,
before then after in even rounds and after then before in odd ones (the first of two runs
tends to be slower here), so slow drifts of a shared 2-core machine hit both alike. Each run times
``--reps`` repetitions of SparQ alone (bench/native/sparq-op-bench.cpp, Llama 2 7B attention
shapes by default: 32 heads of 128, MHA, f16 cache and K^T, one decode row, r/k/l as given;
``--heads/--head-kv/--d`` for another layer's shape, ``--kt-bits 8`` or ``4`` for the 8- or 4-bit K^T).

Writes <tag>.json and <tag>.md into --out-dir (default bench/results): per point the median
over rounds of each round's median, the ratio after/before, and the spread of the ratio over
the rounds, with the command, machine and commit. The op is a graph node of its own there, so
there are no llama counters: the SparQ op is what is timed.

    python bench/op.py ab --before /tmp/base_pkg/llama_sparq/lib --tag op_ab_restructure
"""


def time_op(exe: Path, S: int, args) -> float:
    """Median us of one sparq-op-bench run of the SparQ op alone."""
    times = op_bench_times(exe, S=S, batch=1, heads=args.heads, head_kv=args.head_kv, d=args.d, r=args.r, k=args.k,
                           l=args.k // 4, threads=args.threads, reps=args.reps, ops=("sparq",), kt_bits=args.kt_bits)
    return st.median(times["sparq"])


def ab_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=AB_DOC.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="folder with the earlier build's sparq-op-bench")
    ap.add_argument("--after", type=Path, default=None, help="folder with this build's (default: the package's)")
    ap.add_argument("--sizes", default="4096,16384,65536", help="context lengths S (default 4096,16384,65536)")
    ap.add_argument("--rounds", type=int, default=4, help="before/after alternations per point (default 4)")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions per run (default 20)")
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    ap.add_argument("--head-kv", type=int, default=32, help="KV heads (default 32)")
    ap.add_argument("--d", type=int, default=128, help="head size (default 128)")
    ap.add_argument("--kt-bits", type=int, default=16, choices=(16, 8, 4), help="K^T width (default 16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="op_ab")
    args = ap.parse_args(argv)
    if min(args.heads, args.head_kv, args.d, args.r) < 1 or args.heads % args.head_kv or args.r > args.d:
        ap.error("--heads must be a multiple of --head-kv, and 1 <= --r <= --d (all >= 1)")
    if args.after is None:
        from llama_sparq import tool_path

        args.after = tool_path("sparq-op-bench").parent
    exes = {"before": args.before / "sparq-op-bench", "after": args.after / "sparq-op-bench"}
    for name, exe in exes.items():
        if not exe.is_file():
            sys.exit(f"op.py ab: --{name}: {exe} does not exist (a folder holding sparq-op-bench is needed)")
    load0 = loadavg()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = {(S, w): [] for S in sizes for w in exes}
    for rnd in range(args.rounds):
        for S in sizes:
            order = list(exes.items()) if rnd % 2 == 0 else list(exes.items())[::-1]
            for w, exe in order:
                t = time_op(exe, S, args)
                runs[(S, w)].append(t)
                print(f"round {rnd + 1} S={S} {w}: {t:.0f} us", flush=True)
    rows = []
    for S in sizes:
        b, a = runs[(S, "before")], runs[(S, "after")]
        ratios = [x / y for x, y in zip(a, b)]
        rows.append({"S": S, "before_us": st.median(b), "after_us": st.median(a),
                     "ratio": st.median(a) / st.median(b), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "before_runs_us": b, "after_runs_us": a})
    meta = {**run_meta(args.threads, load0), "before": str(exes["before"]), "after": str(exes["after"]),
            "sparq": f"r={args.r}, k={args.k}, l={args.k // 4}, d={args.d}, {args.heads} heads on {args.head_kv} KV "
                     f"heads, batch 1, f16 cache, {args.kt_bits}-bit K^T; compression (b_t / 2) r/2d + k/S asymptotically "
                     f"({args.r * KT_BYTES[args.kt_bits] / 2 / (2 * args.d):.3f} + k/S)",
            "counters": "none: sparq-op-bench computes a graph of the GGML_OP_SPARQ_ATTN node alone (no llama "
                        "context), so the SparQ op is what each timing measures",
            "method": f"{args.rounds} rounds; per round and S: before then after (odd rounds: after then before), {args.reps} reps each, median; "
                      "per S: the median over rounds, the after/before ratio of those, and the range of the "
                      "rounds' own ratios"}
    stem = out_stem(args.out_dir, args.tag)
    write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows})
    md = [f"# The op before and after: {args.tag}", ""] + md_bullets(meta.items()) + [""] + md_table(
        ["S", "before (us)", "after (us)", "after / before", "rounds' ratios"],
        [[str(r["S"]), f"{r['before_us']:.0f}", f"{r['after_us']:.0f}", f"{r['ratio']:.3f}",
          f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"] for r in rows])
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"op.py ab: written {stem}.{{json,md}}")
    return 0

# ============================================================================================= upkeep

UPKEEP_DOC = """SparQ's cache upkeep per decode step, and the cost of a rebuild, against the KV-cache size.

SparQ keeps K^T and the V sums of the cache current. Per decode step it must decide
whether the cells changed since the data was last brought up to date; after a change it
rebuilds the affected stream. This times a small model (2 layers, 2 KV heads of 64, f16
cache, SparQ r = 8, k = 64, l = 16, dense threshold 0) in caches of 1K and 256K cells:

- steady state: the median time of a decode step (1 thread: no thread barriers, whose
  cost on a busy machine would drown the figures) with SparQ on and off, the cache holding
  the same few hundred cells in both sizes, so attention costs the same and what grows
  with the cache size is upkeep;
- rebuild: after the last cell is removed, llama_sparq_sync brings the data up to date (the
  rebuild the next step would do), timed with 1 and with 2 threads, 256 and 260000 cells used.

The context is filled with llama_sparq_bench_fill (random K/V, no prefill). One process
per library and configuration; ``--before-lib DIR`` also times another build of the
fork (e.g. the commit before the upkeep change, installed elsewhere) the same way.

    python bench/op.py upkeep --before-lib /tmp/old-lib --before-commit 32f0cad

Writes bench/results/upkeep_bench.{json,md}.
"""


N_THREADS = 2
SETTINGS = dict(r=8, k=64, l=16, min_kv=0, all_rows=False)
CONFIGS = [  # (KV cells, cells used at the start, steps timed per setting, rebuilds timed)
    (1024, 256, 200, 10),
    (262144, 256, 200, 10),
    (262144, 260000, 20, 5),
]


def worker(args) -> dict:
    import numpy as np

    from llama_sparq import _sparq
    from llama_sparq._llama import llama_cpp as lc
    from llama_sparq import Llama

    llm = Llama(args.model, n_ctx=64, n_threads=N_THREADS, verbose=False)  # loads the model, sets up the backend
    p = lc.llama_context_default_params()
    p.n_ctx = args.size
    p.n_batch = p.n_ubatch = 512
    p.n_seq_max = 1
    p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
    p.n_threads = p.n_threads_batch = 1
    ctx = lc.llama_init_from_model(llm._model.model, p)
    assert ctx
    mem = lc.llama_get_memory(ctx)
    _sparq.bench_fill(ctx, args.used, seed=1)
    batch = lc.llama_batch_init(1, 0, 1)

    def step():
        pos = lc.llama_memory_seq_pos_max(mem, 0) + 1
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = 5, pos, 1, True
        batch.seq_id[0][0] = 0
        t0 = time.perf_counter()
        assert lc.llama_decode(ctx, batch) == 0
        lc.llama_synchronize(ctx)
        return (time.perf_counter() - t0) * 1e3

    def sparq(on):
        _sparq.set_params(ctx, enabled=on, **SETTINGS)

    out = {}
    for name, on in (("on", True), ("off", False)):
        sparq(on)
        for _ in range(5):
            step()
        out[f"step_{name}_ms"] = float(np.median([step() for _ in range(args.steps)]))
    sparq(True)
    for _ in range(3):
        step()
    reb0 = _sparq.get_stats(ctx)["n_rebuilds"]
    for nth in (1, N_THREADS):
        lc.llama_set_n_threads(ctx, nth, nth)  # the rebuild's threads
        rb = []
        for _ in range(args.rebuilds):
            lc.llama_memory_seq_rm(mem, 0, lc.llama_memory_seq_pos_max(mem, 0), -1)
            t0 = time.perf_counter()
            _sparq.sync(ctx)
            rb.append((time.perf_counter() - t0) * 1e3)
            step()
        out[f"rebuild_ms_t{nth}"] = float(np.median(rb))
    st = _sparq.get_stats(ctx)
    out["rebuilds_counted"] = int(st["n_rebuilds"] - reb0)
    out["n_sparq"] = int(st["n_sparq"])
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    llm.close()
    return out


def upkeep_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=UPKEEP_DOC.split("\n\n")[0])
    ap.add_argument("--before-lib", type=Path, help="another build's llama_sparq/lib folder to time the same way")
    ap.add_argument("--before-commit", default="", help="the commit that --before-lib was built from")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="upkeep_bench")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--used", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rebuilds", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    from llama_sparq._lib import lib_dir
    from sparq_lab.models import make_tiny_llama

    tmp = Path(tempfile.mkdtemp(prefix="upkeep-bench-"))
    model = make_tiny_llama(tmp / "model.gguf", n_layer=2, n_embd=128, n_head=2, n_head_kv=2, n_ff=256,
                            weight_type="f16")
    libs = []
    if args.before_lib:
        libs.append(("before", str(args.before_lib), args.before_commit or "unknown"))
    commit = git_commit()
    libs.append(("after", str(lib_dir()), commit))
    rows = []
    load0 = loadavg()
    for size, used, steps, rebuilds in CONFIGS:
        for label, lib, com in libs:
            cmd = [sys.executable, __file__, "upkeep", "--worker", "--model", str(model), "--size", str(size), "--used",
                   str(used), "--steps", str(steps), "--rebuilds", str(rebuilds)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, LLAMA_SPARQ_LIB_DIR=lib))
            if res.returncode != 0:
                raise RuntimeError(f"{shlex.join(cmd)} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            r.update(lib=label, commit=com, kv_cells=size, used_cells=used, steps=steps, rebuilds=rebuilds)
            r["upkeep_ms"] = r["step_on_ms"] - r["step_off_ms"]
            rows.append(r)
            print(f"{label:6s} cells {size:7d} used {used:6d}: on {r['step_on_ms']:.3f} ms, off {r['step_off_ms']:.3f} ms, "
                  f"rebuild {r['rebuild_ms_t1']:.2f} / {r['rebuild_ms_t2']:.2f} ms ({r['rebuilds_counted']} counted)",
                  file=sys.stderr)

    meta = {
        "command": command_line(),
        "date": now_iso(),
        "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": "1 for steps, 1 and 2 for rebuilds",
                    "loadavg_start": load0, "loadavg_end": loadavg(), "kernel_isa": kernel_isa()},
        "commit": commit,
        "model": "tiny random llama: 2 layers, width 128, 2 heads of 64 (2 KV heads), f16 weights, f16 KV cache",
        "sparq": SETTINGS,
        "method": UPKEEP_DOC.split("\n\n")[1].replace("\n", " ") + " " + UPKEEP_DOC.split("\n\n")[2].replace("\n", " "),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.out_dir / f"{args.tag}.json", {"meta": meta, "rows": rows}, newline=True)

    def fig(label, size, used, key):
        for r in rows:
            if (r["lib"], r["kv_cells"], r["used_cells"]) == (label, size, used):
                return r[key]
        return None

    md = [f"# SparQ cache upkeep against the KV-cache size ({args.tag})", "",
          f"Command: `{meta['command']}`  ", f"Date: {meta['date']}  ",
          f"Machine: {meta['machine']['cpu']}, {meta['machine']['cpu_count']} cores, "
          f"SparQ kernels' ISA {meta['machine']['kernel_isa']}, load average {load0} at the start and "
          f"{meta['machine']['loadavg_end']} at the end  ",
          f"Commit: {commit}" + (f"; before: {args.before_commit} ({args.before_lib})" if args.before_lib else ""),
          "", f"Model: {meta['model']}. SparQ r = 8, k = 64, l = 16, dense threshold 0.", "",
          meta["method"], "",
          "| build | KV cells | cells used | step SparQ on ms | step SparQ off ms | on - off ms | rebuild ms, 1 thread | rebuild ms, 2 threads | rebuilds counted |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['lib']} | {r['kv_cells']} | {r['used_cells']} | {r['step_on_ms']:.3f} | {r['step_off_ms']:.3f} | "
                  f"{r['upkeep_ms']:.3f} | {r['rebuild_ms_t1']:.2f} | {r['rebuild_ms_t2']:.2f} | "
                  f"{r['rebuilds_counted']}/{2 * r['rebuilds']} |")
    md += ["", "Upkeep growth with the cache size (same cells used, SparQ on): step at 256K cells minus step at 1K cells:", ""]
    for label, _, _ in libs:
        a, b = fig(label, 262144, 256, "step_on_ms"), fig(label, 1024, 256, "step_on_ms")
        if a is not None and b is not None:
            md.append(f"- {label}: {a - b:+.3f} ms per decode step")
    (args.out_dir / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


# ============================================================================================= the subcommands

SUBCOMMANDS = {"bench": bench_main, "ab": ab_main, "upkeep": upkeep_main}


def main(argv=None) -> int:
    return dispatch(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
