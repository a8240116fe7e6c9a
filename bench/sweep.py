#!/usr/bin/env python3
"""Decode-speed sweeps through the fork's llama-bench, one subcommand per kind of sweep:

    python bench/sweep.py run --tag TAG -- LLAMA-BENCH ARGS   any llama-bench command line, kept with its metadata
    python bench/sweep.py e2e [--model paper] ...             decode time against context length (Appendix D)
    python bench/sweep.py long ...                            64K to 1M tokens: dense, SparQ, the vector index
    python bench/sweep.py overhead [--model gemma3] ...       prompts and short contexts, where SparQ does not run

`python bench/sweep.py SUBCOMMAND -h` lists a subcommand's options; `run --preset NAME` repeats a
recorded llama-bench command line (`run --presets` lists them). Every subcommand writes
bench/results/<tag>.* with the command, machine, commit and the counters that prove SparQ ran.
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
from benchlib import (RESULTS, command_line, cpu_model, dispatch, fit_line, git_commit, iqr_points,  # noqa: E402
                      llama_bench, loadavg, machine_line, md_bullets, md_table, mem_available, now_iso, out_stem,
                      progress, pyplot, run_meta, write_csv, write_json)
from llama_sparq import tool_path  # noqa: E402
from llama_sparq.models import default_model_path, NAMED_MODELS, resolve_model, smollm2_model_path  # noqa: E402
from sparq_lab import cost  # noqa: E402
from sparq_lab.arch_models import MLA_SHAPE, mla_shape_path  # noqa: E402
from sparq_lab.models import GPT_OSS_SHAPE, GQA_SHAPE, gpt_oss_shape_path, gqa_shape_path, paper_shape_path  # noqa: E402


# ============================================================================================= run

RUN_DOC = """Run the fork's llama-bench with SparQ sweeps and keep its results with their metadata.

    python bench/sweep.py run --tag gemma_decode -- -m MODEL --sparq 0,1 -d 0,4096 -p 0 -n 32
    python bench/sweep.py run --preset speed_defaults_gemma3_32k     # a recorded command line again

Everything after `--` goes to llama-bench unchanged (the model may be given as `gemma3`
for the default model, or `smollm2`). Writes bench/results/<tag>.json (llama-bench's JSON rows plus a
"meta" object) and <tag>.md (the metadata, llama-bench's markdown table, and a summary
per depth: dense t/s, SparQ t/s, speedup, and the counters proving SparQ ran).
"""


# The llama-bench command lines of the figures bench/README.md quotes, by their result's tag. The
# defaults of the library they ran with are those of their commit (bench/README.md names it).
RUN_PRESETS = {
    "speed_defaults_gemma3_32k": "-m gemma3 -fa 1 --sparq 0,1 -d 32512 -p 0 -n 16 -r 5 -t 2",
    "speed_defaults_smollm2_8k": "-m smollm2 -fa 1 --sparq 0,1 -d 8000 -p 0 -n 16 -r 5 -t 2",
    "speed_defaults_gemma3_32k_fa0": "-m gemma3 -fa 0 -d 32512 -p 0 -n 16 -r 5 -t 2",
    "speed_defaults_smollm2_8k_fa0": "-m smollm2 -fa 0 -d 8000 -p 0 -n 16 -r 5 -t 2",
    "speed_basis_gemma3": "-m gemma3 -fa 1 --sparq 0,1 --sparq-r 64 --sparq-k 128 --sparq-l 32 --sparq-min-kv 0 "
                          "--sparq-basis scaled,model -d 16384 -p 0 -n 16 -r 5 -t 2",
    "speed_basis_gemma3_32k": "-m gemma3 -fa 1 --sparq 0,1 --sparq-r 64 --sparq-k 128 --sparq-l 32 --sparq-min-kv 0 "
                              "--sparq-basis scaled,model -d 32512 -p 0 -n 16 -r 5 -t 2",
    "speed_gemma3_dense_fa0": "-m gemma3 -fa 0 -d 16384,32512 -p 0 -n 16 -r 5 -t 2",
    "speed_selectors_gemma3": "-m gemma3 -fa 1 --sparq 0,1 --sparq-min-kv 0 --sparq-k 128 --sparq-l 32 "
                              "--sparq-selector sparq,streaming,h2o,index -d 16384 -p 0 -n 16 -r 3 -t 2",
    "speed_index_gemma3_gather": "-m gemma3 -fa 1 --sparq 0,1 --sparq-min-kv 0 --sparq-k 128 --sparq-l 32 "
                                 "--sparq-selector sparq,index -d 16384 -p 0 -n 32 -r 5 -t 2",
}


def run_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=RUN_DOC.split("\n\n")[0])
    ap.add_argument("--tag", default=None, help="the result files' stem (required unless --preset gives it)")
    ap.add_argument("--preset", choices=sorted(RUN_PRESETS), default=None,
                    help="a recorded command line: its llama-bench arguments, its tag unless --tag is given")
    ap.add_argument("--presets", action="store_true", help="list the presets and exit")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--note", default="", help="a sentence on the model and what the run shows")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.presets:
        print("\n".join(f"{k}: {v}" for k, v in RUN_PRESETS.items()))
        return 0
    bargs = [a for a in args.bench_args if a != "--"]
    if args.preset:
        if bargs:
            ap.error("--preset gives llama-bench's arguments: give no others")
        bargs = shlex.split(RUN_PRESETS[args.preset])
        args.tag = args.tag or args.preset
    if not args.tag or not bargs:
        ap.error("give --tag and llama-bench's arguments after --, or --preset NAME")
    if "-m" in bargs and bargs[bargs.index("-m") + 1] in NAMED_MODELS:
        bargs[bargs.index("-m") + 1] = str(resolve_model(bargs[bargs.index("-m") + 1]))
    exe = tool_path("llama-bench")
    load0 = loadavg()
    try:
        rows, _, _ = llama_bench(bargs, exe=exe)
    except RuntimeError as e:
        sys.exit(str(e))
    # llama-bench's own markdown columns, from the same run
    cols = ["model_type", "n_threads", "flash_attn", "sparq", "sparq_selector", "sparq_r", "sparq_k", "sparq_l",
            "sparq_calls", "sparq_dense", "sparq_compr", "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts"]
    cols = [c for c in cols if any(c in r for r in rows)]
    md = md_table(cols, ([f"{r.get(c, ''):.2f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
                         for r in rows))
    res = {"md": "\n".join(md)}
    meta = {
        "command": command_line(),
        "llama_bench": " ".join(shlex.quote(a) for a in [str(exe), *bargs]),
        "machine": machine_line(),
        "load_average_start_end": [load0, loadavg()],
        "commit": git_commit(),
        "date": now_iso(),
        "note": args.note,
    }
    # summary: dense vs SparQ per (test, depth)
    summary = []
    key = lambda r: (r["n_prompt"], r["n_gen"], r["n_depth"])  # noqa: E731
    for k in sorted({key(r) for r in rows}):
        group = [r for r in rows if key(r) == k]
        dense = [r for r in group if r["sparq"] == 0]
        for sp in (r for r in group if r["sparq"] == 1):
            d = dense[0]["avg_ts"] if dense else None
            summary.append({
                "test": f"pp{k[0]}" if k[0] else f"tg{k[1]}", "depth": k[2],
                "selector": sp.get("sparq_selector", "sparq"), "r": sp["sparq_r"], "k": sp["sparq_k"],
                "l": sp["sparq_l"], "dense_ts": d, "sparq_ts": sp["avg_ts"],
                "speedup": sp["avg_ts"] / d if d else None, "sparq_calls": sp["sparq_calls"],
                "dense_calls": sp["sparq_dense"], "compression": sp["sparq_compr"],
            })
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.out_dir / f"{args.tag}.json", {"meta": meta, "summary": summary, "rows": rows})
    lines = [f"# llama-bench: {args.tag}", ""] + md_bullets((k, v) for k, v in meta.items() if v) + [
        "- **counters**: `sparq_calls` = attention calls that ran SparQ (layers x ubatches, warm-up and depth "
        "prefill included), `sparq_dense` = dense calls while SparQ was on (prefill, sliding-window layers, "
        "short context), `sparq_compr` = mean cost-model compression M_sparq/M_dense of the SparQ calls",
        "", res["md"].strip(), "",
        "| test | depth | selector | r | k | l | dense t/s | SparQ t/s | speedup | SparQ calls | dense calls | compression |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        head = f"| {s['test']} | {s['depth']} | {s['selector']} | {s['r']} | {s['k']} | {s['l']} | "
        lines.append(head + (f"{s['dense_ts']:.2f} | {s['sparq_ts']:.2f} | {s['speedup']:.3f} | " if s["dense_ts"] else
                             f"- | {s['sparq_ts']:.2f} | - | ") +
                     f"{s['sparq_calls']} | {s['dense_calls']} | {s['compression']:.4f} |")
    (args.out_dir / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0

# ============================================================================================= e2e

E2E_DOC = """End-to-end decode time against context length, dense and SparQ (the paper's CPU
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

    python bench/sweep.py e2e --model paper --n-layer 2                  # synthetic Llama 2 7B shapes
    python bench/sweep.py e2e --model paper --fill-check 16384           # synthetic fill vs prefill
    python bench/sweep.py e2e --model mla --n-layer 4 --r 144            # synthetic DeepSeek-V2-Lite MLA shapes
    python bench/sweep.py e2e --model gemma3 --fill prefill --tag e2e_gemma3

Writes bench/results/<tag>.{csv,json,md,png} (or <tag>.{json,md} for --fill-check) with
the command, machine, threads, commit, SparQ parameters with compression, and the
counters proving SparQ ran.
"""


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
        cmd = ["-m", str(self.model), "-p", "0", "-n", str(a.n_gen), "-d", str(S),
               "-r", str(a.reps), "-t", str(a.threads), "-fa", str(fa), "-o", "json"]
        if fill == "synthetic" and S > 0:
            cmd += ["--depth-fill", "synthetic"]
        if sparq:
            cmd += ["--sparq", "0,1,0,1", "--sparq-r", str(a.r), "--sparq-k", str(a.k), "--sparq-l", str(a.l),
                    "--sparq-min-kv", "0", "--sparq-gqa", a.gqa, "--sparq-basis", a.basis]
            cmd += ["--sparq-kt-bits", str(a.kt_bits)] if getattr(a, "kt_bits", None) else []
        res, line, _ = llama_bench(cmd, exe=self.exe, what=f"llama-bench failed at S={S}")
        for r in res:
            r["depth_fill"] = fill if S > 0 else "none"
        self.cmds.append(line)
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
        GPT_OSS_SHAPE["n_head"] // GPT_OSS_SHAPE["n_head_kv"] if args.model == "gpt-oss" else \
        MLA_SHAPE["n_head"] if args.model == "mla" else \
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
    if args.model == "gpt-oss":
        n_full = args.n_layer // 2
        return GPT_OSS_SHAPE["head_dim"], GPT_OSS_SHAPE["n_head_kv"], n_full, (
            f"synthetic: gpt-oss-20b's attention (width 2880, 64 query heads on 8 KV heads of 64, sinks), "
            f"{args.n_layer} layers alternating a 128-cell sliding window (dense by design) and full attention "
            f"({n_full} SparQ layers), f32 attention weights standing in for a real layer's bytes per token, "
            "4 experts of 64 instead of 32 of 2880, no 201K-token output projection "
            "(sparq_lab.models.make_gpt_oss_shape)")
    if args.model == "mla":
        m = MLA_SHAPE
        return m["kv_lora"] + m["rope"], 1, args.n_layer, (
            f"synthetic: DeepSeek-V2-Lite's MLA attention (16 query heads over one latent KV head: K 576 = "
            f"kv_lora_rank 512 + RoPE 64, V the first 512 of each K row, then v_mla to heads of 128; width 2048), "
            f"q_lora_rank 1536, one dense FFN of {m['n_ff']} (Lite's active experts), vocabulary 32000, Q8_0 weights, "
            f"random values, {args.n_layer} layers (sparq_lab.arch_models.make_mla_shape)")
    if args.model == "gemma3":
        return 256, 1, 3, ("Gemma 3 270M (Q4_K_M, real weights): 18 layers, of which 3 are global (every sixth) and "
                           "use SparQ; the 15 sliding-window layers (window 512) stay dense by design")
    if args.model == "smollm2":
        return 64, 3, 30, ("SmolLM2 135M Instruct (Q4_1, real weights): 30 layers, all global, 9 query heads on 3 KV "
                           "heads of 64; 8K context")
    return int(os.environ.get("HEAD_DIM", "128")), int(os.environ.get("N_HEAD_KV", "8")), \
        int(os.environ.get("N_LAYER_SPARQ", "1")), "user model (HEAD_DIM, N_HEAD_KV, N_LAYER_SPARQ from the environment)"


def model_dv(args, d: int) -> int:
    """V's head size: MLA's latent (the first kv_lora_rank values of each K row), else K's."""
    return MLA_SHAPE["kv_lora"] if args.model == "mla" else d


def attn_bytes(args, S, d, n_head_kv, sparq: bool) -> float:
    """Bytes one layer's attention moves per decode step with f16 K, V and K^T (the cost model)."""
    dv = model_dv(args, d)
    if dv == d:
        return float(cost.bytes_moved(max(S, 1), d, args.r, k_rows(args), 2, n_head_kv, sparq=sparq))
    f = cost.b_sparq(max(S, 1), d, args.r, k_rows(args), dv=dv) if sparq else cost.b_dense(max(S, 1), d, dv=dv)
    return n_head_kv * float(f)


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
        cnt = r["samples"].get("_counters", [])
        # the op's own count of the bytes it read (its K^T width included) where SparQ ran; else the cost model's
        comp = float(np.mean([x["sparq_compr"] for x in cnt])) if cnt and all(x["sparq_calls"] > 0 for x in cnt) \
            else float(cost.compression(max(S, 1), d, args.r, k_rows(args), dv=model_dv(args, d)))
        r["compression"] = comp
        r["attention_bound"] = 1.0 / comp
        a, b = fits[best]
        y = a * S + b
        r["z_fit"] = min(1.0, max(0.0, (y - b) / y)) if y > 0 else float("nan")
        r["z"] = min(1.0, max(0.0, (med[best] - y0[best]) / med[best]))
        r["amdahl_bound"] = float(cost.amdahl_bound(r["z"], comp))
        r["fraction_of_amdahl"] = r["speedup"] / r["amdahl_bound"]
        dense_bytes = n_lay * attn_bytes(args, S, d, n_head_kv, sparq=False)
        sparq_bytes = n_lay * attn_bytes(args, S, d, n_head_kv, sparq=True)
        r["dense_attn_bytes"], r["sparq_attn_bytes"] = dense_bytes, sparq_bytes
        for c, nbytes in (("dense_fa0", dense_bytes), ("dense_fa1", dense_bytes), ("sparq", sparq_bytes)):
            t_att = med.get(c, float("nan")) - y0.get(c, float("nan"))
            r[f"{c}_attn_GBps"] = nbytes / t_att / 1e9 if S > 0 and t_att > 0 else float("nan")
        r["sparq_calls"] = sum(x["sparq_calls"] for x in cnt)
        r["sparq_dense_calls"] = sum(x["sparq_dense"] for x in cnt)
        r["sparq_compr_counter"] = float(np.mean([x["sparq_compr"] for x in cnt])) if cnt else float("nan")
    return fits, y0


def common_meta(args, bench, model_desc, load0):
    return {
        **run_meta(args.threads, load0),
        "model": f"{bench.model} ({model_desc})",
        "cache": "F16 K and V (and K^T for SparQ), batch 1, one sequence",
        "sparq": f"r={args.r}, k={args.k}, l={args.l}, gqa {args.gqa}, basis {args.basis}, "
                 f"{f'{args.kt_bits}-bit' if getattr(args, 'kt_bits', None) else 'the default'} K^T, dense threshold 0 (SparQ on every decode step); compression "
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


def e2e_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=E2E_DOC.split("\n\n")[0])
    ap.add_argument("--model", default="paper", help="'paper' (synthetic Llama 2 7B shapes), 'gpt-oss' (synthetic "
                    "gpt-oss-20b attention, --n-layer 4 by default), 'mla' (synthetic DeepSeek-V2-Lite MLA shapes), "
                    "'gemma3', 'smollm2', or a GGUF path")
    ap.add_argument("--n-layer", type=int, default=None, help="layers of the synthetic model (default 2; gpt-oss 4)")
    ap.add_argument("--depths", default="0,512,1024,2048,4096,8192,16384,32768,65536,131072,262144")
    ap.add_argument("--fill", choices=("synthetic", "prefill"), default=None,
                    help="how the context is made (default: synthetic for the synthetic models, paper, gpt-oss and "
                         "mla; prefill otherwise)")
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
    ap.add_argument("--kt-bits", type=int, choices=(16, 8, 4), default=None,
                    help="bits per K^T element (sparq_kt_bits; default the fork's)")
    ap.add_argument("--lib", default=None, metavar="DIR",
                    help="another build's llama-bench (a folder holding it, e.g. build/bin of an earlier commit), "
                         "to compare builds; default the installed package's")
    ap.add_argument("--tag", default="e2e_paper_shape")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.n_layer is None:
        args.n_layer = 4 if args.model == "gpt-oss" else 2
    if args.fill is None:
        args.fill = "synthetic" if args.model in ("paper", "gpt-oss", "mla") else "prefill"

    tqdm = progress()

    if args.model == "paper":
        model = paper_shape_path(args.n_layer)
    elif args.model == "gpt-oss":
        model = gpt_oss_shape_path(args.n_layer)
    elif args.model == "mla":
        model = mla_shape_path(args.n_layer)
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

# ============================================================================================= long

LONG_DOC = """Decode speed at long context, up to a million tokens: dense attention, SparQ and the
vector-index selector, end to end through the fork's llama-bench.

The model is synthetic with Llama 3 8B's per-layer shapes (GQA: 32 query heads, 8 KV heads
of 128; ``sparq_lab.models.make_gqa_shape``), one layer by default, so that a 1M-token F16
cache (K, V and SparQ's K^T: 6 GiB per layer) fits in memory. The share of decode time spent
in attention depends on the per-layer shapes and S, not on the layer count (each layer adds
the same weights and the same cache); the output projection (32000 x 4096, Q8_0) is read once
per token whatever the layer count, so with one layer it makes the fixed part larger than in
the 32-layer model and the speedups here understate that model's.

Per context length S, separate llama-bench processes (``-p 0 -n N -d S --depth-fill
synthetic``: random K and V written straight into the cache, no prefill; every SparQ step
runs, dense threshold 0):

- ``dense_fa0``: dense, upstream's KQ-product path (``-fa 0``, with ``-ub 1``: its context
  otherwise reserves a KQ product of 512 x S x 32 f32, 64 GiB at 1M; decode steps have one token);
- ``dense_fa1``: dense, upstream's flash attention (``-fa 1``);
- ``sparq``: SparQ with the library's defaults (``--sparq 1``);
- ``index``: the vector-index selector (``--sparq-selector index``) at each
  ``--index-lists`` x ``--index-probe``; llama-bench trains the index and files every cell
  before the timed runs (``llama_sparq_sync``, untimed), and each process's wall time, which
  includes the fill and that training, is recorded.

    python bench/sweep.py long                                  # S = 64K, 256K, 1M
    python bench/sweep.py long --S 65536 --n-gen 4 --reps 1 --tag /tmp/lc_quick

Writes bench/results/<tag>.{csv,json,md,png} with the command, machine, threads, commit,
the llama-bench command lines, the counters that prove each SparQ row ran (``sparq_calls``)
and their cost-model compression. A point whose cache would not fit in 60 % of the available
memory is skipped with a note.
"""


COLUMNS = ["S", "variant", "index_lists", "index_probe", "tokens_per_s", "tokens_per_s_std", "ms_per_token",
           "speedup_vs_best_dense", "speedup_vs_fa1", "sparq_calls", "sparq_compr", "process_wall_s"]


def int_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a comma list of integers")
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"'{s}': the values must be positive integers")
    return out


def cache_bytes(S: int, n_layer: int) -> int:
    """K, V and K^T in F16 for S cells (the index's list ids and centroids are below 1 % of it)."""
    d = GQA_SHAPE["n_embd"] // GQA_SHAPE["n_head"]
    return 3 * S * GQA_SHAPE["n_head_kv"] * d * 2 * n_layer


def long_measure(exe: Path, model: Path, S: int, args) -> tuple[list[dict], list[str]]:
    # -fa 0 reserves a KQ product of n_ubatch x S x heads f32 (64 GiB at 1M with the default 512):
    # decode steps have one token, so a ubatch of 1 changes nothing but that reservation
    runs = [("dense_fa0", ["-fa", "0", "--sparq", "0", "-ub", "1"]),
            ("dense_fa1", ["-fa", "1", "--sparq", "0"]),
            ("sparq", ["-fa", "1", "--sparq", "1", "--sparq-min-kv", "0"]),
            ("index", ["-fa", "1", "--sparq", "1", "--sparq-min-kv", "0", "--sparq-selector", "index",
                       "--sparq-index-lists", ",".join(map(str, args.index_lists)),
                       "--sparq-index-probe", ",".join(map(str, args.index_probe))])]
    rows, cmds = [], []
    for name, extra in runs:
        if name in args.skip:
            continue
        print(f"S={S} {name} ...", file=sys.stderr, flush=True)
        res, cmd, p = llama_bench(["-m", model, "-p", "0", "-n", args.n_gen, "-d", S, "-r", args.reps,
                                   "-t", args.threads, "--depth-fill", "synthetic", *extra],
                                  exe=exe, what=f"llama-bench failed at S={S}")
        wall = p.wall_s
        cmds.append(cmd)
        for r in res:
            sp = bool(r.get("sparq"))
            if sp and r.get("sparq_calls", 0) <= 0:
                raise RuntimeError(f"S={S} {name}: the counters show no SparQ call: {cmd}")
            rows.append({
                "S": S, "variant": name,
                "index_lists": r.get("sparq_index_lists") if name == "index" else None,
                "index_probe": r.get("sparq_index_probe") if name == "index" else None,
                "tokens_per_s": r["avg_ts"], "tokens_per_s_std": r["stddev_ts"], "ms_per_token": 1e3 / r["avg_ts"],
                "sparq_calls": r.get("sparq_calls") if sp else 0,
                "sparq_compr": r.get("sparq_compr") if sp else None,
                "sparq_r": r.get("sparq_r"), "sparq_k": r.get("sparq_k"), "sparq_l": r.get("sparq_l"),
                "process_wall_s": wall / len(res), "samples_ns": r.get("samples_ns"),
            })
    dense = {r["variant"]: r["tokens_per_s"] for r in rows if r["variant"].startswith("dense")}
    for r in rows:
        best = max(dense.values()) if dense else None
        r["speedup_vs_best_dense"] = r["tokens_per_s"] / best if best else None
        r["speedup_vs_fa1"] = r["tokens_per_s"] / dense["dense_fa1"] if "dense_fa1" in dense else None
    return rows, cmds


def label(r: dict) -> str:
    if r["variant"] == "index":
        return f"index ({r['index_lists']} lists, {r['index_probe']} probed)"
    return {"dense_fa0": "dense -fa 0", "dense_fa1": "dense -fa 1 (flash attention)",
            "sparq": "SparQ (defaults)"}[r["variant"]]


def fmt(v, nd=2):
    if v is None:
        return ""
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def meta_value(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def long_write(args, rows, meta):
    out = args.out_dir / args.tag if not args.tag.startswith("/") else Path(args.tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(f"{out}.csv", (f"{k}: {meta_value(v)}" for k, v in meta.items()), COLUMNS,
              (["" if r.get(c) is None else r[c] for c in COLUMNS] for r in rows))
    write_json(f"{out}.json", {"meta": meta, "columns": COLUMNS, "rows": rows})
    lines = [f"# Long-context decode: {args.tag}", ""] + md_bullets(
        (k, meta_value(v)) for k, v in meta.items() if k != "llama_bench_commands")
    lines += ["", "| S | variant | tokens/s | ms/token | vs best dense | vs -fa 1 | SparQ calls | compression | "
              "process wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['S']} | {label(r)} | {r['tokens_per_s']:.2f} ± {r['tokens_per_s_std']:.2f} | "
                     f"{r['ms_per_token']:.1f} | {fmt(r['speedup_vs_best_dense'])}x | {fmt(r['speedup_vs_fa1'])}x | "
                     f"{r['sparq_calls']} | {fmt(r['sparq_compr'], 4)} | {r['process_wall_s']:.0f} |")
    lines += ["", "## llama-bench command lines", ""] + [f"- `{c}`" for c in meta["llama_bench_commands"]]
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    try:
        plt = pyplot()
    except ImportError:
        return out
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for lab in dict.fromkeys(label(r) for r in rows):
        pts = sorted((r["S"], r["ms_per_token"]) for r in rows if label(r) == lab)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lab)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length S (tokens)")
    ax.set_ylabel("decode time per token (ms)")
    ax.set_title(f"{meta['model_short']}, {args.threads} threads\n{meta['machine_short']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=110)
    return out


def long_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=LONG_DOC.split("\n\n")[0])
    ap.add_argument("--S", type=int_list, default=[65536, 262144, 1048576], help="context lengths (comma list)")
    ap.add_argument("--n-layer", type=int, default=1)
    ap.add_argument("--n-gen", type=int, default=8, help="tokens decoded per timed run")
    ap.add_argument("--reps", type=int, default=2, help="timed runs per variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--index-lists", type=int_list, default=[256, 1024])
    ap.add_argument("--index-probe", type=int_list, default=[16])
    ap.add_argument("--skip", default="", help="variants left out (comma list of dense_fa0, dense_fa1, sparq, index)")
    ap.add_argument("--tag", default="long_context_gqa_shape", help="result file stem (or an absolute path stem)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.skip = {s for s in args.skip.split(",") if s}
    bad = args.skip - {"dense_fa0", "dense_fa1", "sparq", "index"}
    if bad:
        ap.error(f"--skip: {sorted(bad)} not allowed (dense_fa0, dense_fa1, sparq, index)")
    if args.n_layer < 1 or args.n_gen < 1 or args.reps < 1 or args.threads < 1:
        ap.error("--n-layer, --n-gen, --reps and --threads must be positive")

    exe = tool_path("llama-bench")
    model = gqa_shape_path(args.n_layer)
    load0 = loadavg()
    rows, cmds, skipped = [], [], []
    avail = mem_available()
    for S in args.S:
        need = cache_bytes(S, args.n_layer)
        if avail and need > 0.6 * avail:
            skipped.append(f"S={S}: the cache needs {need / 2**30:.1f} GiB, over 60 % of {avail / 2**30:.1f} GiB available")
            print(f"skipped {skipped[-1]}", file=sys.stderr)
            continue
        r, c = long_measure(exe, model, S, args)
        rows += r
        cmds += c
    d = GQA_SHAPE["n_embd"] // GQA_SHAPE["n_head"]
    sp_set = ", ".join(sorted({f"{r['sparq_r']} / {r['sparq_k']} / {r['sparq_l']}" for r in rows
                               if r["variant"] == "sparq"})) or "not run"
    meta = {
        "command": command_line(),
        "machine": machine_line(args.threads),
        "machine_short": f"{cpu_model()}",
        "load_average_start_end": [load0, loadavg()],
        "commit": git_commit(),
        "date": now_iso(),
        "model": (f"{model}: synthetic, Llama 3 8B per-layer shapes (width 4096, 32 query heads and 8 KV heads of "
                  f"{d}, FFN 14336), vocabulary 32000, Q8_0 weights, random values, {args.n_layer} layer(s). The "
                  "share of decode time in attention depends on per-layer shapes and S, not on the layer count; "
                  "the output projection (32000 x 4096 Q8_0, 139 MB) is read once per token whatever the layer "
                  "count, so with few layers the fixed part is larger than the 32-layer model's and the speedups "
                  "here understate it"),
        "model_short": f"Llama 3 8B per-layer shapes (GQA 32/8, d {d}), {args.n_layer} layer(s), synthetic",
        "cache": "F16 K and V (and K^T for the SparQ rows), batch 1, one sequence, filled by llama-bench "
                 "--depth-fill synthetic (zero-mean unit-variance random K and V, no prefill)",
        "sparq": f"the library's defaults, as llama-bench reports them (sparq_r / sparq_k / sparq_l: {sp_set}; "
                 "0 / 0 / -1 are r by the K^T's width, the calibrated k and the default window); dense threshold "
                 "0 (--sparq-min-kv 0: every decode step runs SparQ); index: k = 128, l = 32, the lists and "
                 "probes in each row; compression = the counters' cost-model M_sparq/M_dense (for the index "
                 "it assumes lists of even size)",
        "timing": f"llama-bench -p 0 -n {args.n_gen} -d S -r {args.reps}: mean and standard deviation of the "
                  "tokens/s of the timed runs; one process per variant and S (process_wall_s includes the fill "
                  "and, for the index, its training and the filing of every cell, divided over the process's rows)",
        "counters": "sparq_calls = attention calls that ran SparQ in the timed runs (layers x tokens x reps), "
                    "sparq_compr = their mean cost-model compression",
        "skipped": skipped,
        "llama_bench_commands": cmds,
    }
    out = long_write(args, rows, meta)
    print(Path(f"{out}.md").read_text())
    return 0

# ============================================================================================= overhead

OVERHEAD_DOC = """What SparQ costs where it does not help: prompt processing (SparQ keeps K^T and the V
sums up to date on every prompt ubatch) and decode after short contexts (below the dense
threshold, where every step stays dense).

With SparQ at its defaults (r = d/4, scaled basis, k = 128, l = k/4, dense threshold 1024 cells), the
fork's llama-bench times prompt processing (``-p N -n 0``) and decode after a short
context (``-p 0 -n 32 -d S``, S < 1024), SparQ on against dense, interleaved in one
process (``--sparq 0,1,0,1``), for several rounds of processes. Dense runs with
upstream's flash-attention path (``-fa 1``, which SparQ needs and ``-fa auto`` picks on
CPU) and, for reference, with ``-fa 0``.

    python bench/sweep.py overhead --model paper --tag overhead_paper_shape
    python bench/sweep.py overhead --model gemma3 --tag overhead_gemma3

Writes bench/results/<tag>.{json,md} with the command, machine, threads, commit, the
SparQ settings and the counters (no SparQ call may run below the threshold).
"""


def ratio_ci(num, den, n_boot=4000, seed=0):
    """Ratio of the means num/den with a bootstrap 95% interval."""
    rng = np.random.default_rng(seed)
    num, den = np.asarray(num, float), np.asarray(den, float)
    bn = rng.choice(num, (n_boot, len(num))).mean(1)
    bd = rng.choice(den, (n_boot, len(den))).mean(1)
    lo, hi = np.percentile(bn / bd, [2.5, 97.5])
    return float(num.mean() / den.mean()), float(lo), float(hi)


def overhead_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=OVERHEAD_DOC.split("\n\n")[0])
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
        res, cmd, _ = llama_bench(["-m", model, "-r", args.reps, "-t", args.threads, *extra, *xs], exe=exe)
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
        "sparq": f"defaults: r={st.get('sparq_r')}, k={st.get('sparq_k')}, l={st.get('sparq_l')} (0 / 0 / -1: r by the "
                 f"K^T's width, the calibrated k, the default window), scaled basis, dense "
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


# ============================================================================================= the subcommands

SUBCOMMANDS = {"run": run_main, "e2e": e2e_main, "long": long_main, "overhead": overhead_main}


def main(argv=None) -> int:
    return dispatch(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
