#!/usr/bin/env python3
"""Two builds' SparQ decode on real text, end to end, timed against each other in alternation.

``op_ab.py`` times the op alone on the paper's shapes; this times what a user sees on a real
model: ``decode_profile.py``'s steady greedy decode from the same prefilled state (SparQ's
defaults), once with the build in ``--before`` (a folder holding that build's libraries, e.g. a
copy of an installed ``llama_sparq/lib``, given as ``LLAMA_SPARQ_LIB_DIR``) and once with
``--after`` (default: the installed package's), ``--rounds`` times, before first in even rounds
and after first in odd ones, so that the drifts of a shared machine hit both alike.

    python bench/decode_ab.py --before /tmp/base_lib --model smollm2 --tokens 8000 --tag decode_ab_smollm2

Writes bench/results/<tag>.json and .md: the command, machine, commit, both folders, every
round's tokens/s and counters, the medians, the best of each, and the median of the rounds'
after/before ratios. Each run must have made SparQ calls.
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
LINE = re.compile(r"^sparq: ([0-9.]+) tokens/s over (\d+) steps; SparQ calls (\d+), .*compression ([0-9.]+)$", re.M)


def run_once(lib: Path | None, args) -> dict:
    env = dict(os.environ)
    env.pop("LLAMA_SPARQ_LIB_DIR", None)
    if lib is not None:
        env["LLAMA_SPARQ_LIB_DIR"] = str(lib)
    cmd = [sys.executable, str(HERE / "decode_profile.py"), "--model", args.model, "--tokens", str(args.tokens),
           "--steps", str(args.steps), "--threads", str(args.threads), "--state-dir", str(args.state_dir)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"decode_profile.py failed with {lib or 'the installed package'}:\n"
                         f"{p.stdout[-1500:]}{p.stderr[-3000:]}")
    return {"tokens_per_s": float(m.group(1)), "sparq_calls": int(m.group(3)), "compression": float(m.group(4))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="folder with the earlier build's libraries")
    ap.add_argument("--after", type=Path, default=None, help="folder with this build's (default: the package's)")
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a GGUF path (default smollm2)")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=200, help="decode steps per run (default 200)")
    ap.add_argument("--rounds", type=int, default=10, help="before/after alternations (default 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/llama_sparq_profile"))
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="decode_ab")
    args = ap.parse_args(argv)
    for name, lib in (("--before", args.before), ("--after", args.after)):
        if lib is not None and not (lib / "libllama.so").is_file():
            ap.error(f"{name} {lib}: no libllama.so there (give a folder of a build's libraries)")
    if args.rounds < 1 or args.steps < 2:
        ap.error("--rounds must be >= 1 and --steps >= 2")
    load0 = loadavg()
    meta = run_meta(args.threads, load0)

    run_once(args.after, argparse.Namespace(**{**vars(args), "steps": 1}))  # the prefill, kept for every run
    rounds = []
    for i in range(args.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        r = {}
        for which in order:
            r[which] = run_once(args.before if which == "before" else args.after, args)
            print(f"round {i + 1}/{args.rounds} {which}: {r[which]['tokens_per_s']:.2f} tokens/s", flush=True)
        rounds.append(r)
    b = [r["before"]["tokens_per_s"] for r in rounds]
    a = [r["after"]["tokens_per_s"] for r in rounds]
    ratios = [y / x for x, y in zip(b, a)]
    summary = {"before_median": st.median(b), "after_median": st.median(a), "before_best": max(b),
               "after_best": max(a), "ratio_of_medians": st.median(a) / st.median(b),
               "median_of_ratios": st.median(ratios), "ratio_min_max": [min(ratios), max(ratios)]}
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
    lines += ["", *md_table(["round", "before t/s", "after t/s", "after / before", "SparQ calls (before, after)",
                             "compression (before, after)"],
                            [[str(i + 1), f"{r['before']['tokens_per_s']:.2f}", f"{r['after']['tokens_per_s']:.2f}",
                              f"{q:.3f}", f"{r['before']['sparq_calls']}, {r['after']['sparq_calls']}",
                              f"{r['before']['compression']:.4f}, {r['after']['compression']:.4f}"]
                             for i, (r, q) in enumerate(zip(rounds, ratios))])]
    s = summary
    lines += ["", f"Medians: before {s['before_median']:.2f}, after {s['after_median']:.2f} tokens/s "
                  f"(**{s['ratio_of_medians']:.3f}x**); the rounds' ratios: median {s['median_of_ratios']:.3f}, "
                  f"from {s['ratio_min_max'][0]:.3f} to {s['ratio_min_max'][1]:.3f}; best runs: before "
                  f"{s['before_best']:.2f}, after {s['after_best']:.2f}.", ""]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines[-2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
