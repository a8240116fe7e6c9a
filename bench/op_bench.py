#!/usr/bin/env python3
"""Op microbenchmark sweep: GGML_OP_SPARQ_ATTN against upstream's CPU flash attention.

Drives the native ``sparq-op-bench`` (bench/native/sparq-op-bench.cpp), which times
``ggml_sparq_attn`` and ``ggml_flash_attn_ext`` on the same random f16 K and V (and the
K^T copy for SparQ) on ggml's CPU backend, one decode query row per sequence and one KV
stream per sequence. Shapes are Llama 2 7B attention: 32 heads of 128, MHA (32 KV heads).

For each point: median / IQR / min of the per-repetition times of both ops (run in the same
process, dense first, after 2 warm-up runs each), bytes moved per the cost model of
docs/algorithm.md (``llama_sparq.cost``; f16 = 2 bytes per element, times KV heads, times batch),
achieved GB/s, speedup (dense / SparQ medians), the bandwidth bound M_dense / M_sparq and
the fraction of it reached.

Default sweep (about 5-10 minutes on 2 cores):
  * main config r=32, k=128, l=k/4, batch 1, S in 1K, 4K, 16K, 64K, 128K
  * the r x k grid {16, 32, 64} x {64, 128, 256} (l = k/4) at S = 16K and 64K, batch 1
  * batch 4 at S = 4K and 16K, r=32, k=128
Points whose K + V + K^T f16 bytes exceed 60 % of MemAvailable are skipped with a note.

Writes <tag>.csv, <tag>.json, <tag>.png and <tag>.md into --out-dir (default
bench/results), each carrying the command, machine, commit, date, parameters and ISA.

    python bench/op_bench.py                 # the full sweep (make bench-op)
    python bench/op_bench.py --quick --out-dir /tmp/opb    # smoke test, ~1 minute
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, REPO, cpu_model, git_commit, kernel_isa, loadavg, md_bullets,  # noqa: E402
                      md_table, mem_available, command_line, now_iso, op_bench_times, out_stem, pyplot, write_csv,
                      write_json)

try:
    from llama_sparq import LibraryError, tool_path
    from llama_sparq import cost
except ImportError as e:  # pragma: no cover - depends on the environment
    sys.exit(f"op_bench: cannot import llama_sparq ({e}); run `make install` and use "
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
        "cost_model": "bytes = M (elements per KV head, llama_sparq.cost) * 2 (f16) * head_kv * batch; "
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
        f"SparQ main config: r={mp['r']}, k={mp['k']}, l={mp['l']}; compression M_sparq/M_dense: {comp} "
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

    # panel 1: speedup vs S, main config, with the bound
    main = sorted((r for r in rows if "main" in r["groups"]), key=lambda r: r["S"])
    b4 = sorted((r for r in rows if "batch4" in r["groups"]), key=lambda r: r["S"])
    allS = [r["S"] for r in main + b4]
    if allS:
        Sc = np.geomspace(min(allS) / 1.3, max(allS) * 1.3, 200)
        ax1.plot(Sc, cost.attention_bound(Sc, d, MAIN_R, MAIN_K), "k--", lw=1.3,
                 label=f"bound M_dense/M_sparq (r={MAIN_R}, k={MAIN_K})")
        ax1.axhline(2 * d / MAIN_R, color="grey", ls=":", lw=1, label=f"limit 2d/r = {2 * d / MAIN_R:g}")
    ytop = 1.12 * max([2 * d / MAIN_R] + [r["speedup"] for r in main + b4])
    if main:
        ax1.plot([r["S"] for r in main], [r["speedup"] for r in main], "o-", color="C0", ms=7,
                 label=f"measured, batch 1 (r={MAIN_R}, k={MAIN_K}, l={MAIN_K // 4})")
        for r in main:
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


# ----------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
        sys.exit(f"op_bench: the benchmark program sparq-op-bench is missing ({e}).\n"
                 f"Run `make install` in {REPO} (it builds and installs the fork's programs), then retry.")

    from tqdm import tqdm

    points = build_points(args.quick)
    meta = make_meta(args, points)
    print(f"op_bench: {len(points)} points, {args.threads} threads, reps {args.reps}, "
          f"ISA {meta['isa']}, commit {meta['commit']}", flush=True)

    la = meta["machine"]["loadavg_1min_start"]
    if la is not None and la > 0.5:
        print(f"op_bench: note: the 1-minute load average is {la:.2f}; other processes on this "
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
    print(f"op_bench: {len(rows)} points written to {stem}.{{csv,json,md,png}}"
          + (f"; {len(meta['skipped'])} skipped for memory" if meta["skipped"] else "")
          + (f"; {len(meta['failed'])} FAILED" if meta["failed"] else ""))
    return 1 if meta["failed"] or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
