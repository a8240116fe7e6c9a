#!/usr/bin/env python3
"""Does a sequence's greedy output depend on what else shares its ubatches?

llama-server decodes several slots together and processes a new slot's prompt beside the
other slots' decode rows. This replays that schedule on the low-level API (4 sequences in
their own KV streams; each step: the generating sequences' decode rows plus one 512-token
chunk of the next prompt) and the same sequences one at a time, for dense attention and for
SparQ variants, and compares, per sequence, the greedy tokens and the top-2 logit margins.

Upstream's computation is not batch-invariant (the matrix products of 1-row and many-row
ubatches round differently), so even dense logits move between the two schedules; what
matters is whether a variant turns that into different tokens.

    python bench/batch_invariance.py --tag batch_invariance_gemma3

Writes bench/results/<tag>.{json,md} with the command, machine, commit, settings and the
SparQ counters of every run.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, cpu_model, git_commit, kernel_isa, loadavg, now_iso, write_json  # noqa: E402
from server_load import paragraph  # noqa: E402

from llama_sparq import Llama, _sparq  # noqa: E402
from llama_sparq._llama import llama_cpp  # noqa: E402  (after pointing llama_cpp at the fork)
from llama_sparq.models import resolve_model  # noqa: E402

VARIANTS = {
    "dense": None,
    "sparq (defaults: scaled basis)": {"basis": "scaled"},
    "sparq, paper basis": {"basis": "model"},
}


def make_prompts(llm, n, lo, step):
    out = []
    for i in range(n):
        rng = random.Random(i)
        para = paragraph(rng)
        text = f"Request {i}: the same notes, written out again and again.\n"
        text += "\n".join(para for _ in range((lo + step * i) // len(para.split()) + 2))
        out.append(llm.tokenize(text.encode())[:lo + step * i])
    return out


class Runner:
    def __init__(self, model, prompts, n_pred, threads, chunk):
        self.model, self.prompts, self.n_pred, self.threads, self.chunk = model, prompts, n_pred, threads, chunk
        self.nv = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(model))

    def new_ctx(self, settings):
        p = llama_cpp.llama_context_default_params()
        n = len(self.prompts)
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.kv_unified = n * 4096, 2048, 512, n, False
        p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        p.n_threads = p.n_threads_batch = self.threads
        ctx = llama_cpp.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError("llama_init_from_model failed")
        d = _sparq.default_params()
        d.update(settings or {})
        d["enabled"] = settings is not None
        _sparq.set_params(ctx, d)
        return ctx, d

    def decode(self, ctx, items, margins):
        b = llama_cpp.llama_batch_init(len(items), 0, 1)
        b.n_tokens = len(items)
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, out
            b.seq_id[i][0] = seq
        if llama_cpp.llama_decode(ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        res = {}
        for i, it in enumerate(items):
            if it[3]:
                lg = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(self.nv,))
                top = np.argsort(lg)[::-1][:2]
                res[it[2]] = int(top[0])
                margins[it[2]].append(float(lg[top[0]] - lg[top[1]]))
        llama_cpp.llama_batch_free(b)
        return res

    def run(self, settings, concurrent):
        ctx, d = self.new_ctx(settings)
        n = len(self.prompts)
        out = {s: [] for s in range(n)}
        margins = {s: [] for s in range(n)}
        if not concurrent:
            for s, p in enumerate(self.prompts):
                for c in range(0, len(p), 2048):
                    r = self.decode(ctx, [(t, c + j, s, c + j == len(p) - 1) for j, t in enumerate(p[c:c + 2048])],
                                    margins)
                out[s].append(r[s])
                while len(out[s]) < self.n_pred:
                    out[s].append(self.decode(ctx, [(out[s][-1], len(p) + len(out[s]) - 1, s, True)], margins)[s])
        else:
            fed = {s: 0 for s in range(n)}
            while any(len(out[s]) < self.n_pred for s in range(n)):
                items = [(out[s][-1], len(self.prompts[s]) + len(out[s]) - 1, s, True) for s in range(n)
                         if fed[s] == len(self.prompts[s]) and 0 < len(out[s]) < self.n_pred]
                for s in range(n):
                    p = self.prompts[s]
                    if fed[s] < len(p):
                        c, m = fed[s], min(self.chunk, len(p) - fed[s])
                        items += [(t, c + j, s, c + j == len(p) - 1) for j, t in enumerate(p[c:c + m])]
                        fed[s] += m
                        break
                for s, t in self.decode(ctx, items, margins).items():
                    out[s].append(t)
        stats = _sparq.get_stats(ctx)
        llama_cpp.llama_free(ctx)
        return out, margins, stats, d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF, gemma3 or smollm2 (default: Gemma 3 270M)")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--min-tokens", type=int, default=1400)
    ap.add_argument("--step-tokens", type=int, default=300, help="prompt i has min + i * step tokens")
    ap.add_argument("--n-predict", type=int, default=12)
    ap.add_argument("--chunk", type=int, default=512, help="prompt tokens beside the decode rows per step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="batch_invariance_gemma3")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)

    model_path = str(resolve_model(a.model))
    llm = Llama(model_path, n_ctx=512, verbose=False)  # loads the model (and the fork's library)
    prompts = make_prompts(llm, a.sequences, a.min_tokens, a.step_tokens)
    runner = Runner(llm._model.model, prompts, a.n_predict, a.threads, a.chunk)
    meta = {
        "command": "python " + " ".join(shlex.quote(x) for x in [sys.argv[0]] + (argv or sys.argv[1:])),
        "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": a.threads,
                    "kernel_isa": kernel_isa(), "loadavg_1min_start": loadavg()},
        "commit": git_commit(),
        "date": now_iso(),
        "model": model_path,
        "prompt_tokens": [len(p) for p in prompts],
        "n_predict": a.n_predict,
        "schedule": f"{a.sequences} sequences in their own KV streams; concurrent: decode rows of the generating "
                    f"sequences plus one {a.chunk}-token chunk of the next prompt per llama_decode; alone: one "
                    f"sequence at a time (prompt in 2048-token batches of 512-token ubatches, then decode steps)",
    }
    rows = []
    for name, settings in VARIANTS.items():
        o_a, m_a, st_a, d = runner.run(settings, False)
        o_c, m_c, st_c, _ = runner.run(settings, True)
        for s in range(a.sequences):
            first = next((i for i, (x, y) in enumerate(zip(o_a[s], o_c[s])) if x != y), None)
            same_prefix = a.n_predict if first is None else first + 1  # margins comparable up to the first flip
            dm = max(abs(x - y) for x, y in zip(m_a[s][:same_prefix], m_c[s][:same_prefix]))
            rows.append({"variant": name, "sequence": s, "prompt_tokens": len(prompts[s]),
                         "equal": first is None, "first_differing_token": first,
                         "min_margin_alone": round(min(m_a[s]), 3), "min_margin_concurrent": round(min(m_c[s]), 3),
                         "max_margin_change": round(dm, 3),
                         "tokens_alone": o_a[s], "tokens_concurrent": o_c[s]})
        rows[-1]["_settings"] = None if settings is None else {k: d[k] for k in ("r", "k", "l", "min_kv", "basis")}
        meta.setdefault("counters", {})[name] = {"alone": st_a, "concurrent": st_c}
        meta.setdefault("settings", {})[name] = None if settings is None else {
            k: d[k] for k in ("r", "k", "l", "min_kv", "selector", "gqa", "mean_v", "basis")}
        print(name, [(r["sequence"], r["equal"], r["min_margin_alone"]) for r in rows if r["variant"] == name],
              flush=True)
    for r in rows:
        r.pop("_settings", None)
    meta["machine"]["loadavg_1min_end"] = loadavg()

    a.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(a.out_dir / f"{a.tag}.json", {"meta": meta, "rows": rows}, newline=True)
    md = [f"# Greedy output alone vs beside other sequences ({a.tag})", ""]
    for k in ("command", "machine", "commit", "date", "model", "prompt_tokens", "n_predict", "schedule", "settings"):
        md.append(f"- **{k}**: {meta[k]}")
    md.append("- **counters** (SparQ calls alone / concurrent): " + ", ".join(
        f"{n}: {c['alone'].get('n_sparq', 0)} / {c['concurrent'].get('n_sparq', 0)}"
        + (f" (compression {c['alone'].get('compression', 0):.3f})" if c['alone'].get('n_sparq') else "")
        for n, c in meta["counters"].items()))
    md += ["", "| variant | sequence | prompt tokens | tokens equal | first differing token | min top-2 margin alone "
           "| min margin concurrent | largest margin change (before any flip) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['variant']} | {r['sequence']} | {r['prompt_tokens']} | {'yes' if r['equal'] else 'NO'} | "
                  f"{'' if r['first_differing_token'] is None else r['first_differing_token']} | "
                  f"{r['min_margin_alone']} | {r['min_margin_concurrent']} | {r['max_margin_change']} |")
    md += ["", "Margins are logit differences between the top two tokens at each greedy step. Dense's logits "
           "move between the schedules too (upstream is not batch-invariant); a variant keeps the answers "
           "when its margins stay above that movement."]
    (a.out_dir / f"{a.tag}.md").write_text("\n".join(md) + "\n")
    print(f"wrote {a.out_dir / (a.tag + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
