#!/usr/bin/env python3
"""End-to-end decode time against context length, dense and SparQ (the paper's CPU
measurements: Appendix D's time in attention, section 6.2's speedup).

For each context length S, the fork's llama-bench decodes N tokens after a context of S
tokens (``-d S -n N -p 0``) and times them, repeated:

- dense, upstream's flash-attention path (``-fa 1``, what ``-fa auto`` picks on CPU),
- dense, upstream's other path (``-fa 0``: KQ matrix product, softmax, V product),
- SparQ (``-fa 1 --sparq 1``, dense threshold 0 so every decode step runs SparQ),

dense-FA and SparQ interleaved in one process (``--sparq 0,1,0,1``). The baseline of the
speedup is the faster dense path at each S. The per-token decode time y(S) of the dense
runs is fitted as y = a*S + b over the interquartile range of the runs at each S
(Appendix D); z(S) = (y(S) - y(0)) / y(S) is the share of time in attention, from the fit
and from the measured medians (with y(0) measured at S = 0). The speedup is set against the
cost model's transfer ratio M_dense/M_sparq (attention alone) and the Amdahl bound
1 / ((1 - z) + z * M_sparq/M_dense).

The context is either a real prefill (``--fill prefill``) or K and V written straight into
the cache (``--fill synthetic``, llama-bench ``--depth-fill synthetic``): decode time does
not depend on what the cache holds for dense attention, and ``--fill-check S`` measures
both fills at one S to show it does not for SparQ either.

    python bench/e2e_bench.py --model paper --n-layer 2                  # synthetic Llama 2 7B shapes
    python bench/e2e_bench.py --model paper --fill-check 16384           # synthetic fill vs prefill
    python bench/e2e_bench.py --model gemma3 --fill prefill --tag e2e_gemma3

Writes bench/results/<tag>.{csv,json,md,png} (or <tag>.{json,md} for --fill-check) with
the command, machine, threads, commit, SparQ parameters with compression, and the
counters proving SparQ ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, fit_line, iqr_points, loadavg, md_bullets, out_stem, progress,  # noqa: E402
                      pyplot, run_checked, run_meta, write_csv, write_json)

from llama_sparq import cost, tool_path  # noqa: E402
from llama_sparq.models import NAMED_MODELS, paper_shape_path, resolve_model  # noqa: E402

PAPER_CPU_FIT = (1.62e-5, 0.2438)  # Llama 2 7B, batch 1, the paper's CPU fit y = a*S + b (seconds)
CONFIGS = ("dense_fa0", "dense_fa1", "sparq")
LABELS = {"dense_fa0": "dense, -fa 0 (KQ product)", "dense_fa1": "dense, -fa 1 (flash attention)",
          "sparq": "SparQ (-fa 1 --sparq 1)"}


def fit_iqr(rows, key):
    """y = a*S + b over the runs inside the interquartile range at each S (Appendix D)."""
    S, Y = iqr_points([r["S"] for r in rows], [r["samples"].get(key, []) for r in rows])
    if len(set(S)) < 2:
        return float("nan"), float("nan")
    return fit_line(np.array(S, float), np.array(Y, float))


class Bench:
    """Runs llama-bench for one model and keeps every command and JSON row."""

    def __init__(self, args, model):
        self.args, self.model = args, model
        self.exe = Path(args.lib) / "llama-bench" if args.lib else tool_path("llama-bench")
        self.cmds, self.raw = [], []

    def run(self, S, fa, sparq, fill):
        a = self.args
        cmd = [str(self.exe), "-m", str(self.model), "-p", "0", "-n", str(a.n_gen), "-d", str(S),
               "-r", str(a.reps), "-t", str(a.threads), "-fa", str(fa), "-o", "json"]
        if fill == "synthetic" and S > 0:
            cmd += ["--depth-fill", "synthetic"]
        if sparq:
            cmd += ["--sparq", "0,1,0,1", "--sparq-r", str(a.r), "--sparq-k", str(a.k), "--sparq-l", str(a.l),
                    "--sparq-min-kv", "0", "--sparq-gqa", a.gqa, "--sparq-basis", a.basis]
        res = json.loads(run_checked(cmd, f"llama-bench failed at S={S}").stdout)
        for r in res:
            r["depth_fill"] = fill if S > 0 else "none"
        self.cmds.append(shlex.join(cmd))
        self.raw.extend(res)
        out = {}
        for r in res:
            key = "sparq" if r.get("sparq") else f"dense_fa{fa}"
            t = (np.array(r["samples_ns"], float) / 1e9 / a.n_gen).tolist()
            out.setdefault(key, []).extend(t)
            if r.get("sparq"):
                out.setdefault("_counters", []).append({k: r[k] for k in ("sparq_calls", "sparq_dense",
                                                                          "sparq_compr", "sparq_r", "sparq_k",
                                                                          "sparq_l", "sparq_min_kv")})
        return out


def measure(bench, S, fill, dense_fa0):
    samples = {}
    for _ in range(bench.args.rounds):
        if dense_fa0:
            for k, v in bench.run(S, 0, False, fill).items():
                samples.setdefault(k, []).extend(v)
        for k, v in bench.run(S, 1, True, fill).items():
            samples.setdefault(k, []).extend(v)
    return samples


def k_rows(args) -> int:
    """Rows of K and V a SparQ step reads: k, or g (k - l) + l with per-head choice (the cost model)."""
    g = 4 if args.model == "gemma3" else 3 if args.model == "smollm2" else 1 if args.model == "paper" else \
        int(os.environ.get("N_HEAD", "8")) // int(os.environ.get("N_HEAD_KV", "8"))
    return args.k if args.gqa == "shared" or g == 1 else g * (args.k - args.l) + args.l


def model_shape(args):
    """(d, n_head_kv, layers that SparQ runs on, description) for the attention byte counts."""
    if args.model == "paper":
        return 128, 32, args.n_layer, (
            f"synthetic: Llama 2 7B per-layer shapes (width 4096, 32 heads of 128, FFN 11008, vocabulary 32000), "
            f"Q8_0 weights, random values, {args.n_layer} layers. Every layer adds the same weights and the same "
            "cache, so the share of decode time in attention depends on per-layer sizes and S, not on the layer "
            "count; the exception is the output projection (32000 x 4096 Q8_0, 139 MB), read once per token "
            "whatever the layer count: it is 25 % of the fixed bytes with 2 layers and 2 % with 32, so z(S) and "
            "the speedup here slightly understate the 32-layer model's")
    if args.model == "gemma3":
        return 256, 1, 3, ("Gemma 3 270M (Q4_K_M, real weights): 18 layers, of which 3 are global (every sixth) and "
                           "use SparQ; the 15 sliding-window layers (window 512) stay dense by design")
    if args.model == "smollm2":
        return 64, 3, 30, ("SmolLM2 135M Instruct (Q4_1, real weights): 30 layers, all global, 9 query heads on 3 KV "
                           "heads of 64; 8K context")
    return int(os.environ.get("HEAD_DIM", "128")), int(os.environ.get("N_HEAD_KV", "8")), \
        int(os.environ.get("N_LAYER_SPARQ", "1")), "user model (HEAD_DIM, N_HEAD_KV, N_LAYER_SPARQ from the environment)"


def analyse(args, rows, d, n_head_kv, n_lay):
    fits = {c: fit_iqr(rows, c) for c in CONFIGS}
    y0 = {}
    for r in rows:
        if r["S"] == 0:
            y0 = {c: float(np.median(v)) for c, v in r["samples"].items() if not c.startswith("_")}
    for c in CONFIGS:
        if c not in y0 and np.isfinite(fits[c][1]):
            y0[c] = fits[c][1]
    for r in rows:
        S = r["S"]
        med = {c: float(np.median(v)) for c, v in r["samples"].items() if not c.startswith("_")}
        r.update({f"{c}_s": med.get(c, float("nan")) for c in CONFIGS})
        dense = [c for c in ("dense_fa0", "dense_fa1") if c in med]
        best = min(dense, key=lambda c: med[c])
        r["baseline"] = best
        r["dense_s"] = med[best]
        r["speedup"] = med[best] / med["sparq"]
        r["speedup_vs_fa1"] = med["dense_fa1"] / med["sparq"]
        comp = float(cost.compression(max(S, 1), d, args.r, k_rows(args)))
        r["compression"] = comp
        r["attention_bound"] = 1.0 / comp
        a, b = fits[best]
        y = a * S + b
        r["z_fit"] = min(1.0, max(0.0, (y - b) / y)) if y > 0 else float("nan")
        r["z"] = min(1.0, max(0.0, (med[best] - y0[best]) / med[best]))
        r["amdahl_bound"] = float(cost.amdahl_bound(r["z"], comp))
        r["fraction_of_amdahl"] = r["speedup"] / r["amdahl_bound"]
        dense_bytes = n_lay * float(cost.bytes_moved(max(S, 1), d, args.r, k_rows(args), 2, n_head_kv, sparq=False))
        sparq_bytes = n_lay * float(cost.bytes_moved(max(S, 1), d, args.r, k_rows(args), 2, n_head_kv, sparq=True))
        r["dense_attn_bytes"], r["sparq_attn_bytes"] = dense_bytes, sparq_bytes
        for c, nbytes in (("dense_fa0", dense_bytes), ("dense_fa1", dense_bytes), ("sparq", sparq_bytes)):
            t_att = med.get(c, float("nan")) - y0.get(c, float("nan"))
            r[f"{c}_attn_GBps"] = nbytes / t_att / 1e9 if S > 0 and t_att > 0 else float("nan")
        cnt = r["samples"].get("_counters", [])
        r["sparq_calls"] = sum(x["sparq_calls"] for x in cnt)
        r["sparq_dense_calls"] = sum(x["sparq_dense"] for x in cnt)
        r["sparq_compr_counter"] = float(np.mean([x["sparq_compr"] for x in cnt])) if cnt else float("nan")
    return fits, y0


def common_meta(args, bench, model_desc, load0):
    return {
        **run_meta(args.threads, load0),
        "model": f"{bench.model} ({model_desc})",
        "cache": "F16 K and V (and K^T for SparQ), batch 1, one sequence",
        "sparq": f"r={args.r}, k={args.k}, l={args.l}, gqa {args.gqa}, basis {args.basis}, dense threshold 0 (SparQ on every decode step); compression "
                 f"M_sparq/M_dense per S in the table (-> r/2d = {args.r / (2 * model_shape(args)[0]):.4f})",
        "timing": f"per-token decode time of {args.n_gen} tokens after a context of S tokens (llama-bench -d S -n "
                  f"{args.n_gen} -p 0); per S and round: one process with -fa 0 dense ({args.reps} reps), one with "
                  f"-fa 1 and --sparq 0,1,0,1 (2 x {args.reps} reps each of dense and SparQ, interleaved); "
                  f"{args.rounds} round(s)",
        "counters": "from the fork's counters over llama-bench's timed runs only (not its warm-up, prefill or "
                    "fill): sparq_calls = attention calls (SparQ layers x decoded tokens x reps) that ran SparQ in the "
                    "SparQ runs, sparq_dense = attention calls there that stayed dense (sliding-window layers; 0 "
                    "when every layer has full attention), sparq_compr = the fork's mean cost-model compression "
                    "over its SparQ calls",
        "llama_bench_commands": bench.cmds,
        **({"build": f"llama-bench of another build: {bench.exe} (--lib); the commit above is this checkout's"}
           if args.lib else {}),
    }


def write_results(args, rows, bench, model_desc, load0, d, n_head_kv, n_lay):
    fits, y0 = analyse(args, rows, d, n_head_kv, n_lay)
    pa, pb = PAPER_CPU_FIT
    meta = common_meta(args, bench, model_desc, load0)
    meta["fill"] = ("synthetic: llama-bench --depth-fill synthetic writes zero-mean unit-variance random K and V "
                    "for the S context cells straight into the cache (llama_sparq_bench_fill), no prefill; see "
                    f"{args.tag}_fill_check.md for synthetic vs real prefill at one S" if args.fill == "synthetic"
                    else "real prefill of S tokens (llama-bench -d S), shared by the runs of one process")
    meta["fits"] = {c: {"a": fits[c][0], "b": fits[c][1]} for c in CONFIGS}
    meta["fit_formula"] = "y(S) = a*S + b seconds per token, over the IQR of the runs at each S (Appendix D)"
    meta["y0_measured"] = y0
    meta["paper_cpu_fit"] = {"a": pa, "b": pb, "note": "Llama 2 7B (32 layers), the paper's EPYC, batch 1"}
    meta["baseline"] = "speedup = the faster dense path at each S (column 'baseline') / SparQ; speedup_vs_fa1 = "\
                       "dense flash attention (upstream's default on CPU) / SparQ"
    meta["bounds"] = "attention_bound = M_dense/M_sparq; amdahl_bound = 1/((1-z) + z*M_sparq/M_dense) with z the " \
                     "measured share of decode time in attention of the baseline: (y(S) - y(0)) / y(S), medians"
    stem = out_stem(args.out_dir, args.tag)
    rows_out = [{k: v for k, v in r.items()} for r in rows]
    write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows_out, "llama_bench": bench.raw})
    cols = ["S", "baseline", "dense_s", "sparq_s", "speedup", "dense_fa0_s", "dense_fa1_s", "speedup_vs_fa1",
            "compression", "attention_bound", "z", "z_fit", "amdahl_bound", "fraction_of_amdahl",
            "dense_fa0_attn_GBps", "dense_fa1_attn_GBps", "sparq_attn_GBps", "sparq_calls", "sparq_dense_calls",
            "sparq_compr_counter"]
    write_csv(stem.with_suffix(".csv"), (f"{k}: {v}" for k, v in meta.items()), cols,
              ([r[c] for c in cols] for r in rows))

    zf = (lambda a, b, S: a * S / (a * S + b))
    md = [f"# End-to-end decode, dense vs SparQ: {args.tag}", ""] + \
         md_bullets((k, v) for k, v in meta.items() if k != "llama_bench_commands") + \
         ["- **llama_bench_commands**: one per S, round and path; all in the JSON. The last: `"
          + (bench.cmds[-1] if bench.cmds else "") + "`", "",
          "## Fit (Appendix D) and time in attention", "",
          "| | a (s/token per context token) | b = y(0) (s/token) | z(16K) | z(64K) |", "|---|---|---|---|---|"]
    for c in CONFIGS[:2]:
        a, b = fits[c]
        md.append(f"| this machine, {LABELS[c]} | {a:.3e} | {b:.4f} | {zf(a, b, 16384):.3f} | {zf(a, b, 65536):.3f} |")
    md.append(f"| paper, Llama 2 7B (32 layers), EPYC | {pa:.3e} | {pb:.4f} | {zf(pa, pb, 16384):.3f} | "
              f"{zf(pa, pb, 65536):.3f} |")
    md += ["", "## Per S", "",
           "| S | dense ms/token (path) | SparQ ms/token | speedup | dense -fa 1 ms | speedup vs -fa 1 | compression | "
           "attention bound | z(S) measured | z(S) fit | Amdahl bound | of Amdahl bound | attention GB/s: dense / SparQ "
           "| SparQ calls (dense) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = r["baseline"].replace("dense_", "-")
        md.append(f"| {r['S']} | {1e3*r['dense_s']:.2f} ({base}) | {1e3*r['sparq_s']:.2f} | {r['speedup']:.2f} | "
                  f"{1e3*r['dense_fa1_s']:.2f} | {r['speedup_vs_fa1']:.2f} | {r['compression']:.4f} | "
                  f"{r['attention_bound']:.2f} | {r['z']:.3f} | {r['z_fit']:.3f} | {r['amdahl_bound']:.2f} | "
                  f"{100*r['fraction_of_amdahl']:.0f}% | {r[r['baseline'] + '_attn_GBps']:.1f} / "
                  f"{r['sparq_attn_GBps']:.1f} | {r['sparq_calls']} ({r['sparq_dense_calls']}) |")
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    plot(args, rows, fits, meta, stem, bench.model)
    print("\n".join(md[-len(rows) - 2:]), flush=True)
    print(f"written: {stem}.{{csv,json,md,png}}", flush=True)


def plot(args, rows, fits, meta, stem, model):
    plt = pyplot()
    pa, pb = PAPER_CPU_FIT
    fig, ax = plt.subplots(1, 3, figsize=(18, 5.4))
    S = np.array([r["S"] for r in rows], float)
    Sf = np.linspace(0, max(S.max(), 1), 300)
    colors = {"dense_fa0": "C0", "dense_fa1": "C2", "sparq": "C1"}
    for c in CONFIGS:
        for r in rows:
            v = r["samples"].get(c, [])
            ax[0].scatter([r["S"]] * len(v), 1e3 * np.array(v), s=7, c=colors[c], alpha=.45)
        a, b = fits[c]
        if np.isfinite(a):
            ax[0].plot(Sf, 1e3 * (a * Sf + b), "-", c=colors[c], label=f"{LABELS[c]}: {a:.2e}*S + {b:.4f} s")
    ax[0].set(xlabel="context S (tokens)", ylabel="ms per decoded token", title="decode time vs S (IQR fits)")
    ax[0].legend(fontsize=7)
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in ("dense_fa0", "dense_fa1"):
            a, b = fits[c]
            ax[1].plot(Sf, a * Sf / (a * Sf + b), "-", c=colors[c], label=f"this machine, fit, {LABELS[c]}")
        ax[1].plot(Sf, pa * Sf / (pa * Sf + pb), "k--", label="paper CPU fit (Llama 2 7B, 32 layers)")
    ax[1].scatter(S, [r["z"] for r in rows], c="k", s=14, zorder=3, label="measured z(S) of the baseline (medians)")
    ax[1].set(xlabel="context S (tokens)", ylabel="z(S): share of decode time in attention", ylim=(0, 1),
              title="time in attention")
    ax[1].legend(fontsize=7)
    Sp = np.maximum(S, 1)
    ax[2].plot(Sp, [r["speedup"] for r in rows], "o-", c="C1", label="SparQ speedup over the faster dense path")
    ax[2].plot(Sp, [r["speedup_vs_fa1"] for r in rows], "^:", c="C2", label="SparQ speedup over dense -fa 1")
    ax[2].plot(Sp, [r["amdahl_bound"] for r in rows], "s--", c="k", label="Amdahl bound (measured z)")
    ax[2].plot(Sp, [r["attention_bound"] for r in rows], ":", c="gray", label="attention bound M_dense/M_sparq")
    ax[2].axhline(1.0, c="gray", lw=.5)
    ax[2].set(xscale="log", xlabel="context S (tokens, log; S=0 drawn at 1)", ylabel="speedup",
              title="end-to-end decode speedup")
    ax[2].legend(fontsize=7)
    fig.suptitle(f"{args.tag}: {Path(str(model)).name}, batch 1, F16 cache, SparQ r={args.r} k={args.k} l={args.l}, "
                 f"fill: {args.fill}", fontsize=11)
    foot = f"command: {meta['command']}\nmachine: {meta['machine']}\ncommit: {meta['commit']}  date: {meta['date']}"
    fig.text(0.01, 0.005, foot, fontsize=7, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    plt.close(fig)


def fill_check(args, bench, model_desc, load0, S):
    """Decode times after a real prefill and after a synthetic fill, at the same S."""
    res = {}
    for fill in ("prefill", "synthetic"):
        res[fill] = measure(bench, S, fill, args.dense_fa0)
    meta = common_meta(args, bench, model_desc, load0)
    meta["what"] = (f"decode times at S={S} after a real prefill of S tokens and after llama-bench --depth-fill "
                    "synthetic (random K and V written into the cache), same settings otherwise")
    lines = [f"# Synthetic fill vs real prefill at S = {S}", ""] + \
            md_bullets((k, v) for k, v in meta.items() if k != "llama_bench_commands") + \
            ["- **llama_bench_commands**: in the JSON", "",
             "| path | prefill ms/token (median, IQR) | synthetic ms/token (median, IQR) | synthetic / prefill |",
             "|---|---|---|---|"]
    summary = {}
    for c in CONFIGS:
        if c not in res["prefill"]:
            continue
        p, s = np.array(res["prefill"][c]), np.array(res["synthetic"][c])
        iq = lambda x: float(np.subtract(*np.percentile(x, [75, 25])))  # noqa: E731
        summary[c] = {"prefill_s": float(np.median(p)), "synthetic_s": float(np.median(s)),
                      "prefill_iqr_s": iq(p), "synthetic_iqr_s": iq(s), "ratio": float(np.median(s) / np.median(p))}
        lines.append(f"| {LABELS[c]} | {1e3*np.median(p):.2f} ({1e3*iq(p):.2f}) | {1e3*np.median(s):.2f} "
                     f"({1e3*iq(s):.2f}) | {np.median(s)/np.median(p):.3f} |")
    for fill in ("prefill", "synthetic"):
        cnt = res[fill].get("_counters", [])
        lines.append(f"\nSparQ counters after the {fill}: " + "; ".join(
            f"calls {x['sparq_calls']}, dense {x['sparq_dense']}, compression {x['sparq_compr']:.4f}" for x in cnt))
    stem = out_stem(args.out_dir, f"{args.tag}_fill_check")
    write_json(stem.with_suffix(".json"), {"meta": meta, "S": S, "summary": summary, "samples": res,
                                           "llama_bench": bench.raw})
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-(len(summary) + 4):]))
    print(f"written: {stem}.{{json,md}}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="paper", help="'paper' (synthetic Llama 2 7B shapes), 'gemma3', 'smollm2', or a GGUF path")
    ap.add_argument("--n-layer", type=int, default=2, help="layers of the synthetic model (default 2)")
    ap.add_argument("--depths", default="0,512,1024,2048,4096,8192,16384,32768,65536,131072,262144")
    ap.add_argument("--fill", choices=("synthetic", "prefill"), default=None,
                    help="how the context is made (default: synthetic for --model paper, prefill otherwise)")
    ap.add_argument("--fill-check", type=int, default=0, metavar="S",
                    help="only compare a synthetic fill with a real prefill at this S")
    ap.add_argument("--no-fa0", dest="dense_fa0", action="store_false", help="skip the -fa 0 dense path")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per llama-bench test (default 3)")
    ap.add_argument("--rounds", type=int, default=1, help="times every S is measured (default 1)")
    ap.add_argument("--n-gen", type=int, default=16, help="tokens decoded per run; time is per token")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    ap.add_argument("--gqa", choices=("shared", "per_head"), default="shared", help="SparQ GQA mode (default shared)")
    ap.add_argument("--basis", choices=("model", "scaled", "pca"), default="model",
                    help="SparQ step-1 basis (default model, the paper)")
    ap.add_argument("--lib", default=None, metavar="DIR",
                    help="another build's llama-bench (a folder holding it, e.g. build/bin of an earlier commit), "
                         "to compare builds; default the installed package's")
    ap.add_argument("--tag", default="e2e_paper_shape")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.fill is None:
        args.fill = "synthetic" if args.model == "paper" else "prefill"

    tqdm = progress()

    if args.model == "paper":
        model = paper_shape_path(args.n_layer)
    elif args.model in NAMED_MODELS:
        model = resolve_model(args.model)
    else:
        model = Path(args.model)
    d, n_head_kv, n_lay, model_desc = model_shape(args)
    bench = Bench(args, model)
    load0 = loadavg()
    if args.fill_check:
        fill_check(args, bench, model_desc, load0, args.fill_check)
        return 0

    depths = [int(x) for x in args.depths.split(",")]
    rows = []
    for S in tqdm(depths, desc="context lengths", unit="S"):
        rows.append({"S": S, "samples": measure(bench, S, args.fill, args.dense_fa0)})
        if len(rows) >= 2:
            write_results(args, rows, bench, model_desc, load0, d, n_head_kv, n_lay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
