#!/usr/bin/env python3
"""What SparQ costs where it does not help: prompt processing (SparQ keeps K^T and the V
sums up to date on every prompt ubatch) and decode after short contexts (below the dense
threshold, where every step stays dense).

With SparQ at its defaults (r = d/4, scaled basis, k = 128, l = k/4, dense threshold 1024 cells), the
fork's llama-bench times prompt processing (``-p N -n 0``) and decode after a short
context (``-p 0 -n 32 -d S``, S < 1024), SparQ on against dense, interleaved in one
process (``--sparq 0,1,0,1``), for several rounds of processes. Dense runs with
upstream's flash-attention path (``-fa 1``, which SparQ needs and ``-fa auto`` picks on
CPU) and, for reference, with ``-fa 0``.

    python bench/overhead_bench.py --model paper --tag overhead_paper_shape
    python bench/overhead_bench.py --model gemma3 --tag overhead_gemma3

Writes bench/results/<tag>.{json,md} with the command, machine, threads, commit, the
SparQ settings and the counters (no SparQ call may run below the threshold).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, loadavg, md_bullets, out_stem, progress, run_checked, run_meta,  # noqa: E402
                      write_json)

from llama_sparq import tool_path  # noqa: E402
from llama_sparq.models import default_model_path, paper_shape_path, smollm2_model_path  # noqa: E402


def run(exe, model, args, extra):
    cmd = [str(exe), "-m", str(model), "-r", str(args.reps), "-t", str(args.threads), "-o", "json", *extra]
    p = run_checked(cmd, "llama-bench failed")
    return shlex.join(cmd), json.loads(p.stdout)


def ratio_ci(num, den, n_boot=4000, seed=0):
    """Ratio of the means num/den with a bootstrap 95% interval."""
    rng = np.random.default_rng(seed)
    num, den = np.asarray(num, float), np.asarray(den, float)
    bn = rng.choice(num, (n_boot, len(num))).mean(1)
    bd = rng.choice(den, (n_boot, len(den))).mean(1)
    lo, hi = np.percentile(bn / bd, [2.5, 97.5])
    return float(num.mean() / den.mean()), float(lo), float(hi)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="paper", help="'paper' (synthetic Llama 2 7B shapes, 2 layers), 'gemma3', 'smollm2', "
                                                      "or a GGUF path")
    ap.add_argument("--prompts", default="512,2048", help="prompt lengths for -p (default 512,2048)")
    ap.add_argument("--depths", default="0,256,512,960",
                    help="short contexts for -d: depth + --n-gen must stay below the dense threshold (1024)")
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="processes per configuration, alternated (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="overhead_paper_shape")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    tqdm = progress()

    if args.model == "paper":
        model = paper_shape_path(2)
        desc = ("synthetic: Llama 2 7B per-layer shapes (width 4096, 32 heads of 128, FFN 11008, vocabulary 32000), "
                "Q8_0 weights, random values, 2 layers (per-layer costs set the ratios, not the layer count; the output "
                "projection is a larger share of the fixed cost with 2 layers than with 32)")
    elif args.model == "gemma3":
        model, desc = default_model_path(), "Gemma 3 270M Q4_K_M (real weights; 3 of 18 layers global)"
    elif args.model == "smollm2":
        model, desc = smollm2_model_path(), "SmolLM2 135M Instruct Q4_1 (real weights; 30 layers, GQA 9/3, head size 64)"
    else:
        model, desc = Path(args.model), "user model"
    exe = tool_path("llama-bench")
    load0 = loadavg()

    jobs = []
    for p in args.prompts.split(","):
        jobs.append(("pp", int(p), ["-p", p, "-n", "0"]))
    jobs.append(("tg", 0, ["-p", "0", "-n", str(args.n_gen), "-d", args.depths]))
    samples, counters, cmds, raw = {}, {}, [], []
    plan = [(j, fa) for _ in range(args.rounds) for j in jobs for fa in (1, 0)]
    for (kind, _, extra), fa in tqdm(plan, desc="llama-bench runs", unit="run"):
        xs = ["-fa", str(fa)] + (["--sparq", "0,1,0,1"] if fa == 1 else [])
        cmd, res = run(exe, model, args, extra + xs)
        cmds.append(cmd)
        raw.extend(res)
        for r in res:
            test = f"pp{r['n_prompt']}" if kind == "pp" else f"tg{r['n_gen']} @ d{r['n_depth']}"
            cfg = "sparq" if r.get("sparq") else f"dense_fa{fa}"
            samples.setdefault(test, {}).setdefault(cfg, []).extend(r["samples_ts"])
            if r.get("sparq"):
                c = counters.setdefault(test, {"sparq_calls": 0, "sparq_dense": 0})
                c["sparq_calls"] += r["sparq_calls"]
                c["sparq_dense"] += r["sparq_dense"]
                c["settings"] = {k: r[k] for k in ("sparq_r", "sparq_k", "sparq_l", "sparq_min_kv")}

    rows = []
    for test, s in samples.items():
        d1, d0, sp = s["dense_fa1"], s["dense_fa0"], s["sparq"]
        rat, lo, hi = ratio_ci(sp, d1)
        rat0, lo0, hi0 = ratio_ci(sp, d0)
        row = {"test": test, "dense_fa1_ts": float(np.mean(d1)), "dense_fa1_sd": float(np.std(d1, ddof=1)),
               "sparq_ts": float(np.mean(sp)), "sparq_sd": float(np.std(sp, ddof=1)),
               "dense_fa0_ts": float(np.mean(d0)), "dense_fa0_sd": float(np.std(d0, ddof=1)),
               "ratio": rat, "ratio_ci95": [lo, hi], "ratio_vs_fa0": rat0, "ratio_vs_fa0_ci95": [lo0, hi0],
               "n_samples": [len(d1), len(sp), len(d0)], **counters.get(test, {})}
        if test.startswith("pp"):
            row["verdict"] = "within 3%" if abs(rat - 1) <= 0.03 else \
                ("faster" if rat > 1 else "slower") + " by more than 3%"
        else:
            row["verdict"] = ("no slower beyond noise" if hi >= 1.0 else "slower") + \
                (", no SparQ call" if row.get("sparq_calls") == 0 else ", SparQ RAN below the threshold")
        rows.append(row)

    st = rows[0].get("settings", {})
    meta = {
        **run_meta(args.threads, load0),
        "model": f"{model} ({desc})",
        "sparq": f"defaults: r={st.get('sparq_r')} (d/4, scaled basis), k={st.get('sparq_k')}, l={st.get('sparq_l')}, dense "
                 f"threshold {st.get('sparq_min_kv')} KV cells; F16 cache, batch 1",
        "timing": f"llama-bench t/s samples; per test: {args.rounds} rounds x (one -fa 1 process with --sparq 0,1,0,1 "
                  f"and one -fa 0 dense process), {args.reps} reps per instance; ratio = mean SparQ t/s / mean dense "
                  "t/s with a bootstrap 95% interval",
        "counters": "sparq_calls / sparq_dense: attention calls (layers x ubatches) in llama-bench's timed runs that "
                    "ran SparQ / dense in the SparQ runs; below the threshold sparq_calls must be 0",
        "llama_bench_commands": cmds,
    }
    stem = out_stem(args.out_dir, args.tag)
    write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows, "llama_bench": raw})
    md = [f"# SparQ overhead where it does not apply: {args.tag}", ""] + \
         md_bullets((k, v) for k, v in meta.items() if k != "llama_bench_commands") + \
         ["- **llama_bench_commands**: in the JSON", "",
          "| test | dense -fa 1 t/s | SparQ on t/s | SparQ / dense (95% CI) | dense -fa 0 t/s | SparQ / dense -fa 0 "
          "(95% CI) | SparQ calls / dense calls | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['test']} | {r['dense_fa1_ts']:.2f} ± {r['dense_fa1_sd']:.2f} | {r['sparq_ts']:.2f} ± "
                  f"{r['sparq_sd']:.2f} | {r['ratio']:.3f} ({r['ratio_ci95'][0]:.3f}-{r['ratio_ci95'][1]:.3f}) | "
                  f"{r['dense_fa0_ts']:.2f} ± {r['dense_fa0_sd']:.2f} | {r['ratio_vs_fa0']:.3f} "
                  f"({r['ratio_vs_fa0_ci95'][0]:.3f}-{r['ratio_vs_fa0_ci95'][1]:.3f}) | "
                  f"{r.get('sparq_calls')} / {r.get('sparq_dense')} | {r['verdict']} |")
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md[-len(rows) - 2:]))
    print(f"written: {stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
