#!/usr/bin/env python3
"""Where SparQ's CUDA kernels spend their time, line by line, inside a real decode step.

Needs an NVIDIA GPU, the CUDA build (whose kernels carry line tables: ``-lineinfo``) and Nsight
Compute (``ncu``, ``--ncu PATH`` or on PATH or under /usr/local/cuda/bin). For each depth S it
profiles one launch of each of the op's kernels in llama-bench's decode on the paper-shape model
(Llama 2 7B per-layer shapes, 8 layers, Q8_0 weights, F16 cache, ``-ngl 99``, the synthetic fill,
the paper's fixed k), after the first ``--skip-steps`` steps:

    ncu -k 'regex:k_sparq_(score|select|attend)' --launch-skip N --launch-count 3 --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section SourceCounters --import-source yes \\
        -o sel_S llama-bench ... -d S
    ncu -i sel_S.ncu-rep --page details --csv          (duration, SMs active, occupancy)
    ncu -i sel_S.ncu-rep --page source --csv --print-source cuda,sass   (warp samples per source line)

and reduces them to gpu_ncu_lines_<tag>.md (and .json) under bench/results: per kernel its duration, the
share of cycles its SMs were active, registers, occupancy, and the source lines where most warps
were sampled. Unlike ``test-backend-ops perf`` (whose tie-proof inputs put thousands of cells in
the select's crossing bin), these are the scores of a decode step. ``--reduce DIR`` only reduces
the CSVs already in DIR (the tests use it).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, command_line, git_commit, now_iso, write_json  # noqa: E402
from gpu_timeline import run, short_name  # noqa: E402

DETAILS = ("Duration", "Elapsed Cycles", "SM Active Cycles", "Registers Per Thread", "Theoretical Occupancy",
           "Achieved Occupancy", "Grid Size", "Memory Throughput")


def _num(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def parse_details(text: str) -> dict[str, dict]:
    """ncu --page details --csv: per kernel (short name, in launch order) the metrics of DETAILS."""
    out: dict[str, dict] = {}
    rows = list(csv.reader(io.StringIO(text)))
    head = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
    if head is None:
        return out
    h = rows[head]
    ik, im, iv, iu = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
    for r in rows[head + 1:]:
        if len(r) <= max(ik, im, iv, iu) or r[im] not in DETAILS:
            continue
        k = kernel_short(r[ik])
        out.setdefault(k, {})[r[im]] = {"value": r[iv], "unit": r[iu]}
    return out


def kernel_short(name: str) -> str:
    """'void k_sparq_select<(bool)0>(sparq_cu_args)' -> 'k_sparq_select<0>' (Nsight Compute casts
    template arguments, which gpu_timeline's short_name would cut at)"""
    return short_name(name.replace("(bool)", ""))


def parse_source(text: str, top: int = 8) -> dict[str, dict]:
    """ncu --page source --csv --print-source cuda,sass: per kernel the source lines (file:line and
    text) with the most warp samples, and the total. Blocks start with 'Function Name' (the kernel)
    and 'File Path' rows; a source line's row has its line number first, its SASS rows none."""
    per: dict[str, dict] = {}
    kern, path = None, None
    for r in csv.reader(io.StringIO(text)):
        if len(r) == 2 and r[0] == "Function Name":
            kern = kernel_short(r[1])
            per.setdefault(kern, {"samples": 0, "lines": {}})
            continue
        if len(r) == 2 and r[0] == "File Path":
            path = r[1].rsplit("/", 1)[-1]
            continue
        if kern is None or len(r) < 5 or not r[0] or r[0] == "Line No":
            continue
        n = _num(r[4])
        if n is None:
            continue
        key = f"{path}:{r[0]}"
        e = per[kern]["lines"].setdefault(key, {"samples": 0, "source": r[1].strip()[:100]})
        e["samples"] += int(n)
        per[kern]["samples"] += int(n)
    for k, v in per.items():
        lines = sorted(v["lines"].items(), key=lambda kv: -kv[1]["samples"])[:top]
        v["lines"] = [{"where": w, **e} for w, e in lines]
    return per


def markdown(meta: dict, res: dict) -> str:
    out = [f"# SparQ's CUDA kernels line by line in a decode step ({meta['tag']})", "",
           f"- device: {meta.get('device')}", f"- commit: {meta.get('commit')}", f"- date: {meta.get('date')}",
           "- model: paper shape (Llama 2 7B per-layer shapes), 8 layers, Q8_0 weights, F16 cache, -ngl 99, "
           "synthetic fill", f"- SparQ: {meta.get('sparq')}", f"- tool: {meta.get('ncu')}", "", "Commands:", ""]
    out += [f"    {c}" for c in meta.get("commands", [])] + [""]
    for S, r in sorted(res.items(), key=lambda kv: int(kv[0])):
        out += [f"## S = {S}", "", "| kernel | duration | SMs active | grid | registers | occupancy (theoretical / achieved) |",
                "|---|---|---|---|---|---|"]
        for k, d in r["details"].items():
            def g(m):
                return d.get(m, {}).get("value", "-")
            el, act = _num(g("Elapsed Cycles")), _num(g("SM Active Cycles"))
            share = f"{100 * act / el:.0f} %" if el and act is not None else "-"
            out.append(f"| `{k}` | {g('Duration')} {d.get('Duration', {}).get('unit', '')} | {share} | {g('Grid Size')} | "
                       f"{g('Registers Per Thread')} | {g('Theoretical Occupancy')} % / {g('Achieved Occupancy')} % |")
        for k, v in r["source"].items():
            out += ["", f"`{k}`: the source lines with the most warp samples (of {v['samples']})", "",
                    "| share | where | source |", "|---|---|---|"]
            for e in v["lines"]:
                share = 100 * e["samples"] / v["samples"] if v["samples"] else 0
                src = e["source"].replace("|", "\\|")
                out.append(f"| {share:.1f} % | {e['where']} | `{src}` |")
        out.append("")
    return "\n".join(out)


def reduce_dir(d: Path) -> dict:
    res = {}
    for det in sorted(d.glob("details_*.csv")):
        S = det.stem.split("_", 1)[1]
        src = d / f"source_{S}.csv"
        res[S] = {"details": parse_details(det.read_text()),
                  "source": parse_source(src.read_text()) if src.is_file() else {}}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="4096,65536")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--skip-steps", type=int, default=2, help="decode steps before the profiled one")
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--work", default=None, help="where the reports and CSVs go (default build/gpu-ncu/<tag>)")
    ap.add_argument("--reduce", default=None, help="only reduce details_<S>.csv and source_<S>.csv in this folder")
    args = ap.parse_args(argv)
    sp = {"r": args.r, "k": args.k, "l": args.l, "basis": "model", "min_kv": 0}
    if args.reduce:
        res = reduce_dir(Path(args.reduce))
        print(markdown({"tag": args.tag, "sparq": sp}, res))
        return 0 if res else 1
    ncu = args.ncu or shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if Path("/usr/local/cuda/bin/ncu").is_file() else None)
    if not ncu:
        sys.exit("gpu_ncu_lines: no ncu (Nsight Compute) found: give --ncu PATH")
    from gpu_sweep import device  # noqa: E402 (needs the GPU: checked here, not at import)

    from llama_sparq import tool_path
    from llama_sparq.models import paper_shape_path

    work = Path(args.work or f"build/gpu-ncu/{args.tag}")
    work.mkdir(parents=True, exist_ok=True)
    model, bench = paper_shape_path(args.n_layer), str(tool_path("llama-bench"))
    meta = {"tag": args.tag, "device": device(), "commit": git_commit(), "date": now_iso(timespec="auto"),
            "argv": command_line(), "sparq": sp, "commands": [],
            "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]}
    # score, select, attend: one launch each per layer (the op's upkeep kernels, k_sparq_sum_append and
    # k_sparq_kt_append, are left out of the filter so that the skip counts steps)
    n_kernels = 3
    for S in [int(x) for x in args.depths.split(",") if x]:
        rep = work / f"rep_{S}"
        cmd = [ncu, "-k", "regex:k_sparq_(score|select|attend)", "--launch-skip", str(n_kernels * args.n_layer * args.skip_steps),
               "--launch-count", str(n_kernels), "--section", "SpeedOfLight", "--section", "Occupancy", "--section",
               "LaunchStats", "--section", "WarpStateStats", "--section", "SourceCounters", "--import-source", "yes",
               "-f", "-o", str(rep), bench, "-m", str(model), "-ngl", "99", "-fa", "1", "-p", "0",
               "-n", str(args.skip_steps + 2), "-r", "1", "-d", str(S), "--depth-fill", "synthetic", "--sparq", "1",
               "--sparq-r", str(args.r), "--sparq-k", str(args.k), "--sparq-l", str(args.l), "--sparq-basis", "model",
               "--sparq-min-kv", "0"]
        meta["commands"].append(shlex.join(cmd))
        run(cmd)
        for page, extra in (("details", []), ("source", ["--print-source", "cuda,sass"])):
            q = run([ncu, "-i", f"{rep}.ncu-rep", "--page", page, "--csv", *extra], timeout=600)
            (work / f"{page}_{S}.csv").write_text(q.stdout)
    res = reduce_dir(work)
    doc = {"meta": meta, "results": res}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"gpu_ncu_lines_{args.tag}.json", doc)
    (RESULTS / f"gpu_ncu_lines_{args.tag}.md").write_text(markdown(meta, res) + "\n")
    print(f"wrote {RESULTS / f'gpu_ncu_lines_{args.tag}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
