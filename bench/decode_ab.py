#!/usr/bin/env python3
"""Two builds' SparQ decode on real text, end to end, timed against each other in alternation.

``op_ab.py`` times the op alone on the paper's shapes; this times what a user sees on a real
model: ``decode_profile.py``'s steady greedy decode from the same prefilled state (SparQ's
defaults), once with the build in ``--before`` (a folder holding that build's libraries, e.g. a
copy of an installed ``llama_sparq/lib``, given as ``LLAMA_SPARQ_LIB_DIR``) and once with
``--after`` (default: the installed package's), ``--rounds`` times, before first in even rounds
and after first in odd ones, so that the drifts of a shared machine hit both alike. Each round also
times the dense paths of ``--dense`` (upstream's, with the after build): f16 ``-fa 1`` and
``-fa 0`` and a q8_0 cache, so that both builds stand beside the fastest dense of the same minutes.

    python bench/decode_ab.py --before /tmp/base_lib --model smollm2 --tokens 8000 --tag decode_ab_smollm2

Writes bench/results/<tag>.json and .md: the command, machine, commit, both folders, every
round's tokens/s and counters, the medians, the best of each, the median of the rounds'
after/before ratios, and each build over the fastest dense path. Each SparQ run must have made
SparQ calls.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics as st
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, loadavg, md_bullets, md_table, out_stem, run_meta, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"^(\w+): ([0-9.]+) tokens/s over (\d+) steps; SparQ calls (\d+), .*compression ([0-9.]+)$", re.M)
DENSE = {"f16_fa1": ("f16", 1), "f16_fa0": ("f16", 0), "q8_0_fa1": ("q8_0", 1)}


def run_once(lib: Path | None, args, dense: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("LLAMA_SPARQ_LIB_DIR", None)
    if lib is not None:
        env["LLAMA_SPARQ_LIB_DIR"] = str(lib)
    cmd = [sys.executable, str(HERE / "decode_profile.py"), "--model", args.model, "--tokens", str(args.tokens),
           "--steps", str(args.steps), "--threads", str(args.threads), "--state-dir", str(args.state_dir)]
    if dense:
        ct, fa = DENSE[dense]
        cmd += ["--mode", "dense", "--cache-type", ct, "--flash-attn", str(fa)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"decode_profile.py failed with {lib or 'the installed package'}:\n"
                         f"{p.stdout[-1500:]}{p.stderr[-3000:]}")
    return {"tokens_per_s": float(m.group(2)), "sparq_calls": int(m.group(4)), "compression": float(m.group(5))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="folder with the earlier build's libraries")
    ap.add_argument("--after", type=Path, default=None, help="folder with this build's (default: the package's)")
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a GGUF path (default smollm2)")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=200, help="decode steps per run (default 200)")
    ap.add_argument("--rounds", type=int, default=10, help="before/after alternations (default 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dense", default="f16_fa1,f16_fa0,q8_0_fa1",
                    help="dense paths timed each round beside SparQ (default f16_fa1,f16_fa0,q8_0_fa1)")
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/llama_sparq_profile"))
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="decode_ab")
    args = ap.parse_args(argv)
    for name, lib in (("--before", args.before), ("--after", args.after)):
        if lib is not None and not (lib / "libllama.so").is_file():
            ap.error(f"{name} {lib}: no libllama.so there (give a folder of a build's libraries)")
    if args.rounds < 1 or args.steps < 2:
        ap.error("--rounds must be >= 1 and --steps >= 2")
    dense = [d for d in args.dense.split(",") if d]
    if not dense or set(dense) - set(DENSE):
        ap.error(f"--dense takes a comma list of {', '.join(DENSE)}; got {args.dense!r}")
    load0 = loadavg()
    meta = run_meta(args.threads, load0)

    # the prefills, kept for every run
    one = argparse.Namespace(**{**vars(args), "steps": 1})
    run_once(args.after, one)
    for d in dense:
        run_once(args.after, one, d)
    rounds = []
    for i in range(args.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        r = {}
        for which in (*order, *(f"dense_{d}" for d in dense)):
            d = which[len("dense_"):] if which.startswith("dense_") else None
            r[which] = run_once(args.before if which == "before" else args.after, args, d)
            print(f"round {i + 1}/{args.rounds} {which}: {r[which]['tokens_per_s']:.2f} tokens/s", flush=True)
        if r["before"]["sparq_calls"] <= 0 or r["after"]["sparq_calls"] <= 0:
            raise SystemExit(f"round {i + 1}: a SparQ run made no SparQ call")
        rounds.append(r)
    b = [r["before"]["tokens_per_s"] for r in rounds]
    a = [r["after"]["tokens_per_s"] for r in rounds]
    ratios = [y / x for x, y in zip(b, a)]
    dense_med = {d: st.median(r[f"dense_{d}"]["tokens_per_s"] for r in rounds) for d in dense}
    fastest = max(dense_med, key=dense_med.get)
    summary = {"before_median": st.median(b), "after_median": st.median(a), "before_best": max(b),
               "after_best": max(a), "ratio_of_medians": st.median(a) / st.median(b),
               "median_of_ratios": st.median(ratios), "ratio_min_max": [min(ratios), max(ratios)],
               "dense_medians": dense_med, "fastest_dense": fastest,
               "before_over_fastest_dense": st.median(b) / dense_med[fastest],
               "after_over_fastest_dense": st.median(a) / dense_med[fastest]}
    doc = {**meta, "load_average_start_end": [load0, loadavg()], "before": str(args.before),
           "after": str(args.after or "the installed package"), "model": args.model, "tokens": args.tokens,
           "steps": args.steps, "rounds": rounds, "summary": summary}
    stem = out_stem(args.out_dir, args.tag)
    write_json(stem.with_suffix(".json"), doc)
    lines = [f"# End-to-end decode, two builds in alternation: {args.tag}", ""]
    lines += md_bullets([("command", meta["command"]), ("machine", meta["machine"]),
                         ("load_average_start_end", doc["load_average_start_end"]), ("commit", meta["commit"]),
                         ("date", meta["date"]), ("before", doc["before"]), ("after", doc["after"]),
                         ("decode", f"{args.model}, {args.tokens} tokens of the Python documentation, "
                                    f"{args.steps} greedy steps per run with SparQ's defaults (decode_profile.py)")])
    lines += ["", *md_table(["round", "before t/s", "after t/s", "after / before",
                             *(f"dense {d} t/s" for d in dense), "SparQ calls (before, after)",
                             "compression (before, after)"],
                            [[str(i + 1), f"{r['before']['tokens_per_s']:.2f}", f"{r['after']['tokens_per_s']:.2f}",
                              f"{q:.3f}", *(f"{r[f'dense_{d}']['tokens_per_s']:.2f}" for d in dense),
                              f"{r['before']['sparq_calls']}, {r['after']['sparq_calls']}",
                              f"{r['before']['compression']:.4f}, {r['after']['compression']:.4f}"]
                             for i, (r, q) in enumerate(zip(rounds, ratios))])]
    s = summary
    dm = ", ".join(f"{d} {v:.2f}" for d, v in dense_med.items())
    lines += ["", f"Medians: before {s['before_median']:.2f}, after {s['after_median']:.2f} tokens/s "
                  f"(**{s['ratio_of_medians']:.3f}x**); the rounds' ratios: median {s['median_of_ratios']:.3f}, "
                  f"from {s['ratio_min_max'][0]:.3f} to {s['ratio_min_max'][1]:.3f}; best runs: before "
                  f"{s['before_best']:.2f}, after {s['after_best']:.2f}. Dense (upstream's, the after build), "
                  f"medians: {dm}; the fastest, `{fastest}`: before {s['before_over_fastest_dense']:.2f}x, "
                  f"after **{s['after_over_fastest_dense']:.2f}x** of it.", ""]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines[-2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
