#!/usr/bin/env python3
"""Decode speed at long context, up to a million tokens: dense attention, SparQ and the
vector-index selector, end to end through the fork's llama-bench.

The model is synthetic with Llama 3 8B's per-layer shapes (GQA: 32 query heads, 8 KV heads
of 128; ``llama_sparq.models.make_gqa_shape``), one layer by default, so that a 1M-token F16
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

    python bench/long_context.py                                  # S = 64K, 256K, 1M
    python bench/long_context.py --S 65536 --n-gen 4 --reps 1 --tag /tmp/lc_quick

Writes bench/results/<tag>.{csv,json,md,png} with the command, machine, threads, commit,
the llama-bench command lines, the counters that prove each SparQ row ran (``sparq_calls``)
and their cost-model compression. A point whose cache would not fit in 60 % of the available
memory is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, command_line, cpu_model, git_commit, loadavg, machine_line, md_bullets,  # noqa: E402
                      mem_available, now_iso, pyplot, run_checked, write_csv, write_json)

from llama_sparq import tool_path  # noqa: E402
from llama_sparq.models import GQA_SHAPE, gqa_shape_path  # noqa: E402

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


def run_bench(exe: Path, model: Path, S: int, args, extra: list[str]) -> tuple[list[dict], str, float]:
    cmd = [str(exe), "-m", str(model), "-p", "0", "-n", str(args.n_gen), "-d", str(S), "-r", str(args.reps),
           "-t", str(args.threads), "--depth-fill", "synthetic", "-o", "json", *extra]
    t0 = time.monotonic()
    p = run_checked(cmd, f"llama-bench failed at S={S}")
    wall = time.monotonic() - t0
    return json.loads(p.stdout), shlex.join(cmd), wall


def measure(exe: Path, model: Path, S: int, args) -> tuple[list[dict], list[str]]:
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
        res, cmd, wall = run_bench(exe, model, S, args, extra)
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


def write(args, rows, meta):
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        r, c = measure(exe, model, S, args)
        rows += r
        cmds += c
    d = GQA_SHAPE["n_embd"] // GQA_SHAPE["n_head"]
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
        "sparq": "library defaults: r = d/4 = 32, k = 128, l = 32, scaled basis, mean-V; dense threshold 0 "
                 "(--sparq-min-kv 0: every decode step runs SparQ); index: k = 128, l = 32, the lists and "
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
    out = write(args, rows, meta)
    print(Path(f"{out}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
