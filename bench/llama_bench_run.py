#!/usr/bin/env python3
"""Run the fork's llama-bench with SparQ sweeps and keep its results with their metadata.

    python bench/llama_bench_run.py --tag gemma_decode -- -m MODEL --sparq 0,1 -d 0,4096 -p 0 -n 32

Everything after `--` goes to llama-bench unchanged (the model may be given as `gemma3`
for the default model, or `smollm2`). Writes bench/results/<tag>.json (llama-bench's JSON rows plus a
"meta" object) and <tag>.md (the metadata, llama-bench's markdown table, and a summary
per depth: dense t/s, SparQ t/s, speedup, and the counters proving SparQ ran).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, command_line, git_commit, loadavg, machine_line, md_bullets, md_table,  # noqa: E402
                      now_iso, write_json)

from llama_sparq import tool_path  # noqa: E402
from llama_sparq.models import NAMED_MODELS, resolve_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--note", default="", help="a sentence on the model and what the run shows")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    bargs = [a for a in args.bench_args if a != "--"]
    if "-m" in bargs and bargs[bargs.index("-m") + 1] in NAMED_MODELS:
        bargs[bargs.index("-m") + 1] = str(resolve_model(bargs[bargs.index("-m") + 1]))
    exe = tool_path("llama-bench")
    load0 = loadavg()
    p = subprocess.run([str(exe), *bargs, "-o", "json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"llama-bench failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = json.loads(p.stdout)
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


if __name__ == "__main__":
    sys.exit(main())
