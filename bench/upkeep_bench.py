#!/usr/bin/env python3
"""SparQ's cache upkeep per decode step, and the cost of a rebuild, against the KV-cache size.

SparQ keeps K^T and the V sums of the cache current. Per decode step it must decide
whether the cells changed since the data was last brought up to date; after a change it
rebuilds the affected stream. This times a small model (2 layers, 2 KV heads of 64, f16
cache, SparQ r = 8, k = 64, l = 16, dense threshold 0) in caches of 1K and 256K cells:

- steady state: the median time of a decode step (1 thread: no thread barriers, whose
  cost on a busy machine would drown the figures) with SparQ on and off, the cache holding
  the same few hundred cells in both sizes, so attention costs the same and what grows
  with the cache size is upkeep;
- rebuild: after the last cell is removed, llama_sparq_sync brings the data up to date (the
  rebuild the next step would do), timed with 1 and with 2 threads, 256 and 260000 cells used.

The context is filled with llama_sparq_bench_fill (random K/V, no prefill). One process
per library and configuration; ``--before-lib DIR`` also times another build of the
fork (e.g. the commit before the upkeep change, installed elsewhere) the same way.

    python bench/upkeep_bench.py --before-lib /tmp/old-lib --before-commit 32f0cad

Writes bench/results/upkeep_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import RESULTS, cpu_model, git_commit, kernel_isa, loadavg, now_iso, write_json  # noqa: E402

N_THREADS = 2
SETTINGS = dict(r=8, k=64, l=16, min_kv=0, all_rows=False)
CONFIGS = [  # (KV cells, cells used at the start, steps timed per setting, rebuilds timed)
    (1024, 256, 200, 10),
    (262144, 256, 200, 10),
    (262144, 260000, 20, 5),
]


def worker(args) -> dict:
    import numpy as np

    from llama_sparq import _sparq
    from llama_sparq._llama import llama_cpp as lc
    from llama_sparq import Llama

    llm = Llama(args.model, n_ctx=64, n_threads=N_THREADS, verbose=False)  # loads the model, sets up the backend
    p = lc.llama_context_default_params()
    p.n_ctx = args.size
    p.n_batch = p.n_ubatch = 512
    p.n_seq_max = 1
    p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
    p.n_threads = p.n_threads_batch = 1
    ctx = lc.llama_init_from_model(llm._model.model, p)
    assert ctx
    mem = lc.llama_get_memory(ctx)
    _sparq.bench_fill(ctx, args.used, seed=1)
    batch = lc.llama_batch_init(1, 0, 1)

    def step():
        pos = lc.llama_memory_seq_pos_max(mem, 0) + 1
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = 5, pos, 1, True
        batch.seq_id[0][0] = 0
        t0 = time.perf_counter()
        assert lc.llama_decode(ctx, batch) == 0
        lc.llama_synchronize(ctx)
        return (time.perf_counter() - t0) * 1e3

    def sparq(on):
        _sparq.set_params(ctx, enabled=on, **SETTINGS)

    out = {}
    for name, on in (("on", True), ("off", False)):
        sparq(on)
        for _ in range(5):
            step()
        out[f"step_{name}_ms"] = float(np.median([step() for _ in range(args.steps)]))
    sparq(True)
    for _ in range(3):
        step()
    reb0 = _sparq.get_stats(ctx)["n_rebuilds"]
    for nth in (1, N_THREADS):
        lc.llama_set_n_threads(ctx, nth, nth)  # the rebuild's threads
        rb = []
        for _ in range(args.rebuilds):
            lc.llama_memory_seq_rm(mem, 0, lc.llama_memory_seq_pos_max(mem, 0), -1)
            t0 = time.perf_counter()
            _sparq.sync(ctx)
            rb.append((time.perf_counter() - t0) * 1e3)
            step()
        out[f"rebuild_ms_t{nth}"] = float(np.median(rb))
    st = _sparq.get_stats(ctx)
    out["rebuilds_counted"] = int(st["n_rebuilds"] - reb0)
    out["n_sparq"] = int(st["n_sparq"])
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    llm.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-lib", type=Path, help="another build's llama_sparq/lib folder to time the same way")
    ap.add_argument("--before-commit", default="", help="the commit that --before-lib was built from")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--tag", default="upkeep_bench")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--used", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rebuilds", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    from llama_sparq._lib import lib_dir
    from llama_sparq.models import make_tiny_llama

    tmp = Path(tempfile.mkdtemp(prefix="upkeep-bench-"))
    model = make_tiny_llama(tmp / "model.gguf", n_layer=2, n_embd=128, n_head=2, n_head_kv=2, n_ff=256,
                            weight_type="f16")
    libs = []
    if args.before_lib:
        libs.append(("before", str(args.before_lib), args.before_commit or "unknown"))
    commit = git_commit()
    libs.append(("after", str(lib_dir()), commit))
    rows = []
    load0 = loadavg()
    for size, used, steps, rebuilds in CONFIGS:
        for label, lib, com in libs:
            cmd = [sys.executable, __file__, "--worker", "--model", str(model), "--size", str(size), "--used",
                   str(used), "--steps", str(steps), "--rebuilds", str(rebuilds)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, LLAMA_SPARQ_LIB_DIR=lib))
            if res.returncode != 0:
                raise RuntimeError(f"{shlex.join(cmd)} failed:\n{res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            r.update(lib=label, commit=com, kv_cells=size, used_cells=used, steps=steps, rebuilds=rebuilds)
            r["upkeep_ms"] = r["step_on_ms"] - r["step_off_ms"]
            rows.append(r)
            print(f"{label:6s} cells {size:7d} used {used:6d}: on {r['step_on_ms']:.3f} ms, off {r['step_off_ms']:.3f} ms, "
                  f"rebuild {r['rebuild_ms_t1']:.2f} / {r['rebuild_ms_t2']:.2f} ms ({r['rebuilds_counted']} counted)",
                  file=sys.stderr)

    meta = {
        "command": shlex.join([sys.executable] + (argv if argv is not None else sys.argv)),
        "date": now_iso(),
        "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": "1 for steps, 1 and 2 for rebuilds",
                    "loadavg_start": load0, "loadavg_end": loadavg(), "kernel_isa": kernel_isa()},
        "commit": commit,
        "model": "tiny random llama: 2 layers, width 128, 2 heads of 64 (2 KV heads), f16 weights, f16 KV cache",
        "sparq": SETTINGS,
        "method": __doc__.split("\n\n")[1].replace("\n", " ") + " " + __doc__.split("\n\n")[2].replace("\n", " "),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.out_dir / f"{args.tag}.json", {"meta": meta, "rows": rows}, newline=True)

    def fig(label, size, used, key):
        for r in rows:
            if (r["lib"], r["kv_cells"], r["used_cells"]) == (label, size, used):
                return r[key]
        return None

    md = [f"# SparQ cache upkeep against the KV-cache size ({args.tag})", "",
          f"Command: `{meta['command']}`  ", f"Date: {meta['date']}  ",
          f"Machine: {meta['machine']['cpu']}, {meta['machine']['cpu_count']} cores, "
          f"SparQ kernels' ISA {meta['machine']['kernel_isa']}, load average {load0} at the start and "
          f"{meta['machine']['loadavg_end']} at the end  ",
          f"Commit: {commit}" + (f"; before: {args.before_commit} ({args.before_lib})" if args.before_lib else ""),
          "", f"Model: {meta['model']}. SparQ r = 8, k = 64, l = 16, dense threshold 0.", "",
          meta["method"], "",
          "| build | KV cells | cells used | step SparQ on ms | step SparQ off ms | on - off ms | rebuild ms, 1 thread | rebuild ms, 2 threads | rebuilds counted |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['lib']} | {r['kv_cells']} | {r['used_cells']} | {r['step_on_ms']:.3f} | {r['step_off_ms']:.3f} | "
                  f"{r['upkeep_ms']:.3f} | {r['rebuild_ms_t1']:.2f} | {r['rebuild_ms_t2']:.2f} | "
                  f"{r['rebuilds_counted']}/{2 * r['rebuilds']} |")
    md += ["", "Upkeep growth with the cache size (same cells used, SparQ on): step at 256K cells minus step at 1K cells:", ""]
    for label, _, _ in libs:
        a, b = fig(label, 262144, 256, "step_on_ms"), fig(label, 1024, 256, "step_on_ms")
        if a is not None and b is not None:
            md.append(f"- {label}: {a - b:+.3f} ms per decode step")
    (args.out_dir / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
