#!/usr/bin/env python3
"""Where a GPU decode step's time goes, dense and SparQ: a CUDA trace of llama-bench's decode steps.

Needs an NVIDIA GPU, the CUDA build and a tracer: Nsight Systems (``nsys``, ``--nsys PATH`` or on
PATH) or, where it is missing (the borrowed GPU machines have only Nsight Compute), this
project's CUPTI tracer ``bench/cupti/sparq_cupti_trace.cpp`` (``--cupti-lib``, built into
``build/gpu-wheel/`` by ``make gpu-wheel``; loaded through ``CUDA_INJECTION64_PATH``), which
writes the same three summaries ``nsys stats`` does plus the GPU's busy time:

    .venv/bin/python bench/gpu_timeline.py --tag h100_0123abc     # 4K and 64K, dense -fa 1 and SparQ

For each depth S and configuration (dense ``-fa 1``; SparQ at the paper's fixed k; SparQ with the
calibrated k) it profiles ``llama-bench -p 0 -n N -d S --depth-fill synthetic`` on the paper-shape
model (Llama 2 7B per-layer shapes, 8 layers, Q8_0 weights, F16 cache, ``-ngl 99``) twice, with
N = ``--n-short`` and ``--n-long`` decode steps, under ``nsys profile -t cuda --cuda-graph-trace=node``
(kernels inside CUDA graphs traced one by one) or the CUPTI tracer. ``nsys stats`` (or the tracer) gives the totals per kernel name
(``cuda_gpu_kern_sum``), per CUDA API call (``cuda_api_sum``) and per copy (``cuda_gpu_mem_time_sum``);
the long run's totals less the short run's, over the extra steps, are what one decode step does:
the model load, the synthetic fill and the warm-up cancel out. Reduced per step and per layer:

- every kernel with its time and launches, grouped as the SparQ op (``k_sparq_*``), attention
  (flash attention, soft max), the weights' products and everything else;
- what SparQ adds beside the op: each kernel whose time or count per step is above dense's;
- launches per layer and step, copies per step, and the CUDA API per step: ``cudaGraphLaunch``
  against ``cudaLaunchKernel`` says whether ggml's CUDA graphs captured the step (a captured
  step launches its kernels from the graph), ``cudaGraphInstantiate`` / ``cudaGraphExecUpdate``
  / ``cudaStreamBeginCapture`` whether the graph was rebuilt, ``cudaStreamSynchronize`` and
  ``cudaMemcpy*`` the host synchronisations and copies;
- with the CUPTI tracer, the wall time of a step (llama-bench's) against the GPU's busy time
  (the union of the kernels' intervals): the difference is time no kernel ran (launch gaps,
  copies, synchronisations, host work).

Result: gpu_timeline_<tag>.{json,md} under bench/results/, with the device, the commit and every command.
``--reduce DIR`` only reduces the stats CSVs already in DIR (the tests use it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, command_line, git_commit, now_iso, write_json  # noqa: E402

REPORTS = ("cuda_gpu_kern_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum")
API_KEYS = ("cudaGraphLaunch", "cudaLaunchKernel", "cudaGraphInstantiate", "cudaGraphExecUpdate",
            "cudaStreamBeginCapture", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync",
            "cudaMemcpy", "cudaMemsetAsync", "cudaEventSynchronize")


def _col(row: dict, *keys: str) -> str | None:
    """The value of the first column whose name contains one of keys (nsys renames columns
    between versions: 'Total Time (ns)', 'Num Calls', 'Instances', 'Count')."""
    for k in keys:
        for name, v in row.items():
            if name and k.lower() in name.lower():
                return v
    return None


def read_sum(path: Path, api: bool = False) -> dict[str, dict]:
    """An nsys stats summary CSV: name -> {"ns": total time, "n": calls or instances} (api: CUDA API
    names without their version suffix, cudaLaunchKernel_v7000 -> cudaLaunchKernel, summed)."""
    out: dict[str, dict] = {}
    if not path.is_file():
        return out
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith(("NOTICE", "WARNING", "Processing", "Generating"))]
    for row in csv.DictReader(lines):
        name = _col(row, "Name", "Operation")
        ns = _col(row, "Total Time")
        n = _col(row, "Instances", "Num Calls", "Count")
        if not name or ns is None or n is None:
            continue
        name = name.strip()
        if api:
            name = re.sub(r"_v\d+$", "", name)
        try:
            e = out.setdefault(name, {"ns": 0.0, "n": 0})
            e["ns"] += float(ns.replace(",", ""))
            e["n"] += int(float(n.replace(",", "")))
        except ValueError:
            continue
    return out


def per_step(long: dict, short: dict, steps: int) -> dict[str, dict]:
    """(long - short) / steps per name: what one more decode step costs."""
    out = {}
    for name in set(long) | set(short):
        a, b = long.get(name, {"ns": 0.0, "n": 0}), short.get(name, {"ns": 0.0, "n": 0})
        dn, dt = a["n"] - b["n"], a["ns"] - b["ns"]
        if dn or abs(dt) > 0:
            out[name] = {"us": dt / 1e3 / steps, "n": dn / steps}
    return out


def kernel_group(name: str) -> str:
    n = name.lower()
    if "k_sparq" in n:
        return "sparq op"
    if "flash_attn" in n or "soft_max" in n or "fattn" in n:
        return "attention"
    if "mul_mat" in n or "gemv" in n or "gemm" in n or "mmq" in n or "mmvq" in n or "quantize" in n:
        return "weights"
    return "other"


def short_name(name: str) -> str:
    """A kernel's name without its template arguments and parameter list."""
    n = re.sub(r"\(.*$", "", name.strip())
    n = re.sub(r"^void\s+", "", n)
    return n if len(n) <= 70 else n[:67] + "..."


def reduce_dir(d: Path, n_layer: int, steps: int) -> dict:
    """Every (config, S) pair of the stats CSVs in d (<config>_<S>_<short|long>_<report>.csv)."""
    res = {}
    for p in sorted(d.glob(f"*_long_{REPORTS[0]}.csv")):
        m = re.match(rf"(.+)_(\d+)_long_{REPORTS[0]}\.csv$", p.name)
        if not m:
            continue
        cfg, S = m.group(1), int(m.group(2))
        stats = {}
        for rep in REPORTS:
            lo = read_sum(d / f"{cfg}_{S}_long_{rep}.csv", rep == "cuda_api_sum")
            sh = read_sum(d / f"{cfg}_{S}_short_{rep}.csv", rep == "cuda_api_sum")
            stats[rep] = per_step(lo, sh, steps)
        kern = stats[REPORTS[0]]
        api = stats[REPORTS[1]]
        groups: dict[str, dict] = {}
        for name, e in kern.items():
            g = groups.setdefault(kernel_group(name), {"us": 0.0, "n": 0.0})
            g["us"] += e["us"]
            g["n"] += e["n"]
        launches = sum(e["n"] for e in kern.values())
        graph = api.get("cudaGraphLaunch", {}).get("n", 0.0)
        direct = sum(e["n"] for k, e in api.items() if k.startswith("cudaLaunchKernel") or k == "cuLaunchKernel")
        busy = {w: _read_busy(d / f"{cfg}_{S}_{w}_busy.csv") for w in ("short", "long")}
        busy_us = (busy["long"] - busy["short"]) / 1e3 / steps if None not in busy.values() else None
        wall_us = _read_wall_us(d / f"{cfg}_{S}_long_bench.json")
        res[f"{cfg}@{S}"] = {
            "config": cfg, "S": S, "kernels": kern, "api": api, "copies": stats[REPORTS[2]], "groups": groups,
            "gpu_us_per_step": sum(e["us"] for e in kern.values()),
            "busy_us_per_step": busy_us, "wall_us_per_step": wall_us,
            "idle_us_per_step": wall_us - busy_us if wall_us is not None and busy_us is not None else None,
            "launches_per_step": launches, "launches_per_layer": launches / n_layer,
            "sparq_op_launches_per_layer": groups.get("sparq op", {}).get("n", 0.0) / n_layer,
            "graph_launches_per_step": graph, "direct_launches_per_step": direct,
            # a captured step replays its kernels from the graph: (almost) no direct launches
            "captured": graph > 0 and direct < 0.1 * max(launches, 1.0),
            "rebuilt_per_step": sum(api.get(k, {}).get("n", 0.0) for k in
                                    ("cudaGraphInstantiate", "cudaGraphExecUpdate", "cudaStreamBeginCapture")),
            "syncs_per_step": sum(api.get(k, {}).get("n", 0.0) for k in
                                  ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")),
        }
    return res


def _read_busy(path: Path) -> float | None:
    """The CUPTI tracer's busy time in ns (None without the file)."""
    if not path.is_file():
        return None
    rows = list(csv.DictReader(path.read_text().splitlines()))
    return float(rows[0]["busy_ns"]) if rows else None


def _read_wall_us(path: Path) -> float | None:
    """One decode step's wall time in us from llama-bench's JSON (the tg test's avg_ns / n_gen)."""
    if not path.is_file():
        return None
    try:
        tests = json.loads(path.read_text())
    except ValueError:
        return None
    for t in tests if isinstance(tests, list) else []:
        if t.get("n_gen", 0) > 0 and t.get("avg_ns"):
            return t["avg_ns"] / 1e3 / t["n_gen"]
    return None


def _f(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(meta: dict, res: dict, n_layer: int) -> str:
    lines = [f"# Where a GPU decode step's time goes ({meta.get('tag', '')})", "",
             f"- device: {meta.get('device', {}).get('gpu', '?')}; host {meta.get('device', {}).get('host_cpu', '?')}",
             f"- commit: {meta.get('commit')}; date: {meta.get('date')}",
             f"- model: paper shape (Llama 2 7B per-layer shapes), {n_layer} layers, Q8_0 weights, F16 cache, -ngl 99",
             f"- per step = (run with {meta.get('n_long')} decode steps - run with {meta.get('n_short')}) / "
             f"{meta.get('n_long', 0) - meta.get('n_short', 0)}; per layer = per step / {n_layer}",
             f"- SparQ settings: {meta.get('sparq')}; tracer: {meta.get('tracer', 'nsys')}",
             "- wall us/step: llama-bench's step time under the tracer; GPU busy: the union of the kernels' "
             "intervals (CUPTI tracer only); idle = wall - busy, time no kernel ran",
             "", "Commands:", ""]
    lines += [f"    {c}" for c in meta.get("commands", [])]
    lines += ["", "## Summary per step", "",
              "| config | S | wall us/step | GPU busy us/step | GPU idle us/step | kernel us/step | launches/layer | "
              "SparQ op launches/layer | graph launches/step | direct launches/step | graph rebuilds/step | syncs/step | "
              "captured |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(res, key=lambda k: (res[k]["S"], res[k]["config"])):
        r = res[key]
        lines.append(f"| {r['config']} | {r['S']} | {_f(r.get('wall_us_per_step'))} | {_f(r.get('busy_us_per_step'))} | "
                     f"{_f(r.get('idle_us_per_step'))} | {_f(r['gpu_us_per_step'])} | {_f(r['launches_per_layer'])} | "
                     f"{_f(r['sparq_op_launches_per_layer'])} | {_f(r['graph_launches_per_step'])} | "
                     f"{_f(r['direct_launches_per_step'])} | {_f(r['rebuilt_per_step'])} | {_f(r['syncs_per_step'])} | "
                     f"{'yes' if r['captured'] else 'no'} |")
    for S in sorted({r["S"] for r in res.values()}):
        dense = res.get(f"dense_fa1@{S}")
        for cfg in sorted({r["config"] for r in res.values() if r["S"] == S}):
            r = res[f"{cfg}@{S}"]
            lines += ["", f"## {cfg} at S = {S}: kernels per layer", "",
                      "| group | kernel | us per layer | launches per layer | us per launch |", "|---|---|---|---|---|"]
            for name, e in sorted(r["kernels"].items(), key=lambda kv: -kv[1]["us"]):
                if e["us"] < 0.05 * n_layer and e["n"] < 0.5 * n_layer:
                    continue
                lines.append(f"| {kernel_group(name)} | `{short_name(name)}` | {_f(e['us'] / n_layer, 2)} | "
                             f"{_f(e['n'] / n_layer, 2)} | {_f(e['us'] / e['n'], 2) if e['n'] > 0 else '-'} |")
            if dense is not None and cfg != "dense_fa1":
                extra = []
                for name, e in r["kernels"].items():
                    if kernel_group(name) in ("sparq op", "attention"):
                        continue
                    d = dense["kernels"].get(name, {"us": 0.0, "n": 0.0})
                    if e["us"] - d["us"] > 0.2 * n_layer or e["n"] - d["n"] > 0.5 * n_layer:
                        extra.append((name, e["us"] - d["us"], e["n"] - d["n"]))
                lines += ["", f"What {cfg} adds beside the op and attention (over dense -fa 1 at S = {S}):", "",
                          "| kernel | extra us per layer | extra launches per layer |", "|---|---|---|"]
                for name, dus, dn in sorted(extra, key=lambda x: -x[1]):
                    lines.append(f"| `{short_name(name)}` | {_f(dus / n_layer, 2)} | {_f(dn / n_layer, 2)} |")
                if not extra:
                    lines.append("| (nothing above dense's) | - | - |")
                api = [(k, r["api"].get(k, {}).get("n", 0.0), dense["api"].get(k, {}).get("n", 0.0)) for k in API_KEYS]
                lines += ["", "| CUDA API call | per step | dense per step |", "|---|---|---|"]
                lines += [f"| {k} | {_f(a, 2)} | {_f(b, 2)} |" for k, a, b in api if a or b]
                cp = r["copies"]
                if cp:
                    lines += ["", "| copy | per step | us per step |", "|---|---|---|"]
                    lines += [f"| {k} | {_f(e['n'], 2)} | {_f(e['us'], 2)} |" for k, e in sorted(cp.items())]
    return "\n".join(lines) + "\n"


def run(cmd, env=None, timeout=900):
    print("+", shlex.join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"failed ({p.returncode}): {shlex.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="4096,65536")
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-short", type=int, default=4)
    ap.add_argument("--n-long", type=int, default=20)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    ap.add_argument("--nsys", default=None, help="the nsys executable (default: on PATH or under /usr/local/cuda, /opt/nvidia)")
    ap.add_argument("--tracer", choices=("auto", "nsys", "cupti"), default="auto",
                    help="auto (default): nsys where found, else the CUPTI tracer")
    ap.add_argument("--cupti-lib", default="build/gpu-wheel/libsparq_cupti_trace.so",
                    help="the CUPTI tracer library (make gpu-wheel builds it next to the wheel)")
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--work", default=None, help="where the reports and stats go (default build/gpu-timeline/<tag>)")
    ap.add_argument("--reduce", default=None, help="only reduce the stats CSVs in this folder")
    args = ap.parse_args(argv)
    steps = args.n_long - args.n_short
    if steps <= 0:
        ap.error("--n-long must be larger than --n-short")
    sp = {"r": args.r, "k": args.k, "l": args.l, "basis": "model", "min_kv": 0}
    if args.reduce:
        res = reduce_dir(Path(args.reduce), args.n_layer, steps)
        meta = {"tag": args.tag, "n_short": args.n_short, "n_long": args.n_long, "sparq": sp, "commands": []}
        print(markdown(meta, res, args.n_layer))
        return 0 if res else 1

    nsys = args.nsys or shutil.which("nsys") or next(
        (str(p) for p in sorted(Path("/opt/nvidia").glob("nsight-systems*/*/bin/nsys")) + [Path("/usr/local/cuda/bin/nsys")]
         if Path(p).is_file()), None)
    tracer = args.tracer if args.tracer != "auto" else ("nsys" if nsys else "cupti")
    cupti = Path(args.cupti_lib).resolve()
    if tracer == "nsys" and not nsys:
        sys.exit("gpu_timeline: no nsys (Nsight Systems) found: give --nsys PATH, or --tracer cupti")
    if tracer == "cupti" and not cupti.is_file():
        sys.exit(f"gpu_timeline: no CUPTI tracer at {cupti} (--cupti-lib; 'make gpu-wheel' builds it)"
                 + ("" if args.tracer == "cupti" else " and no nsys (Nsight Systems; --nsys PATH)"))
    from gpu_sweep import device  # noqa: E402 (needs the GPU: checked here, not at import)

    from llama_sparq import tool_path
    from llama_sparq.models import paper_shape_path

    work = Path(args.work or f"build/gpu-timeline/{args.tag}")
    work.mkdir(parents=True, exist_ok=True)
    model = paper_shape_path(args.n_layer)
    bench = str(tool_path("llama-bench"))
    fixed = ["--sparq", "1", "--sparq-r", str(args.r), "--sparq-k", str(args.k), "--sparq-l", str(args.l),
             "--sparq-basis", "model", "--sparq-min-kv", "0"]
    configs = {"dense_fa1": ["--sparq", "0"], "sparq": fixed,
               "sparq_calibrated": ["--sparq", "1", "--sparq-r", str(args.r), "--sparq-k", "0", "--sparq-min-kv", "0"]}
    meta = {"tag": args.tag, "device": device(), "commit": git_commit(), "date": now_iso(timespec="auto"),
            "argv": command_line(), "n_short": args.n_short, "n_long": args.n_long, "sparq": sp, "commands": [],
            "tracer": (subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip()
                       if tracer == "nsys" else f"CUPTI ({cupti.name})")}
    for S in [int(x) for x in args.depths.split(",") if x]:
        for cfg, extra in configs.items():
            for which, n in (("short", args.n_short), ("long", args.n_long)):
                rep = work / f"{cfg}_{S}_{which}"
                cmd = [bench, "-m", str(model), "-ngl", "99", "-fa", "1", "-p", "0", "-n", str(n), "-d", str(S),
                       "--depth-fill", "synthetic", "-r", "1", "-o", "json", "-v", *extra]
                env = None
                if tracer == "nsys":
                    cmd = [nsys, "profile", "-t", "cuda", "--cuda-graph-trace=node", "--force-overwrite", "true",
                           "-o", str(rep), *cmd]
                else:
                    env = dict(os.environ, CUDA_INJECTION64_PATH=str(cupti), SPARQ_TRACE_PREFIX=str(rep))
                meta["commands"].append(shlex.join(cmd) if env is None else
                                        f"CUDA_INJECTION64_PATH={cupti} SPARQ_TRACE_PREFIX={rep} {shlex.join(cmd)}")
                try:
                    p = run(cmd, env=env)
                    (work / f"{cfg}_{S}_{which}_bench.json").write_text(p.stdout[p.stdout.find("["):] if "[" in p.stdout else "")
                    if tracer == "nsys":
                        st = [nsys, "stats", "-r", ",".join(REPORTS), "-f", "csv", "--force-export", "true", "-o", str(rep),
                              f"{rep}.nsys-rep"]
                        meta["commands"].append(shlex.join(st))
                        run(st)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # recorded; the others go on
                    print(e, flush=True)
                    meta.setdefault("errors", []).append(f"{cfg} S={S} n={n}: {str(e)[-500:]}")
    res = reduce_dir(work, args.n_layer, steps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"gpu_timeline_{args.tag}.json", {"meta": meta, "results": res})
    (RESULTS / f"gpu_timeline_{args.tag}.md").write_text(markdown(meta, res, args.n_layer))
    print(f"wrote {RESULTS / f'gpu_timeline_{args.tag}.md'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
