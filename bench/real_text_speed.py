#!/usr/bin/env python3
"""Decode speed on real text: dense attention against SparQ's defaults on the same prefilled cache.

llama-bench fills its ``-d`` context with random tokens. The calibrated k follows the attention
it meets, and attention over random tokens is diffuse in many layers (Gemma 3 270M's global
layers at 32K run dense between checks there), so llama-bench understates what the defaults do
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
attention). ``--kt-bits 16,8`` times
SparQ with each K^T width (``sparq_kt_bits``; 8, the default, is mode ``sparq_<type>_kt8``, 16 mode
``sparq_<type>``) on the same context. Each SparQ mode is compared with every dense mode and with
the fastest of them.

    python bench/real_text_speed.py --model gemma3 --tokens 32000 --tag real_text_gemma3_32k
    python bench/real_text_speed.py --model smollm2 --tokens 8000 --reps 7 --n-gen 48 --tag real_text_smollm2_8k

Writes bench/results/<tag>.json and .md: the command, machine, commit, model, the settings,
per mode the tokens/s of every rep and their median, the speed-ups, and the fork's counters over
each SparQ mode's reps (SparQ calls, dense calls by reason, compression, cells per KV head).
"""

from __future__ import annotations

import argparse
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, loadavg, md_bullets, md_table, run_meta, write_json  # noqa: E402


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
    first, then SparQ per K^T width (an 8-bit K^T: `_kt8`)."""
    modes = []
    for ct in cache_types:
        for fa in dense:
            if fa == "fa0" and ct != "f16":
                continue  # a quantized V needs flash attention (upstream refuses -fa 0 with it)
            modes.append((f"dense_{ct}_{fa}", ct, fa == "fa1", False, 16))
        for bits in kt_bits:
            modes.append((f"sparq_{ct}" + ("_kt8" if bits == 8 else ""), ct, True, True, bits))
    return modes


def counters_of(stats):
    """The counters over the reps of a SparQ mode."""
    n_sparq = sum(s["n_sparq"] for s in stats)
    dense_calls = {k: sum(s["n_dense"][k] for s in stats) for k in stats[0]["n_dense"]}
    n_diffuse = dense_calls.get("diffuse", 0)
    compression = (sum(s["compression"] * (s["n_sparq"] + s["n_dense"].get("diffuse", 0)) for s in stats)
                   / max(1, n_sparq + n_diffuse))
    mean_k = (sum(s["mean_k"] * s["n_measured"] for s in stats) / max(1, sum(s["n_measured"] for s in stats)))
    return {"sparq_calls": n_sparq, "dense_calls": {k: v for k, v in dense_calls.items() if v},
            "compression": round(compression, 4), "mean_k": round(mean_k, 1), "n_layers": stats[0]["n_layers"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3", help="gemma3, smollm2 or a GGUF path")
    ap.add_argument("--tokens", type=int, default=32000, help="prompt tokens of text (default 32000)")
    ap.add_argument("--n-gen", type=int, default=32, help="tokens decoded per rep (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="reps of each mode, round-robin (default 3)")
    # every dense path by default: a speed-up is over the fastest of them on the machine at hand
    ap.add_argument("--cache-types", default="f16,q8_0", help="K/V cache types, comma list of f16, q8_0 (default "
                    "both: dense and SparQ on each)")
    ap.add_argument("--dense", default="fa1,fa0", help="dense paths, comma list of fa1 (flash attention, the "
                    "layout SparQ uses), fa0 (upstream's other path; f16 only) (default both)")
    from llama_sparq import _sparq

    kt_default = str(_sparq.default_params()["kt_bits"])
    ap.add_argument("--kt-bits", default=kt_default, help="SparQ's K^T widths, comma list of 16, 8 (sparq_kt_bits; "
                    f"default {kt_default}, the fork's default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.tokens < 1024 or a.n_gen < 4 or a.reps < 1:
        ap.error("--tokens must be >= 1024, --n-gen >= 4, --reps >= 1")
    from llama_sparq.cost import CACHE_TYPES, cache_type_id

    cache_types = a.cache_types.split(",")
    dense = a.dense.split(",")
    kt_bits = a.kt_bits.split(",")
    bad = ([c for c in cache_types if c not in ("f16", "q8_0")] + [x for x in dense if x not in ("fa0", "fa1")]
           + [b for b in kt_bits if b not in ("16", "8")])
    if bad or not cache_types or not dense or not kt_bits:
        ap.error(f"--cache-types takes f16, q8_0, --dense fa1, fa0 and --kt-bits 16, 8 (comma lists); got "
                 f"{', '.join(bad) or 'nothing'}")
    kt_bits = [int(b) for b in kt_bits]
    assert set(cache_types) <= set(CACHE_TYPES)

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
        rows.append([name, ct, f"-fa {int(fa)}", ("SparQ defaults" if bits == 8 else "SparQ, 16-bit K^T") if sparq
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
          "bytes read by SparQ over dense's (K and V rows at their cache type's size, K^T at f16's or, 8-bit, one "
          "byte) over the "
          "SparQ calls and the calibrated k's dense stretches (dense calls `diffuse`, each at 1).", ""]
    (out / f"{a.tag}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
