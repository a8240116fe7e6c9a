"""``python bench/real_text.py budget``: what each rule for the calibrated k keeps of dense's
next-token predictions on real text, and what it reads, as the context grows (real_text.py's
third subcommand)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, loadavg, md_bullets, md_table, run_meta, write_json  # noqa: E402

BUDGET_DOC = """The calibrated k's rule at growing context, on real text: predictions against dense, and cells read.

For each prompt length of ``--tokens``, the Python documentation (as ``real_text.py speed``) is
prefilled dense once and its state saved. From it each rule of ``--rules`` and dense attention
are teacher-forced over the text's next ``--steps`` tokens (every step a decode step over the
prompt and the steps before it; the same tokens for all, so every rule sees dense's trajectory).
Per rule, over those steps, against dense on the same context:

- ``top1``: the share of steps whose most likely next token is dense's;
- ``kl``: the mean KL divergence of the rule's next-token distribution from dense's (nats);
- ``dnll``: the mean negative log-likelihood of the text's actual next token, minus dense's
  (nats per token: what the rule costs in perplexity, ``exp(dnll)``);
- the counters: compression (the cost model's bytes read over dense's), cells attended per KV head
  (``mean_k``), and per layer the cells and the share of the op's reports whose ranked cells reached
  the coverage target (a report that does not attends every cell: that head was diffuse).

A rule is a ``+``-separated list of SparQ settings (the Python keywords without ``sparq_``),
e.g. ``default``, ``coverage=0.9``, ``coverage=0.9+k_frac=0.125``, ``k=256``, ``mean_v=off``;
``--rules`` is a comma list of rules.

    python bench/real_text.py budget --model gemma3 --tokens 8000,16000,32000 \\
        --rules default,coverage=0.9,coverage=0.8 --tag budget_gemma3

Writes bench/results/<tag>.json and .md.
"""


def parse_rule(rule: str) -> dict:
    """``coverage=0.9+k_frac=0.125`` -> {"sparq_coverage": 0.9, "sparq_k_frac": 0.125}: each value
    read as its field's kind (the library's table of settings), an unknown name refused before any
    prefill; the ranges are the library's to check."""
    from llama_sparq import _sparq

    if rule == "default":
        return {}
    kinds, out = _sparq.fields(), {}
    for part in rule.split("+"):
        key, eq, val = part.partition("=")
        if not eq or not key or not val:
            raise ValueError(f"--rules: {part!r} is not setting=value")
        if key not in kinds or key == "enabled":
            allowed = ", ".join(k for k in kinds if k != "enabled")
            raise ValueError(f"--rules: unknown setting {key!r}: allowed {allowed}")
        kind = kinds[key]
        try:
            v = ({"on": True, "off": False}[val] if kind == "bool" else float(val) if kind == "float"
                 else int(val) if kind == "int" else val)
        except (KeyError, ValueError):
            what = {"bool": "on or off", "float": "a number", "int": "an integer"}[kind]
            raise ValueError(f"--rules: {key}={val!r} is not {what}") from None
        out[f"sparq_{key}"] = v
    return out


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def forced(llm, state, toks, S, steps, settings):
    """Teacher-forced decode of toks[S-1 .. S+steps-2] from the state of toks[:S-1]: each step's
    next-token log-probabilities (steps x n_vocab) and the counters."""
    llm.load_state(state)
    llm.set_sparq(**settings)
    llm.reset_sparq_stats()
    rows = []
    for i in range(steps):
        llm.eval([toks[S - 1 + i]])
        # (the step's logits: the Llama keeps no row of them without logits_all)
        rows.append(log_softmax(llm.last_logits()))
    st = llm.sparq_stats() if settings.get("sparq") else None
    ls = llm.sparq_layer_stats() if settings.get("sparq") else None
    return np.stack(rows), st, ls


def compare(lp, dense, targets):
    """top1, kl, dnll of log-probabilities lp against dense's on the same steps."""
    top1 = float(np.mean(lp.argmax(-1) == dense.argmax(-1)))
    kl = float(np.mean(np.sum(np.exp(dense) * (dense - lp), axis=-1)))
    idx = np.arange(len(targets))
    dnll = float(np.mean(dense[idx, targets] - lp[idx, targets]))
    return top1, kl, dnll


def budget_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/real_text.py budget", description=BUDGET_DOC.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3", help="gemma3, smollm2 or a GGUF path")
    ap.add_argument("--tokens", default="8000,16000,32000", help="prompt lengths in tokens, comma list")
    ap.add_argument("--steps", type=int, default=128, help="teacher-forced steps per rule (default 128)")
    ap.add_argument("--rules", default="default", help="comma list of rules (see above; default: default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in a.tokens.split(",")]
        rules = {r: parse_rule(r) for r in a.rules.split(",")}
    except ValueError as e:
        ap.error(str(e))
    if min(lengths) < 1024 or a.steps < 4:
        ap.error("--tokens must be >= 1024 each, --steps >= 4")
    from real_text import python_docs

    from llama_sparq import Llama
    from llama_sparq.models import resolve_model

    model = str(resolve_model(a.model))
    load0 = loadavg()
    n_ctx = max(lengths) + a.steps + 64
    llm = Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=a.threads, swa_full=False, verbose=False, sparq=True)
    if n_ctx > llm._model.n_ctx_train():
        raise SystemExit(f"--tokens {max(lengths)} + --steps {a.steps} exceed the model's context of "
                         f"{llm._model.n_ctx_train()}")
    defaults = llm.sparq_params()
    toks = llm.tokenize(python_docs().encode(), add_bos=True)
    if len(toks) < max(lengths) + a.steps:
        raise SystemExit(f"the text has {len(toks)} tokens, fewer than {max(lengths) + a.steps}")
    res, rows = {}, []
    for S in lengths:
        llm.reset()
        llm.set_sparq(sparq=False)
        t0 = time.perf_counter()
        for i in range(0, S - 1, 512):
            llm.eval(toks[i:min(i + 512, S - 1)])
        prefill_s = time.perf_counter() - t0
        state = llm.save_state()
        targets = np.array(toks[S:S + a.steps])
        dense, _, _ = forced(llm, state, toks, S, a.steps, {"sparq": False})
        per = {"prefill_s": round(prefill_s, 1), "rules": {}}
        for name, settings in rules.items():
            # (every rule from the defaults: set_sparq keeps the settings a rule does not name)
            lp, st, ls = forced(llm, state, toks, S, a.steps, {**defaults, "sparq": True, **settings})
            top1, kl, dnll = compare(lp, dense, targets)
            layers = [{"layer": x["layer"], "mean_k": round(x["mean_k"], 1), "reached": round(x["reached"], 3),
                       "compression": round(x["compression"], 4)} for x in ls if x["n_measured"]]
            per["rules"][name] = {"top1": round(top1, 4), "kl": round(kl, 5), "dnll": round(dnll, 5),
                                  "compression": round(st["compression"], 4), "mean_k": round(st["mean_k"], 1),
                                  "sparq_calls": st["n_sparq"],
                                  "dense_calls": {k: v for k, v in st["n_dense"].items() if v}, "layers": layers}
            r = per["rules"][name]
            rows.append([str(S), name, f"{r['top1'] * 100:.1f}", f"{r['kl']:.4f}", f"{r['dnll']:+.4f}",
                         f"{r['compression']:.3f}", f"{r['mean_k']:.0f}", str(r["sparq_calls"]),
                         "; ".join(f"{x['layer']}: {x['mean_k']:.0f} / {x['reached'] * 100:.0f} %" for x in layers)])
            print(rows[-1], flush=True)
        res[S] = per
        del state
    llm.close()
    meta = {**run_meta(a.threads, load0), "model": model,
            "text": "Python's pydoc_data.topics (the Python documentation CPython ships, PSF License), every topic "
                    "in key order; the prompt is its first S tokens, the steps the next ones",
            "sparq": f"the defaults: {defaults}; each rule changes the settings it names",
            "method": f"one dense prefill per length, then dense and each rule teacher-forced over the same {a.steps} "
                      "steps from the saved state"}
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{a.tag}.json", {"meta": meta, "result": {str(k): v for k, v in res.items()}}, newline=True)
    md = [f"# The calibrated k's rule on real text: {a.tag}", "", *md_bullets(meta.items()), "",
          *md_table(["prompt tokens", "rule", "top-1 = dense's (%)", "KL from dense (nats)", "dNLL (nats/token)",
                     "compression", "cells per KV head", "SparQ calls", "per layer: cells / reports reaching the target"],
                    rows),
          "", "top-1: the share of steps whose most likely token is dense's; dNLL: the mean negative log-likelihood "
          "of the text's next token minus dense's. Compression and cells: the fork's counters over the rule's steps.",
          ""]
    (out / f"{a.tag}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0
