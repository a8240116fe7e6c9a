#!/usr/bin/env python3
"""Decode speed on real text: dense attention against SparQ's defaults on the same prefilled cache.

llama-bench fills its ``-d`` context with random tokens. The calibrated k follows the attention
it meets, and attention over random tokens is diffuse in many layers (Gemma 3 270M's global
layers at 32K run dense between checks there), so llama-bench understates what the defaults do
on text. This benchmark prefills text instead: the Python documentation that CPython ships
(``pydoc_data.topics``, every topic in key order, PSF License; nothing is downloaded), cut to
``--tokens``. Then, from the saved state, the same greedy continuation is decoded with SparQ
off (upstream's flash attention on the same cache layout) and with ``sparq=True``, alternating
which goes first, ``--reps`` times each; time per token over the steps after the first.

    python bench/real_text_speed.py --model gemma3 --tokens 32000 --tag real_text_gemma3_32k
    python bench/real_text_speed.py --model smollm2 --tokens 8000 --tag real_text_smollm2_8k

Writes bench/results/<tag>.json and .md: the command, machine, commit, model, the settings,
per mode the tokens/s of every rep and their median, the speedup, and the fork's counters over
the SparQ reps (SparQ calls, dense calls by reason, compression, cells attended per KV head).
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


def decode(llm, state, toks, n_gen, sparq):
    llm.load_state(state)
    llm.set_sparq(sparq=sparq)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3", help="gemma3, smollm2 or a GGUF path")
    ap.add_argument("--tokens", type=int, default=32000, help="prompt tokens of text (default 32000)")
    ap.add_argument("--n-gen", type=int, default=32, help="tokens decoded per rep (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="reps of each mode, alternating (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.tokens < 1024 or a.n_gen < 4 or a.reps < 1:
        ap.error("--tokens must be >= 1024, --n-gen >= 4, --reps >= 1")

    from llama_sparq import Llama
    from llama_sparq.models import resolve_model

    model = str(resolve_model(a.model))
    load0 = loadavg()
    llm = Llama(model, n_ctx=a.tokens + a.n_gen + 64, n_batch=512, n_threads=a.threads, swa_full=False,
                verbose=False, sparq=True)
    n_ctx_train = llm._model.n_ctx_train()
    if a.tokens + a.n_gen > n_ctx_train:
        raise SystemExit(f"--tokens {a.tokens} + --n-gen {a.n_gen} exceed the model's context of {n_ctx_train}")
    toks = llm.tokenize(python_docs().encode(), add_bos=True)
    if len(toks) < a.tokens:
        raise SystemExit(f"the text has {len(toks)} tokens, fewer than --tokens {a.tokens}")
    toks = toks[:a.tokens]
    params = llm.sparq_params()
    t0 = time.perf_counter()
    for i in range(0, len(toks) - 1, 512):
        llm.eval(toks[i:min(i + 512, len(toks) - 1)])
    t_pre = time.perf_counter() - t0
    state = llm.save_state()
    runs = {"dense": [], "sparq": []}
    outs, stats = {}, []
    for rep in range(a.reps):
        order = ("dense", "sparq") if rep % 2 == 0 else ("sparq", "dense")
        for mode in order:
            tps, out, s = decode(llm, state, toks, a.n_gen, mode == "sparq")
            runs[mode].append(round(tps, 2))
            outs.setdefault(mode, out)
            if mode == "sparq":
                stats.append(s)
    llm.close()
    med = {m: st.median(v) for m, v in runs.items()}
    n_sparq = sum(s["n_sparq"] for s in stats)
    dense_calls = {k: sum(s["n_dense"][k] for s in stats) for k in stats[0]["n_dense"]}
    n_diffuse = dense_calls.get("diffuse", 0)
    compression = (sum(s["compression"] * (s["n_sparq"] + s["n_dense"].get("diffuse", 0)) for s in stats)
                   / max(1, n_sparq + n_diffuse))
    mean_k = (sum(s["mean_k"] * s["n_measured"] for s in stats) / max(1, sum(s["n_measured"] for s in stats)))
    res = {
        "prompt_tokens": len(toks), "prefill_s": round(t_pre, 1), "n_gen": a.n_gen, "reps": a.reps,
        "tokens_per_s": runs, "median_tokens_per_s": med, "speedup": round(med["sparq"] / med["dense"], 3),
        "same_tokens": outs["dense"] == outs["sparq"],
        "counters": {"sparq_calls": n_sparq, "dense_calls": {k: v for k, v in dense_calls.items() if v},
                     "compression": round(compression, 4), "mean_k": round(mean_k, 1),
                     "n_layers": stats[0]["n_layers"]},
    }
    meta = {
        **run_meta(a.threads, load0),
        "model": model,
        "text": "Python's pydoc_data.topics (the Python documentation CPython ships, PSF License), every topic "
                "in key order, cut to the prompt length",
        "sparq": f"the defaults (sparq=True): {params}; dense = SparQ off on the same context (upstream's flash "
                 "attention, the cache layout SparQ uses)",
        "timing": f"greedy decode of {a.n_gen} tokens from the saved prefill state, tokens/s over the steps after "
                  f"the first; {a.reps} reps per mode, alternating which goes first",
    }
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{a.tag}.json", {"meta": meta, "result": res}, newline=True)
    c = res["counters"]
    md = [f"# Decode on real text, dense against SparQ's defaults: {a.tag}", "", *md_bullets(meta.items()), "",
          *md_table(["prompt tokens", "dense t/s (reps)", "SparQ t/s (reps)", "speedup (medians)", "same tokens",
                     "SparQ calls", "dense calls", "compression", "cells per KV head"],
                    [[str(x) for x in [len(toks), f"{med['dense']:.2f} ({', '.join(map(str, runs['dense']))})",
                      f"{med['sparq']:.2f} ({', '.join(map(str, runs['sparq']))})", f"{res['speedup']:.2f}x",
                      "yes" if res["same_tokens"] else "no", c["sparq_calls"],
                      ", ".join(f"{k} {v}" for k, v in c["dense_calls"].items()) or "-", c["compression"],
                      c["mean_k"]]]]),
          "", "The counters cover the SparQ reps' decode steps. Compression: the cost model's M_sparq / M_dense "
          "over the SparQ calls and the calibrated k's dense stretches (dense calls `diffuse`, each at 1).", ""]
    (out / f"{a.tag}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
