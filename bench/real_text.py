#!/usr/bin/env python3
"""Decode speed on a prefill of real text (the Python documentation CPython ships):

    python bench/real_text.py speed --model smollm2 ...      every dense path and SparQ, round-robin, medians
    python bench/real_text.py profile --model smollm2 ...    a steady decode loop to put under perf record
    python bench/real_text.py ab --before DIR ...            two builds' decode in alternation, dense beside
    python bench/real_text.py budget --model gemma3 ...      the calibrated k's rules: predictions against dense
    python bench/real_text.py split --model smollm2 ...      where a step's time goes, by perf: depth 0, dense, SparQ

`python bench/real_text.py SUBCOMMAND -h` lists a subcommand's options.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import statistics as st
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, dispatch, loadavg, md_bullets, md_table, out_stem, run_meta, write_json  # noqa: E402
from real_text_budget import budget_main  # noqa: E402
from real_text_split import split_main  # noqa: E402

HERE = Path(__file__).resolve().parent


# ============================================================================================= speed

SPEED_DOC = """Decode speed on real text: dense attention against SparQ's defaults on the same prefilled cache.

llama-bench fills its ``-d`` context with random tokens. The calibrated k follows the attention
it meets, and attention over random tokens is diffuse in many layers (Gemma 3 270M's global
layers at 32K attend over every cell there), so llama-bench understates what the defaults do
on text. This benchmark prefills text instead: the Python documentation that CPython ships
(``pydoc_data.topics``, every topic in key order, PSF License; nothing is downloaded), cut to
``--tokens``. Then, from the saved state, the same greedy continuation is decoded with SparQ
off and with ``sparq=True``, round-robin over the modes (each rep starts with the next mode),
``--reps`` times each; time per token over the steps after the first.

The Amdahl bound of each SparQ mode: the same dense paths decode from a 16-token prompt (depth 0:
the step without attention's share, per cache type the fastest of them, ``t0``); with the fastest
dense step at the prompt's length ``tS`` and the compression ``c`` the counters measured, SparQ at
best takes ``t0 + c (tS - t0)``, a speed-up of ``tS / (t0 + c (tS - t0))``. Reported with SparQ's
share of it (speed-up over that dense path / bound).

The modes, per K/V cache type of ``--cache-types`` (f16, q8_0, both by default; one context each,
prefilled once): SparQ's defaults, and the dense paths of ``--dense`` (both by default): ``fa1``
upstream's flash attention on the same context (the cache layout SparQ uses), ``fa0`` upstream's
other dense path (a context of its own, V transposed; not for a quantized V, which needs flash
attention). ``--kt-bits 16,8,4`` times
SparQ with each K^T width (``sparq_kt_bits``, each with its own default r; 4, the default, is mode
``sparq_<type>_kt4``, 8 mode ``sparq_<type>_kt8``, 16 mode ``sparq_<type>``) on the same context. Each SparQ mode is compared with every dense mode and with
the fastest of them.

    python bench/real_text.py speed --model gemma3 --tokens 32000 --tag real_text_gemma3_32k
    python bench/real_text.py speed --model smollm2 --tokens 8000 --reps 7 --n-gen 48 --tag real_text_smollm2_8k

Writes bench/results/<tag>.json and .md: the command, machine, commit, model, the settings,
per mode the tokens/s of every rep and their median, the speed-ups, and the fork's counters over
each SparQ mode's reps (SparQ calls, dense calls by reason, compression, cells per KV head).
"""


def python_docs() -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError as e:
        raise SystemExit(f"this benchmark's text is Python's pydoc_data.topics, which this Python lacks ({e})")
    return "\n\n".join(topics[k] for k in sorted(topics))


def decode(llm, state, toks, n_gen, sparq, kt_bits):
    llm.load_state(state)
    llm.set_sparq(sparq=sparq, **({"sparq_kt_bits": kt_bits} if sparq else {}))
    llm.reset_sparq_stats()
    stamps, out = [], []
    # (generate finds the restored prefix: the first step decodes the prompt's last token)
    for tok in llm.generate(toks, temp=0.0, top_k=1, repeat_penalty=1.0):
        stamps.append(time.perf_counter())
        out.append(tok)
        if len(out) >= n_gen:
            break
    tps = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return tps, out, llm.sparq_stats()


def decode_short(llm, toks, n_gen):
    """Dense tokens/s from a 16-token prompt (the step at depth 0)."""
    llm.reset()
    if llm.context_params.flash_attn_type != 0:
        llm.set_sparq(sparq=False)
    stamps = []
    for _ in llm.generate(toks[:16], temp=0.0, top_k=1, repeat_penalty=1.0):
        stamps.append(time.perf_counter())
        if len(stamps) >= n_gen:
            break
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def amdahl_bound(t0, tS, c):
    """The best speed-up SparQ at compression c can give over a dense step of tS seconds whose part
    outside attention takes t0 (the step at depth 0)."""
    return tS / (t0 + c * max(0.0, tS - t0))


def dense_modes(cache_types, dense, kt_bits):
    """The modes to time: (name, cache type, flash attention, sparq, K^T bits) per cache type, dense
    first, then SparQ per K^T width (an 8-bit K^T: `_kt8`, a 4-bit one `_kt4`)."""
    modes = []
    for ct in cache_types:
        for fa in dense:
            if fa == "fa0" and ct != "f16":
                continue  # a quantized V needs flash attention (upstream refuses -fa 0 with it)
            modes.append((f"dense_{ct}_{fa}", ct, fa == "fa1", False, 16))
        for bits in kt_bits:
            modes.append((f"sparq_{ct}" + (f"_kt{bits}" if bits < 16 else ""), ct, True, True, bits))
    return modes


def counters_of(stats):
    """The counters over the reps of a SparQ mode."""
    n_sparq = sum(s["n_sparq"] for s in stats)
    dense_calls = {k: sum(s["n_dense"][k] for s in stats) for k in stats[0]["n_dense"]}
    compression = sum(s["compression"] * s["n_sparq"] for s in stats) / max(1, n_sparq)
    mean_k = (sum(s["mean_k"] * s["n_measured"] for s in stats) / max(1, sum(s["n_measured"] for s in stats)))
    return {"sparq_calls": n_sparq, "dense_calls": {k: v for k, v in dense_calls.items() if v},
            "compression": round(compression, 4), "mean_k": round(mean_k, 1), "n_layers": stats[0]["n_layers"]}


def speed_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=SPEED_DOC.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3", help="gemma3, smollm2 or a GGUF path")
    ap.add_argument("--tokens", type=int, default=32000, help="prompt tokens of text (default 32000)")
    ap.add_argument("--n-gen", type=int, default=32, help="tokens decoded per rep (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="reps of each mode, round-robin (default 3)")
    # every dense path by default: a speed-up is over the fastest of them on the machine at hand
    ap.add_argument("--cache-types", default="f16,q8_0", help="K/V cache types, comma list of f16, q8_0, q4_0, q4_1, "
                    "q5_0, q5_1, iq4_nl (default f16,q8_0: dense and SparQ on each)")
    ap.add_argument("--dense", default="fa1,fa0", help="dense paths, comma list of fa1 (flash attention, the "
                    "layout SparQ uses), fa0 (upstream's other path; f16 only) (default both)")
    from llama_sparq import _sparq

    kt_default = str(_sparq.default_params()["kt_bits"])
    ap.add_argument("--kt-bits", default=kt_default, help="SparQ's K^T widths, comma list of 16, 8, 4 (sparq_kt_bits; "
                    f"default {kt_default}, the fork's default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.tokens < 1024 or a.n_gen < 4 or a.reps < 1:
        ap.error("--tokens must be >= 1024, --n-gen >= 4, --reps >= 1")
    from sparq_lab.cost import CACHE_TYPES, cache_type_id

    cache_types = a.cache_types.split(",")
    dense = a.dense.split(",")
    kt_bits = a.kt_bits.split(",")
    bad = ([c for c in cache_types if c not in CACHE_TYPES or c == "f32"] + [x for x in dense if x not in ("fa0", "fa1")]
           + [b for b in kt_bits if b not in ("16", "8", "4")])
    if bad or not cache_types or not dense or not kt_bits:
        ap.error(f"--cache-types takes f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, --dense fa1, fa0 and --kt-bits "
                 f"16, 8, 4 (comma lists); got {', '.join(bad) or 'nothing'}")
    kt_bits = [int(b) for b in kt_bits]

    from llama_sparq import Llama
    from llama_sparq.models import resolve_model

    model = str(resolve_model(a.model))
    load0 = loadavg()
    modes = dense_modes(cache_types, dense, kt_bits)
    # one context per (cache type, flash attention): the SparQ mode and dense -fa 1 share theirs
    ctxs, toks, params, prefill_s = {}, None, None, {}
    for name, ct, fa, sparq, _ in modes:
        key = (ct, fa)
        if key in ctxs:
            continue
        ti = cache_type_id(ct)
        llm = Llama(model, n_ctx=a.tokens + a.n_gen + 64, n_batch=512, n_threads=a.threads, swa_full=False,
                    verbose=False, flash_attn=fa, type_k=ti, type_v=ti, **({"sparq": True} if fa else {}))
        if toks is None:
            n_ctx_train = llm._model.n_ctx_train()
            if a.tokens + a.n_gen > n_ctx_train:
                raise SystemExit(f"--tokens {a.tokens} + --n-gen {a.n_gen} exceed the model's context of {n_ctx_train}")
            toks = llm.tokenize(python_docs().encode(), add_bos=True)
            if len(toks) < a.tokens:
                raise SystemExit(f"the text has {len(toks)} tokens, fewer than --tokens {a.tokens}")
            toks = toks[:a.tokens]
        if fa and params is None:
            params = llm.sparq_params()
        t0 = time.perf_counter()
        if fa:
            llm.set_sparq(sparq=False)  # the prefill dense (SparQ's prompt rows are anyway)
        for i in range(0, len(toks) - 1, 512):
            llm.eval(toks[i:min(i + 512, len(toks) - 1)])
        prefill_s[f"{ct} -fa {int(fa)}"] = round(time.perf_counter() - t0, 1)
        ctxs[key] = (llm, llm.save_state())
    runs = {m[0]: [] for m in modes}
    short = {m[0]: [] for m in modes if not m[3]}
    outs, stats = {}, {m[0]: [] for m in modes if m[3]}
    for rep in range(a.reps):
        for j in range(len(modes)):
            name, ct, fa, sparq, bits = modes[(rep + j) % len(modes)]
            llm, state = ctxs[(ct, fa)]
            tps, out, s = decode(llm, state, toks, a.n_gen, sparq, bits)
            runs[name].append(round(tps, 2))
            outs.setdefault(name, out)
            if sparq:
                stats[name].append(s)
    for rep in range(a.reps):  # depth 0, after the long runs (their states are no longer needed)
        for name, ct, fa, sparq, _ in modes:
            if not sparq:
                short[name].append(round(decode_short(ctxs[(ct, fa)][0], toks, a.n_gen), 2))
    for llm, _ in ctxs.values():
        llm.close()
    med = {m: st.median(v) for m, v in runs.items()}
    dense_names = [m[0] for m in modes if not m[3]]
    fastest = max(dense_names, key=lambda m: med[m])
    med0 = {m: st.median(v) for m, v in short.items()}
    cache_type_of = {m[0]: m[1] for m in modes}
    bounds = {}
    for m in stats:
        same_ct = [d for d in dense_names if cache_type_of[d] == cache_type_of[m]]
        fast_ct = max(same_ct, key=lambda d: med[d])
        fast0 = max(same_ct, key=lambda d: med0[d])
        c = counters_of(stats[m])["compression"]
        b = amdahl_bound(1.0 / med0[fast0], 1.0 / med[fastest], c)
        bounds[m] = {"depth0_dense": fast0, "depth0_tokens_per_s": med0[fast0], "fastest_dense_at_S": fastest,
                     "fastest_dense_same_cache_type": fast_ct, "compression": c, "bound": round(b, 3),
                     "share_of_bound": round(med[m] / med[fastest] / b, 3)}
    res = {
        "prompt_tokens": len(toks), "prefill_s": prefill_s, "n_gen": a.n_gen, "reps": a.reps,
        "modes": {m[0]: {"cache_type": m[1], "flash_attn": m[2], "sparq": m[3], "kt_bits": m[4]} for m in modes},
        "tokens_per_s": runs, "median_tokens_per_s": med, "fastest_dense": fastest,
        "depth0_tokens_per_s": short, "depth0_median_tokens_per_s": med0, "amdahl": bounds,
        "speedup": {m: {"vs_fastest_dense": round(med[m] / med[fastest], 3),
                        **{f"vs_{d}": round(med[m] / med[d], 3) for d in dense_names}} for m in stats},
        # the same greedy tokens as dense flash attention on the same cache
        "same_tokens": {m[0]: outs[m[0]] == outs[f"dense_{m[1]}_fa1"] for m in modes
                        if m[3] and f"dense_{m[1]}_fa1" in outs},
        "counters": {m: counters_of(v) for m, v in stats.items()},
    }
    meta = {
        **run_meta(a.threads, load0),
        "model": model,
        "text": "Python's pydoc_data.topics (the Python documentation CPython ships, PSF License), every topic "
                "in key order, cut to the prompt length",
        "sparq": f"the defaults (sparq=True): {params}; dense -fa 1 = SparQ off on the same context (upstream's "
                 "flash attention, the cache layout SparQ uses); dense -fa 0 = upstream's other dense path, on a "
                 "context of its own",
        "cache_types": ", ".join(f"{ct} (K and V)" for ct in cache_types),
        "timing": f"greedy decode of {a.n_gen} tokens from each context's saved prefill state, tokens/s over the "
                  f"steps after the first; {a.reps} reps per mode, round-robin (each rep starts one mode later)",
    }
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{a.tag}.json", {"meta": meta, "result": res}, newline=True)
    rows = []
    for name, ct, fa, sparq, bits in modes:
        c = res["counters"].get(name)
        default = bits == params["sparq_kt_bits"]
        rows.append([name, ct, f"-fa {int(fa)}", ("SparQ defaults" if default else f"SparQ, {bits}-bit K^T") if sparq
                     else "dense",
                     f"{med[name]:.2f} ({', '.join(map(str, runs[name]))})", f"{med[name] / med[fastest]:.2f}x",
                     "" if not c else str(c["sparq_calls"]),
                     "" if not c else (", ".join(f"{k} {v}" for k, v in c["dense_calls"].items()) or "-"),
                     "" if not c else str(c["compression"]), "" if not c else str(c["mean_k"])])
    md = [f"# Decode on real text, dense against SparQ's defaults: {a.tag}", "", *md_bullets(meta.items()), "",
          f"{len(toks)} prompt tokens; the fastest dense mode: `{fastest}`.", "",
          *md_table(["mode", "K/V cache", "attention", "", "t/s median (reps)", "vs fastest dense", "SparQ calls",
                     "dense calls", "compression", "cells per KV head"], rows),
          "", "Speed-ups of the SparQ modes (medians): " + "; ".join(
              f"`{m}` " + ", ".join(f"{v:.2f}x {k[3:]}" for k, v in sp.items() if k != "vs_fastest_dense")
              for m, sp in res["speedup"].items()) + ".",
          "", "Amdahl bound over the fastest dense (depth 0: the same dense paths from a 16-token prompt, the "
          "fastest of the mode's cache type; the compression the counters measured): " + "; ".join(
              f"`{m}` bound {b['bound']:.2f}x (depth 0 `{b['depth0_dense']}` {b['depth0_tokens_per_s']:.2f} t/s, "
              f"compression {b['compression']}), reached {b['share_of_bound'] * 100:.0f} %" for m, b in bounds.items()) + ".",
          "", "Dense at depth 0, t/s median (reps): " + "; ".join(
              f"`{m}` {med0[m]:.2f} ({', '.join(map(str, v))})" for m, v in short.items()) + ".",
          "", "Same greedy tokens as dense flash attention on the same cache: " + ", ".join(
              f"`{m}` {'yes' if v else 'no'}" for m, v in res["same_tokens"].items()) + ".",
          "", "The counters cover each SparQ mode's decode steps over its reps. Compression: the cost model's "
          "bytes read by SparQ over dense's (K and V rows at their cache type's size, K^T at f16's, one byte with "
          "8 bits, 20/32 with 4) over the SparQ calls.", ""]
    (out / f"{a.tag}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0

# ============================================================================================= profile

PROFILE_DOC = """A steady decode loop on real text to put under a profiler (``perf record``).

Prefills a real model with the Python documentation (as ``real_text.py speed``), keeps the state
in ``--state-dir`` for the next run, then decodes ``--steps`` greedy tokens from it, SparQ's
defaults or dense, and prints tokens/s and the fork's counters. The prefill is skipped when the
state is kept, so a profiler started with a delay sees only decode steps:

    python bench/real_text.py profile --model smollm2 --tokens 8000 --steps 1      # prefill once
    perf record -D 2500 -F 2000 -g -o sparq.data \
        python bench/real_text.py profile --model smollm2 --tokens 8000 --steps 400
    perf report -i sparq.data --no-children --sort pid,symbol -g none

With ``--perf-control CTL,ACK`` (perf record's ``--control fifo:CTL,ACK`` started with ``-D -1``)
it enables perf's events for the decode steps only (``real_text.py split`` runs it so). It writes
no result file; speed is measured by ``real_text.py speed``, the split of a step by ``split``.
"""


def perf_control(fifos, command):
    """perf record's control FIFO: the command, then perf's ack (so the events are on before the
    first step is timed)."""
    with open(fifos[0], "w") as f:
        f.write(command + "\n")
    with open(fifos[1]) as f:
        f.readline()


def profile_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=PROFILE_DOC.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a GGUF path (default smollm2)")
    ap.add_argument("--tokens", type=int, default=8000, help="prompt tokens of the Python documentation")
    ap.add_argument("--steps", type=int, default=300, help="decode steps timed (default 300)")
    ap.add_argument("--mode", choices=("sparq", "dense"), default="sparq")
    ap.add_argument("--flash-attn", type=int, choices=(0, 1), default=1,
                    help="dense only: upstream's flash attention (1, the layout SparQ uses) or its other path (0)")
    ap.add_argument("--cache-type", choices=("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"), default="f16",
                    help="K and V cache type")
    ap.add_argument("--kt-bits", type=int, choices=(4, 8, 16), default=None,
                    help="SparQ's K^T width (sparq_kt_bits; default the fork's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/llama_sparq_profile"),
                    help="where the prefilled state is kept between runs")
    ap.add_argument("--perf-control", default=None, metavar="CTL,ACK",
                    help="perf record's control and ack FIFOs: events enabled over the decode steps only")
    args = ap.parse_args(argv)
    if args.tokens < 16 or args.steps < 1:
        ap.error("--tokens must be >= 16 and --steps >= 1")
    fifos = args.perf_control.split(",") if args.perf_control else None
    if fifos is not None and (len(fifos) != 2 or not all(Path(f).exists() for f in fifos)):
        ap.error(f"--perf-control takes two existing FIFOs, CTL,ACK; got {args.perf_control!r}")
    if args.mode == "sparq" and args.flash_attn == 0:
        ap.error("--flash-attn 0 is a dense path: SparQ runs on flash attention's cache layout")

    from llama_sparq import Llama
    from llama_sparq.models import resolve_model
    from sparq_lab.cost import cache_type_id

    model = resolve_model(args.model)
    fa = bool(args.flash_attn)
    ti = cache_type_id(args.cache_type)
    llm = Llama(str(model), n_ctx=args.tokens + args.steps + 64, n_batch=512, n_threads=args.threads,
                verbose=False, flash_attn=fa, type_k=ti, type_v=ti, **({"sparq": True} if fa else {}))
    toks = llm.tokenize(python_docs().encode())[:args.tokens]
    args.state_dir.mkdir(parents=True, exist_ok=True)
    # one state per cache layout: -fa 0 keeps V transposed
    state_path = args.state_dir / f"{Path(model).stem}_{args.tokens}_{args.cache_type}_fa{args.flash_attn}.pkl"
    if state_path.exists():
        state = pickle.loads(state_path.read_bytes())
    else:
        if fa:
            llm.set_sparq(sparq=False)
        t = time.perf_counter()
        llm.eval(toks[:-1])
        print(f"prefill of {len(toks) - 1} tokens: {time.perf_counter() - t:.1f} s", flush=True)
        state = llm.save_state()
        state_path.write_bytes(pickle.dumps(state))
    llm.load_state(state)
    if fa:
        kt = {"sparq_kt_bits": args.kt_bits} if args.mode == "sparq" and args.kt_bits else {}
        llm.set_sparq(sparq=args.mode == "sparq", **kt)
        llm.sparq_sync()  # K^T rebuilt from the loaded K now, not in the first timed step
    llm.reset_sparq_stats()
    tok = toks[-1]
    if fifos:
        perf_control(fifos, "enable")
    t = time.perf_counter()
    for _ in range(args.steps):
        llm.eval([tok])
        tok = int(np.argmax(llm.last_logits()))
    dt = time.perf_counter() - t
    if fifos:
        perf_control(fifos, "disable")
    s = llm.sparq_stats()
    label = "sparq" if args.mode == "sparq" else f"dense_{args.cache_type}_fa{args.flash_attn}"
    print(f"{label}: {args.steps / dt:.2f} tokens/s over {args.steps} steps; SparQ calls {s['n_sparq']}, "
          f"dense calls {s['n_dense']}, compression {s['compression']:.4f}")
    if args.mode == "sparq" and s["n_sparq"] == 0:
        print("error: no SparQ call ran", file=sys.stderr)
        return 1
    return 0

# ============================================================================================= ab

AB_DOC = """Two builds' SparQ decode on real text, end to end, timed against each other in alternation.

``op.py ab`` times the op alone on the paper's shapes; this times what a user sees on a real
model: ``real_text.py profile``'s steady greedy decode from the same prefilled state (SparQ's
defaults), once with the build in ``--before`` (a folder holding that build's libraries, e.g. a
copy of an installed ``llama_sparq/lib``, given as ``LLAMA_SPARQ_LIB_DIR``) and once with
``--after`` (default: the installed package's), ``--rounds`` times, before first in even rounds
and after first in odd ones, so that the drifts of a shared machine hit both alike. Each round also
times the dense paths of ``--dense`` (upstream's, with the after build): f16 ``-fa 1`` and
``-fa 0`` and a q8_0 cache, so that both builds stand beside the fastest dense of the same minutes.

    python bench/real_text.py ab --before /tmp/base_lib --model smollm2 --tokens 8000 --tag decode_ab_smollm2

Writes bench/results/<tag>.json and .md: the command, machine, commit, both folders, every
round's tokens/s and counters, the medians, the best of each, the median of the rounds'
after/before ratios, and each build over the fastest dense path. Each SparQ run must have made
SparQ calls.
"""


LINE = re.compile(r"^(\w+): ([0-9.]+) tokens/s over (\d+) steps; SparQ calls (\d+), .*compression ([0-9.]+)$", re.M)
DENSE = {"f16_fa1": ("f16", 1), "f16_fa0": ("f16", 0), "q8_0_fa1": ("q8_0", 1)}


def profile_cmd(args, dense: str | None = None, kt_bits: int | None = None, *, tokens: int | None = None,
                steps: int | None = None, state_dir: Path | None = None, python: Path | None = None,
                script: Path | None = None) -> list[str]:
    """The command of one profile run for args (model, tokens, steps, threads, state_dir; each of the
    last four overridden by its keyword): SparQ's defaults (kt_bits: that K^T width), or the dense path
    dense (a key of DENSE); by the interpreter python and the real_text.py script (default: these)."""
    cmd = [str(python or sys.executable), str(script or HERE / "real_text.py"), "profile", "--model", args.model,
           "--tokens", str(tokens or args.tokens), "--steps", str(steps or args.steps), "--threads", str(args.threads),
           "--state-dir", str(state_dir or args.state_dir)]
    if dense:
        ct, fa = DENSE[dense]
        cmd += ["--mode", "dense", "--cache-type", ct, "--flash-attn", str(fa)]
    return cmd + (["--kt-bits", str(kt_bits)] if kt_bits else [])


def profile_result(p: subprocess.CompletedProcess, what: str) -> dict:
    """A profile run's tokens/s, SparQ calls and compression from its last line; SystemExit naming
    what failed otherwise."""
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"{what} failed:\n{p.stdout[-1500:]}{p.stderr[-3000:]}")
    return {"tokens_per_s": float(m.group(2)), "sparq_calls": int(m.group(4)), "compression": float(m.group(5))}


def run_once(lib: Path | None, args, dense: str | None = None, python: Path | None = None) -> dict:
    """One profile run with the libraries in lib (None: the package's), by the interpreter python
    (None: this one) and its package's real_text.py: an earlier build whose ABI differs runs with its
    own environment."""
    env = dict(os.environ)
    env.pop("LLAMA_SPARQ_LIB_DIR", None)
    if lib is not None:
        env["LLAMA_SPARQ_LIB_DIR"] = str(lib)
    script = None
    if python is not None:
        # the checkout that environment was installed from: its bench/ beside its .venv (the venv's
        # interpreter is a link out of the checkout, so the path is made absolute, not resolved)
        script = Path(os.path.abspath(python)).parent.parent.parent / "bench" / "real_text.py"
    p = subprocess.run(profile_cmd(args, dense, python=python, script=script), capture_output=True, text=True, env=env)
    return profile_result(p, f"real_text.py profile with {lib or 'the installed package'}")


def ab_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=AB_DOC.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="folder with the earlier build's libraries")
    ap.add_argument("--after", type=Path, default=None, help="folder with this build's (default: the package's)")
    ap.add_argument("--before-python", type=Path, default=None,
                    help="the earlier build's interpreter (CHECKOUT/.venv/bin/python), for a build whose C API's "
                         "ABI differs from this package's: its runs then use its own package and bench/real_text.py")
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
            before = which == "before"
            r[which] = run_once(args.before if before else args.after, args, d, args.before_python if before else None)
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
           "after": str(args.after or "the installed package"), "before_python": str(args.before_python or ""),
           "model": args.model, "tokens": args.tokens,
           "steps": args.steps, "rounds": rounds, "summary": summary}
    stem = out_stem(args.out_dir, args.tag)
    write_json(stem.with_suffix(".json"), doc)
    lines = [f"# End-to-end decode, two builds in alternation: {args.tag}", ""]
    lines += md_bullets([("command", meta["command"]), ("machine", meta["machine"]),
                         ("load_average_start_end", doc["load_average_start_end"]), ("commit", meta["commit"]),
                         ("date", meta["date"]), ("before", doc["before"]), ("after", doc["after"]),
                         ("decode", f"{args.model}, {args.tokens} tokens of the Python documentation, "
                                    f"{args.steps} greedy steps per run with SparQ's defaults (real_text.py profile)")])
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


# ============================================================================================= the subcommands

SUBCOMMANDS = {"speed": speed_main, "profile": profile_main, "ab": ab_main, "budget": budget_main, "split": split_main}


def main(argv=None) -> int:
    return dispatch(__doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
