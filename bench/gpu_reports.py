"""Readers of the GPU profilers' reports for bench/gpu.py: the timeline's per-kernel, API and copy
summaries (``nsys stats`` or this project's CUPTI tracer) reduced to one decode step, and Nsight
Compute's details and source pages reduced to each kernel's figures and hottest lines. Pure data
work, no GPU: the tests feed them recorded CSVs.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path


# ============================================================================================= timeline

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


def timeline_reduce_dir(d: Path, n_layer: int, steps: int) -> dict:
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


def timeline_markdown(meta: dict, res: dict, n_layer: int) -> str:
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


# ============================================================================================= lines

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


def lines_markdown(meta: dict, res: dict) -> str:
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


def lines_reduce_dir(d: Path) -> dict:
    res = {}
    for det in sorted(d.glob("details_*.csv")):
        S = det.stem.split("_", 1)[1]
        src = d / f"source_{S}.csv"
        res[S] = {"details": parse_details(det.read_text()),
                  "source": parse_source(src.read_text()) if src.is_file() else {}}
    return res
