#!/usr/bin/env python3
"""Two builds of the SparQ op timed against each other, interleaved, on the same machine.

A change that should cost no speed (a restructure, a refactor of a kernel) is checked by
timing the op of the build before it (``--before``: a folder holding that build's
``sparq-op-bench``, e.g. a copy of an installed ``llama_sparq/lib``) and of this build
(``--after``, default the installed package's) in alternation: per round and per point,
before then after in even rounds and after then before in odd ones (the first of two runs
tends to be slower here), so slow drifts of a shared 2-core machine hit both alike. Each run times
``--reps`` repetitions of SparQ alone (bench/native/sparq-op-bench.cpp, Llama 2 7B attention
shapes by default: 32 heads of 128, MHA, f16 cache and K^T, one decode row, r/k/l as given;
``--heads/--head-kv/--d`` for another layer's shape, ``--kt-bits 8`` for the 8-bit K^T).

Writes <tag>.json and <tag>.md into --out-dir (default bench/results): per point the median
over rounds of each round's median, the ratio after/before, and the spread of the ratio over
the rounds, with the command, machine and commit. The op is a graph node of its own there, so
there are no llama counters: the SparQ op is what is timed.

    python bench/op_ab.py --before /tmp/base_pkg/llama_sparq/lib --tag op_ab_restructure
"""

from __future__ import annotations

import argparse
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, loadavg, md_bullets, md_table, op_bench_times, out_stem, run_meta, write_json  # noqa: E402


def time_op(exe: Path, S: int, args) -> float:
    """Median us of one sparq-op-bench run of the SparQ op alone."""
    times = op_bench_times(exe, S=S, batch=1, heads=args.heads, head_kv=args.head_kv, d=args.d, r=args.r, k=args.k,
                           l=args.k // 4, threads=args.threads, reps=args.reps, ops=("sparq",), kt_bits=args.kt_bits)
    return st.median(times["sparq"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--kt-bits", type=int, default=16, choices=(16, 8), help="K^T width (default 16)")
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
            sys.exit(f"op_ab: --{name}: {exe} does not exist (a folder holding sparq-op-bench is needed)")
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
                     f"heads, batch 1, f16 cache, {args.kt_bits}-bit K^T; compression (kt_bits / 16) r/2d + k/S asymptotically "
                     f"({args.r * args.kt_bits / 16 / (2 * args.d):.3f} + k/S)",
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
    print(f"op_ab: written {stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
