"""What the bench/ drivers share: the run's metadata (machine, kernels' ISA, commit, dates,
command line), the results folder, the one runner of llama-bench (and of other tools), the
subcommand dispatch, the result-file writers (CSV, JSON, markdown) and the set-up of plots and
progress bars. Needs no native library at import (tests import scripts
that use it without one)."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from llama_sparq._provenance import cpu_model  # noqa: F401  (re-exported: the scripts import it from here)
from llama_sparq._provenance import git_commit as _git_commit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# the research helpers (sparq_lab: the NumPy reference, capture, cost model, synthetic models)
# live in dev/, outside the wheel; every script that imports this module can import them
if str(REPO / "dev") not in sys.path:
    sys.path.insert(0, str(REPO / "dev"))
RESULTS = HERE / "results"  # the default --out-dir of every script


# ----------------------------------------------------------------------------- machine and run

def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_topology() -> dict:
    """{"cores": physical cores, "logical_cpus": hardware threads} from /proc/cpuinfo (cores: distinct
    (physical id, core id) pairs; the logical count where the file names none)."""
    n = os.cpu_count()
    pairs, phys = set(), None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    phys = val.strip()
                elif key == "core id":
                    pairs.add((phys, val.strip()))
    except OSError:
        pass
    return {"cores": len(pairs) or n, "logical_cpus": n}


def loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def git_commit() -> str:
    """This checkout's commit (llama_sparq._provenance.git_commit)."""
    return _git_commit(REPO)


def kernel_isa() -> str:
    """The ISA the SparQ CPU kernels dispatch to on this machine (sparq-op-test isa)."""
    from llama_sparq import LibraryError, tool_path

    try:
        exe = tool_path("sparq-op-test")
    except LibraryError:
        return "unknown (sparq-op-test not installed; run `make install`)"
    try:
        p = subprocess.run([str(exe), "isa"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    out = p.stdout.strip()
    return out if p.returncode == 0 and out else f"unknown (sparq-op-test isa exited {p.returncode})"


def machine_line(threads=None) -> str:
    """CPU, cores, threads used (when given) and the kernels' ISA, in one line."""
    used = "" if threads is None else f", {threads} threads"
    return f"{cpu_model()}, {os.cpu_count()} cores{used}; SparQ kernels ISA: {kernel_isa()}"


_ARGV: list[str] | None = None  # the command line as given, while dispatch() names the subcommand in sys.argv[0]


def command_line() -> str:
    """This run's command line, quoted for a shell."""
    return shlex.join([sys.executable, *(_ARGV or sys.argv)])


def now_iso(local=False, timespec="seconds") -> str:
    """The date and time now, ISO 8601: UTC, or the local time zone's with local=True."""
    now = _dt.datetime.now().astimezone() if local else _dt.datetime.now(_dt.timezone.utc)
    return now.isoformat(timespec=timespec)


def run_meta(threads, load0) -> dict:
    """The head of a result file's metadata: command, machine, load average at the start
    (load0) and now, commit, date (UTC); and OMP_WAIT_POLICY where it is set, with a warning
    for PASSIVE (ggml's threads then sleep at each of the graph's barriers: every figure
    slower, the graphs with more nodes most, which is SparQ's)."""
    meta = {
        "command": command_line(),
        "machine": machine_line(threads),
        "load_average_start_end": [load0, loadavg()],
        "commit": git_commit(),
        "date": now_iso(),
    }
    policy = os.environ.get("OMP_WAIT_POLICY")
    if policy:
        meta["omp_wait_policy"] = policy
        if policy.upper() == "PASSIVE":
            print("warning: OMP_WAIT_POLICY=PASSIVE (the test suite's setting): threads sleep at every graph "
                  "barrier, so these timings understate both paths and SparQ's most; unset it to benchmark",
                  file=sys.stderr)
    return meta


def run_tool(cmd, *, what="failed", env=None, timeout=None, echo=False):
    """Run one command line capturing its output: the CompletedProcess, with wall_s (seconds) added.
    A failure raises RuntimeError with what, the exit status, the command line and the end of its
    stderr; a timeout raises subprocess.TimeoutExpired. echo: print the command and its time."""
    cmd = [str(c) for c in cmd]
    if echo:
        print("+", shlex.join(cmd), flush=True)
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    p.wall_s = time.monotonic() - t0
    if echo:
        print(f"  ({p.wall_s:.1f} s, exit {p.returncode})", flush=True)
    if p.returncode != 0:
        raise RuntimeError(f"{what} ({p.returncode}): {shlex.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def llama_bench(args, *, exe=None, prefix=(), what="llama-bench failed", env=None, timeout=None, echo=False):
    """The one way every driver runs the fork's llama-bench: args as on its command line (`-o json`
    added when no -o is given), exe another build's binary (default: the installed one), prefix a
    profiler's command line to run it under. Returns (rows, command line, process): rows are
    llama-bench's JSON rows (None where its output holds none), the command line is shell-quoted
    as the result files record it; failures raise as run_tool's do."""
    if exe is None:
        from llama_sparq import tool_path

        exe = tool_path("llama-bench")
    args = [str(a) for a in args]
    if "-o" not in args:
        args += ["-o", "json"]
    cmd = [*map(str, prefix), str(exe), *args]
    p = run_tool(cmd, what=what, env=env, timeout=timeout, echo=echo)
    start = p.stdout.find("[")  # a profiler may print before llama-bench's JSON
    try:
        rows = json.loads(p.stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        rows = None
    return rows, shlex.join(cmd), p


def dispatch(doc, subcommands, argv=None, default=None) -> int:
    """A driver's command line: the subcommand argv[0] names runs with the rest as its options;
    with default, a command line that names none runs that subcommand (the driver's original
    options keep working). No or an unknown subcommand prints doc."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in subcommands:
        name, argv = argv[0], argv[1:]
    elif default and not (argv and argv[0] in ("-h", "--help")):
        name = default
    else:
        print(doc.strip(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    # argparse names the program after argv[0]: the subcommand belongs in its usage lines
    global _ARGV
    _ARGV, prog = list(sys.argv), sys.argv[0]
    sys.argv[0] = f"{Path(prog).name} {name}"
    try:
        return subcommands[name](argv)
    finally:
        sys.argv[0], _ARGV = prog, None


def op_bench_times(exe, *, S, batch, heads, head_kv, d, r, k, l, threads, reps, warmup=2, ops=("dense", "sparq"),
                   timeout=None, kt_bits=16) -> dict:
    """One run of the native sparq-op-bench (bench/native/sparq-op-bench.cpp): {op: [us per rep]}
    for each of ops, timed in one process on the same random f16 cache (K^T in f16, or e5m2 with
    kt_bits 8). The op is a graph node of its own there (GGML_OP_SPARQ_ATTN), so no llama
    counters exist: the op is what runs."""
    cmd = [str(exe), "--S", str(S), "--batch", str(batch), "--heads", str(heads), "--head-kv", str(head_kv),
           "--d", str(d), "--r", str(r), "--k", str(k), "--l", str(l), "--threads", str(threads),
           "--reps", str(reps), "--warmup", str(warmup), "--ops", ",".join(ops)]
    if kt_bits != 16:  # builds before the flag took only f16
        cmd += ["--kt-bits", str(kt_bits)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {shlex.join(cmd)}") from None
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {shlex.join(cmd)}\n{p.stderr.strip()}")
    times = {}
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            obj = json.loads(line)
            times[obj["op"]] = [float(t) for t in obj["times_us"]]
    for op in ops:
        if op not in times or len(times[op]) != reps:
            raise RuntimeError(f"no/short '{op}' result from {shlex.join(cmd)}:\n{p.stdout}\n{p.stderr}")
    return times


# ----------------------------------------------------------------------------- result files

def out_stem(out_dir, tag) -> Path:
    """out_dir / tag, the stem of a run's result files, with out_dir created."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / tag


def write_json(path, doc, newline=False):
    """doc as JSON (indent 1), with a final newline if asked."""
    Path(path).write_text(json.dumps(doc, indent=1) + ("\n" if newline else ""))


def write_csv(path, comments, columns, rows):
    """A CSV file: each of comments as a '# ' line (the run's metadata), the header, the rows
    (lists of cells)."""
    with open(path, "w", newline="") as f:
        for line in comments:
            f.write(f"# {line}\n")
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)


def md_bullets(items) -> list[str]:
    """Markdown '- **key**: value' lines of (key, value) pairs."""
    return [f"- **{k}**: {v}" for k, v in items]


def md_table(columns, rows) -> list[str]:
    """A markdown table's lines: header, rule, one line per row (lists of cell strings)."""
    return (["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            + ["| " + " | ".join(cells) + " |" for cells in rows])


# ----------------------------------------------------------------------------- statistics

def iqr_points(S, samples):
    """The (S, y) points of the runs inside the interquartile range at each S (all of them
    where none is): S[i] is the context length of the runs samples[i]."""
    xs, ys = [], []
    for s, x in zip(S, samples):
        x = np.asarray(x, float)
        if len(x) == 0:
            continue
        q1, q3 = np.percentile(x, [25, 75])
        keep = (x >= q1) & (x <= q3)
        keep = keep if keep.any() else np.ones_like(keep)
        xs += [s] * int(keep.sum())
        ys += x[keep].tolist()
    return xs, ys


def fit_line(S, y):
    """Least-squares y = a*S + b: (a, b)."""
    A = np.vstack([S, np.ones_like(S)]).T
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(a), float(b)


# ----------------------------------------------------------------------------- plots, progress

def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def progress():
    """tqdm, or a stand-in that shows no bar where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **k: x  # noqa: E731
    return tqdm


def write_md(out: Path, tag: str, lines: list[str], echo: bool = True) -> None:
    """<out>/<tag>.md from the lines (and a last empty one), also printed (echo)."""
    (out / f"{tag}.md").write_text("\n".join(lines + [""]))
    if echo:
        print("\n".join(lines))


def pct(xs, q, nd=2):
    """The q-th percentile of xs rounded to nd decimals, None for none."""
    import numpy as np

    return round(float(np.percentile(xs, q)), nd) if xs else None
