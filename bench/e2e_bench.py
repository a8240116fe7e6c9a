#!/usr/bin/env python3
"""End-to-end decode time against context length, dense and SparQ (the paper's CPU
measurements: Appendix D's time in attention, section 6.2's speedup).

For each context length S, the fork's llama-bench decodes N tokens after a context of S
tokens (``-d S -n N -p 0``), dense and SparQ in the same process, repeated. Per-token
decode time y(S) is fitted as y = a*S + b over the interquartile range of the dense runs
at each S (Appendix D), z(S) = (y(S) - y(0)) / y(S) is the share of time in attention,
and the speedup per S is set against two bounds: the cost model's transfer ratio
M_dense/M_sparq (attention alone) and the Amdahl bound 1/((1-z) + z*M_sparq/M_dense).

    python bench/e2e_bench.py --model paper --n-layer 2          # synthetic Llama 2 7B shapes
    python bench/e2e_bench.py --model gemma3 --tag e2e_gemma3

Writes bench/results/<tag>.{csv,json,md,png} with the command, machine, threads,
commit, SparQ parameters with compression, and the counters proving SparQ ran.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_bench import cpu_model, git_commit, kernel_isa, loadavg  # noqa: E402

from llama_sparq import cost, tool_path  # noqa: E402
from llama_sparq.models import default_model_path, make_paper_shape  # noqa: E402

PAPER_CPU_FIT = (1.62e-5, 0.2438)  # Llama 2 7B, batch 1, the paper's CPU fit y = a*S + b (seconds)


def iqr_mask(x):
    q1, q3 = np.percentile(x, [25, 75])
    return (x >= q1) & (x <= q3)


def fit_line(S, y):
    A = np.vstack([S, np.ones_like(S)]).T
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(a), float(b)


def fit_iqr(rows, key):
    """y = a*S + b over the runs inside the interquartile range at each S (Appendix D)."""
    S, Y = [], []
    for r in rows:
        x = np.array(r[key])
        keep = iqr_mask(x)
        S += [r["S"]] * int(keep.sum())
        Y += x[keep].tolist()
    return fit_line(np.array(S, float), np.array(Y, float))


def run_depth(exe, model, S, args):
    cmd = [str(exe), "-m", str(model), "-p", "0", "-n", str(args.n_gen), "-d", str(S), "-r", str(args.reps),
           "-t", str(args.threads), "--sparq", "0,1", "--sparq-r", str(args.r), "--sparq-k", str(args.k),
           "--sparq-l", str(args.l), "--sparq-min-kv", "0", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"llama-bench failed at S={S}:\n{p.stderr[-2000:]}")
    return cmd, json.loads(p.stdout)


def write_results(args, rows, raw, cmds, model, d, synthetic, load0):
    # Appendix D fit over the interquartile range of the dense runs at each S
    a, b = fit_iqr(rows, "dense_samples")
    a2, b2 = fit_iqr(rows, "sparq_samples")
    for r in rows:
        y = a * r["S"] + b
        z = min(1.0, max(0.0, (y - b) / y)) if y > 0 else float("nan")
        r["z"] = z
        r["amdahl_bound"] = 1.0 / ((1.0 - z) + z * r["compression"])
        r["fraction_of_amdahl"] = r["speedup"] / r["amdahl_bound"]
    pa, pb = PAPER_CPU_FIT

    meta = {
        "command": " ".join(shlex.quote(x) for x in [sys.executable, *sys.argv]),
        "llama_bench_commands": cmds,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {args.threads} threads; SparQ kernels ISA: {kernel_isa()}",
        "load_average_start_end": [load0, loadavg()],
        "commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": str(model) + (f" (synthetic: Llama 2 7B per-layer shapes, width 4096, 32 heads of 128, FFN 11008, "
                               f"vocabulary 32000, Q8_0 weights, {args.n_layer} layers; the attention share of "
                               "decode time depends on per-layer weight and cache sizes and on S, not on the layer "
                               "count)" if synthetic else ""),
        "cache": "F16 K and V (and K^T), batch 1, one sequence",
        "sparq": f"r={args.r}, k={args.k}, l={args.l}, dense threshold 0 (SparQ on every decode step); "
                 f"compression M_sparq/M_dense per S in the table (-> r/2d = {args.r / (2 * d):.3f})",
        "timing": f"per-token decode time of {args.n_gen} tokens after a context of S tokens (llama-bench -d S -n "
                  f"{args.n_gen} -p 0), {args.reps} repetitions; dense and SparQ in one llama-bench process per S",
        "fit_dense": {"a": a, "b": b, "formula": "y(S) = a*S + b seconds per token, over the IQR of the runs at each S"},
        "fit_sparq": {"a": a2, "b": b2},
        "paper_cpu_fit": {"a": pa, "b": pb, "note": "Llama 2 7B (32 layers), the paper's EPYC, batch 1"},
        "counters": "sparq_calls = attention calls that ran SparQ during the SparQ runs (layers x ubatches), "
                    "from the fork's counters",
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / args.tag
    (stem.with_suffix(".json")).write_text(json.dumps({"meta": meta, "rows": rows, "llama_bench": raw}, indent=1))
    cols = ["S", "dense_s", "sparq_s", "speedup", "compression", "attention_bound", "z", "amdahl_bound",
            "fraction_of_amdahl", "sparq_calls", "sparq_dense_calls"]
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        for k, v in meta.items():
            f.write(f"# {k}: {v}\n")
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([r[c] for c in cols])
    md = [f"# End-to-end decode, dense vs SparQ: {args.tag}", ""] + [f"- **{k}**: {v}" for k, v in meta.items()] + [
        "", f"Dense fit here: y(S) = {a:.3e}*S + {b:.4f} s/token; z(S) = a*S / (a*S + b). Paper (Llama 2 7B, 32 "
        f"layers, EPYC): y = {pa:.3e}*S + {pb:.4f} s, z(16K) = {pa*16384/(pa*16384+pb):.3f}; here z(16K) = "
        f"{(a*16384/(a*16384+b) if a*16384+b > 0 else float('nan')):.3f}.", "",
        "| S | dense ms/token | SparQ ms/token | speedup | compression | attention bound | z(S) | Amdahl bound | "
        "of Amdahl bound | SparQ calls |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['S']} | {1e3*r['dense_s']:.2f} | {1e3*r['sparq_s']:.2f} | {r['speedup']:.3f} | "
                  f"{r['compression']:.4f} | {r['attention_bound']:.2f} | {r['z']:.3f} | {r['amdahl_bound']:.3f} | "
                  f"{100*r['fraction_of_amdahl']:.0f}% | {r['sparq_calls']} |")
    (stem.with_suffix(".md")).write_text("\n".join(md) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(17, 5.2))
    S = np.array([r["S"] for r in rows], float)
    Sf = np.linspace(0, S.max(), 200)
    for r in rows:
        ax[0].scatter([r["S"]] * len(r["dense_samples"]), 1e3 * np.array(r["dense_samples"]), s=8, c="C0", alpha=.5)
        ax[0].scatter([r["S"]] * len(r["sparq_samples"]), 1e3 * np.array(r["sparq_samples"]), s=8, c="C1", alpha=.5)
    ax[0].plot(Sf, 1e3 * (a * Sf + b), "C0-", label=f"dense fit {a:.2e}*S + {b:.4f} s")
    ax[0].plot(Sf, 1e3 * (a2 * Sf + b2), "C1-", label=f"SparQ fit {a2:.2e}*S + {b2:.4f} s")
    ax[0].set(xlabel="context S (tokens)", ylabel="ms per decoded token", title="decode time vs S")
    ax[0].legend(fontsize=8)
    with np.errstate(divide="ignore", invalid="ignore"):
        zf = a * Sf / (a * Sf + b)
    ax[1].plot(Sf, zf, "C0-", label="this machine (fit)")
    ax[1].plot(Sf, pa * Sf / (pa * Sf + pb), "k--", label="paper CPU fit (Llama 2 7B)")
    ax[1].scatter(S, [r["z"] for r in rows], c="C0", s=14)
    ax[1].set(xlabel="context S (tokens)", ylabel="z(S): share of decode time in attention", ylim=(0, 1),
              title="time in attention")
    ax[1].legend(fontsize=8)
    ax[2].plot(S, [r["speedup"] for r in rows], "o-", c="C1", label="measured speedup (dense / SparQ)")
    ax[2].plot(S, [r["amdahl_bound"] for r in rows], "s--", c="k", label="Amdahl bound from z(S)")
    ax[2].plot(S, [r["attention_bound"] for r in rows], ":", c="gray", label="attention bound M_dense/M_sparq")
    ax[2].axhline(1.0, c="gray", lw=.5)
    ax[2].set(xscale="log", xlabel="context S (tokens, log)", ylabel="speedup", title="end-to-end speedup")
    ax[2].legend(fontsize=8)
    fig.suptitle(f"{args.tag}: {Path(str(model)).name}, batch 1, F16 cache, SparQ r={args.r} k={args.k} l={args.l}",
                 fontsize=11)
    foot = f"command: {meta['command']}\nmachine: {meta['machine']}\ncommit: {meta['commit']}  date: {meta['date']}"
    fig.text(0.01, 0.005, foot, fontsize=7, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    print("\n".join(md[-len(rows) - 2:]))
    print(f"written: {stem}.{{csv,json,md,png}}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="paper", help="'paper' (synthetic Llama 2 7B shapes), 'gemma3', or a GGUF path")
    ap.add_argument("--n-layer", type=int, default=2, help="layers of the synthetic model (default 2)")
    ap.add_argument("--depths", default="512,1024,2048,4096,8192,16384,32768,65536")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n-gen", type=int, default=4, help="tokens decoded per run; time is per token")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    ap.add_argument("--tag", default="e2e_paper_shape")
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args(argv)

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **k: x  # noqa: E731

    synthetic = args.model == "paper"
    if synthetic:
        model = Path(os.environ.get("LLAMA_SPARQ_MODEL_DIR", Path.home() / ".cache" / "llama-sparq")) / \
            f"paper-shape-{args.n_layer}l.gguf"
        if not model.exists():
            model.parent.mkdir(parents=True, exist_ok=True)
            print(f"writing the synthetic model {model} ...", flush=True)
            make_paper_shape(model, n_layer=args.n_layer)
        d = 128
    elif args.model == "gemma3":
        model, d = default_model_path(), 256
    else:
        model, d = Path(args.model), int(os.environ.get("HEAD_DIM", "128"))
    exe = tool_path("llama-bench")
    depths = [int(x) for x in args.depths.split(",")]
    load0 = loadavg()

    rows, raw, cmds = [], [], []
    for S in tqdm(depths, desc="context lengths", unit="S"):
        cmd, res = run_depth(exe, model, S, args)
        cmds.append(" ".join(shlex.quote(c) for c in cmd))
        raw.extend(res)
        by = {r["sparq"]: r for r in res}
        dn, sp = by[0], by[1]
        td = np.array(dn["samples_ns"], float) / 1e9 / args.n_gen
        ts = np.array(sp["samples_ns"], float) / 1e9 / args.n_gen
        comp = cost.compression(S, d, args.r, args.k)
        rows.append({"S": S, "dense_s": float(np.median(td)), "sparq_s": float(np.median(ts)),
                     "dense_samples": td.tolist(), "sparq_samples": ts.tolist(),
                     "speedup": float(np.median(td) / np.median(ts)), "compression": comp,
                     "attention_bound": 1.0 / comp, "sparq_calls": sp["sparq_calls"],
                     "sparq_dense_calls": sp["sparq_dense"], "sparq_compr_counter": sp["sparq_compr"]})

        if len(rows) >= 2:
            write_results(args, rows, raw, cmds, model, d, synthetic, load0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
