#!/usr/bin/env python3
"""Under load: concurrent requests to llama-server against each request alone, and
sequences decoded beside others against the same sequences alone.

    python bench/server_load.py [options]            the server load sweep (the default subcommand)
    python bench/server_load.py soak ...             a long day of mixed traffic, SparQ and dense: errors, memory, latency
    python bench/server_load.py invariance ...       batch invariance through the Python bindings

`python bench/server_load.py load -h`, `soak -h` and `invariance -h` list the options. The server helpers
here (Server, run_load, free_port, ...) are what the tests drive servers with.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the server helpers are serverlib's; tests import them from here too
from serverlib import Server, ServerError, free_port, stop_process  # noqa: E402,F401
from benchlib import (RESULTS, command_line, cpu_model, dispatch, git_commit, kernel_isa,  # noqa: E402
                      loadavg, now_iso, pct, write_json, write_md)


# ============================================================================================= load

LOAD_DOC = """llama-server with SparQ under load: concurrent completion requests against the server's
slots, each checked against the same request run alone.

One ``llama-sparq-server`` on 127.0.0.1 (a free port) with SparQ on and the server's
default slot count (``-np`` auto: 4 slots; ``--parallel N`` sets another). Prompts of
``--min-tokens``..``--max-tokens`` tokens are built from filler text, different for every
request (a paragraph of random words written out again and again, so the greedy
continuation is a confident copy; exact token counts: the server tokenizes, the text is
cut). Then:

1. all ``--requests`` completions are sent at once (``/completion``, greedy: temperature 0,
   top-k 1, ``n_predict`` fixed, ``cache_prompt`` false), so the slots decode together and
   the rest wait in the server's queue;
2. the same requests are sent again one at a time (each decoded alone);
3. every concurrent response must be complete (``n_predict`` tokens, or a stop) and equal,
   token for token, to the same request run alone; ``/metrics`` must show SparQ calls, and
   the server log no error line.

    python bench/server_load.py                       # 16 requests, 4 slots, 2K-6K tokens
    python bench/server_load.py --requests 4 --min-tokens 1200 --max-tokens 1600 --tag quick
    python bench/server_load.py --sweep 16x4,16x8,64x4,64x8 --tag server_load_sweep   # the load table

``--sweep NxS,...`` runs the load table instead: for each variant (``--variants sparq,dense``)
and slot count S one server (``-np S``, ``-c`` S x ``--ctx-per-slot``), every request alone
once per variant (a few again on the other servers, which must agree), then each request count
N sent at once; per row: mismatches, errors, throughput (generated and all tokens per second)
and p50/p95 latency, the SparQ counters. Dense's mismatches are upstream's own (not
batch-invariant) and are listed with their top-2 margins; SparQ must have none.

Writes bench/results/<tag>.{json,md} (default tag server_load) with the command, machine,
commit, sizes, times, the SparQ counters and the mismatches. The functions are also used
by tests/test_sparq_server.py.
"""


WORDS = ("river mountain lantern copper harvest violet engine meadow silver quiet orchard signal "
         "harbor amber thunder pocket garden marble window falcon winter candle meridian ribbon "
         "granite whisper saddle compass orbit pepper shadow velvet anchor kettle willow summit").split()


def paragraph(rng: random.Random, n_words: int = 48) -> str:
    sents, n = [], 0
    while n < n_words:
        k = rng.randint(5, 11)
        sents.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    return " ".join(sents)


def build_prompts(server: Server, n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """n token lists of lengths spread evenly over lo..hi: a paragraph of random words, its own
    for each request, written out again and again and cut mid-paragraph, so that the greedy
    continuation copies the paragraph on from earlier in the context (a confident prediction:
    decoding noise cannot flip a near tie) and attention has to find the earlier copies."""
    prompts = []
    for i in range(n):
        rng = random.Random(seed * 100003 + i)
        target = lo if n == 1 else lo + round(i * (hi - lo) / (n - 1))
        para = paragraph(rng)
        n_words = len(para.split())
        text = f"Request {i}: the same notes, written out again and again.\n"
        text += "\n".join(para for _ in range(target // n_words + 2))  # a word is at least one token
        toks = server.post("/tokenize", {"content": text, "add_special": True}, timeout=120)["tokens"]
        if len(toks) < target:
            raise ServerError(f"filler text too short: {len(toks)} < {target} tokens")
        prompts.append(toks[:target])
    order = list(range(n))
    random.Random(seed).shuffle(order)  # long and short prompts interleaved in the queue
    return [prompts[i] for i in order]


def complete(server: Server, tokens: list[int], n_predict: int, timeout: float) -> dict:
    t0 = time.monotonic()
    r = server.post("/completion", {
        "prompt": tokens, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 0,
        "cache_prompt": False, "return_tokens": True, "stream": False, "n_probs": 4,
    }, timeout=timeout)
    r["_seconds"] = time.monotonic() - t0
    return r


def is_complete(r: dict, n_predict: int) -> bool:
    if r.get("truncated"):
        return False
    n = r.get("tokens_predicted", len(r.get("tokens", [])))
    return n == n_predict or (0 < n <= n_predict and r.get("stop_type") in ("eos", "word"))


def top_logprobs(r: dict, j) -> dict:
    """{token id: log p} of the top candidates the server returned at generated token j ({} if none)."""
    try:
        return {t["id"]: t["logprob"] for t in r["completion_probabilities"][j]["top_logprobs"]}
    except (KeyError, IndexError, TypeError):
        return {}


def top2_margin(r: dict, j):
    """log p(top 1) - log p(top 2) at generated token j (how near a tie the greedy choice was)."""
    lp = sorted(top_logprobs(r, j).values(), reverse=True)
    return round(lp[0] - lp[1], 4) if len(lp) >= 2 else None


def margin_changes(conc: dict, alone: dict) -> list[tuple[int, float, float]]:
    """How far the schedule moved a request's logits, per generated token j over the common prefix
    (up to and including the first differing token): (j, the top-2 margin alone, the change of
    that margin) where the margin is log p(alone's top 1) - log p(alone's top 2), measured in the
    concurrent response on the same two tokens (negative there when it flipped). A token whose
    two candidates are not both among the concurrent response's top candidates is left out."""
    out = []
    ta, tc = alone.get("tokens", []), conc.get("tokens", [])
    for j in range(min(len(ta), len(tc))):
        a, c = top_logprobs(alone, j), top_logprobs(conc, j)
        ranked = sorted(a, key=a.get, reverse=True)
        if len(ranked) >= 2 and ranked[0] in c and ranked[1] in c:
            m_alone = a[ranked[0]] - a[ranked[1]]
            out.append((j, round(m_alone, 4), round(abs(m_alone - (c[ranked[0]] - c[ranked[1]])), 4)))
        if ta[j] != tc[j]:
            break
    return out


def run_load(server: Server, prompts: list[list[int]], n_predict: int, request_timeout: float) -> dict:
    """The concurrent pass, then the sequential baseline; the figures and the mismatches."""
    m0 = server.metrics()
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        futs = [ex.submit(complete, server, p, n_predict, request_timeout) for p in prompts]
        conc = [f.result(timeout=request_timeout + 30) for f in futs]
    t_conc = time.monotonic() - t0
    m1 = server.metrics()
    t0 = time.monotonic()
    alone = [complete(server, p, n_predict, request_timeout) for p in prompts]
    t_alone = time.monotonic() - t0
    m2 = server.metrics()

    mismatches, incomplete = [], []
    for i, (c, a) in enumerate(zip(conc, alone)):
        if not is_complete(c, n_predict) or not is_complete(a, n_predict):
            incomplete.append(i)
        if c.get("tokens") != a.get("tokens") or c.get("content") != a.get("content"):
            first = next((j for j, (x, y) in enumerate(zip(c.get("tokens", []), a.get("tokens", []))) if x != y), None)
            mismatches.append({"request": i, "prompt_tokens": len(prompts[i]), "first_differing_token": first,
                               "top2_logprob_margin_alone": top2_margin(a, first),
                               "concurrent": c.get("content"), "alone": a.get("content")})

    def delta(a, b, key):
        return int(b.get(key, 0) - a.get(key, 0))

    dense_keys = sorted(k for k in m2 if k.startswith("sparq_dense_calls_total"))
    return {
        "requests": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "n_predict": n_predict,
        "concurrent_seconds": round(t_conc, 2),
        "alone_seconds": round(t_alone, 2),
        "sparq_calls_concurrent": delta(m0, m1, "sparq_calls_total"),
        "sparq_calls_alone": delta(m1, m2, "sparq_calls_total"),
        "sparq_dense_concurrent": {re.sub(r'.*reason="(\w+)".*', r"\1", k): delta(m0, m1, k) for k in dense_keys},
        "sparq_compression": m2.get("sparq_compression"),
        "busy_slots_per_decode": m1.get("n_busy_slots_per_decode"),
        "incomplete": incomplete,
        "mismatches": mismatches,
        "texts": [c.get("content") for c in conc],
    }


def concurrent_pass(server: Server, prompts: list[list[int]], n_predict: int, request_timeout: float) -> dict:
    """All requests at once: the responses (or the error each raised), wall time, latencies."""
    m0 = server.metrics()
    t0 = time.monotonic()

    def one(p):
        try:
            return complete(server, p, n_predict, request_timeout)
        except Exception as e:  # an HTTP error or a dropped connection: counted, not raised
            return {"_error": f"{type(e).__name__}: {e}"[:300]}

    with cf.ThreadPoolExecutor(max_workers=len(prompts)) as ex:
        res = list(ex.map(one, prompts))
    wall = time.monotonic() - t0
    m1 = server.metrics()
    return {"responses": res, "wall": wall, "m0": m0, "m1": m1}


def sweep(args, model, on_row=None) -> tuple[dict, list]:
    """The load table: for each variant (SparQ, dense) and slot count, one server; every request
    alone once (on the first slot count's server; a few re-checked on the others), then each
    request count sent at once. Mismatches: concurrent responses whose tokens differ from alone."""
    configs = [tuple(int(x) for x in c.split("x")) for c in args.sweep.split(",")]
    n_max = max(r for r, _ in configs)
    slot_counts = sorted({s for _, s in configs})
    variants = [v.strip() for v in args.variants.split(",")]
    rows, servers = [], []
    alone_margins = {}  # variant -> per request: its alone tokens and top-2 margins
    prompts = None
    for variant in variants:
        flags = shlex.split(args.server_args) if variant == "sparq" else []
        alone = None
        for slots in slot_counts:
            srv_args = ["-c", slots * args.ctx_per_slot, "-np", slots, *flags]
            with Server(model, srv_args, threads=args.threads) as srv:
                props = srv.get("/props")
                if prompts is None:
                    prompts = build_prompts(srv, n_max, args.min_tokens, args.max_tokens, args.seed)
                servers.append(" ".join(shlex.quote(str(a)) for a in srv.cmd))
                recheck = []
                if alone is None:
                    t0 = time.monotonic()
                    alone = [complete(srv, p, args.n_predict, args.request_timeout) for p in prompts]
                    alone_s = time.monotonic() - t0
                    alone_margins[variant] = [{"tokens": a.get("tokens", []),
                                               "top2_margins": [top2_margin(a, j) for j in range(len(a.get("tokens", [])))]}
                                              for a in alone]
                else:
                    # the alone reference comes from the first server: a few requests again on this one
                    recheck = [i for i in range(0, n_max, max(1, n_max // 4))][:4]
                    recheck = [i for i in recheck
                               if complete(srv, prompts[i], args.n_predict, args.request_timeout).get("tokens")
                               != alone[i].get("tokens")]
                for n_req, s in configs:
                    if s != slots:
                        continue
                    sub = prompts[:n_req]
                    p = concurrent_pass(srv, sub, args.n_predict, args.request_timeout)
                    mism, incomplete, errors = [], [], []
                    lat, n_gen, moves, worst = [], 0, [], []
                    for i, (c, a) in enumerate(zip(p["responses"], alone)):
                        if "_error" in c:
                            errors.append({"request": i, "error": c["_error"]})
                            continue
                        lat.append(c["_seconds"])
                        n_gen += int(c.get("tokens_predicted", len(c.get("tokens", []))))
                        if not is_complete(c, args.n_predict):
                            incomplete.append(i)
                        mc = margin_changes(c, a)
                        moves += [d for _, _, d in mc]
                        worst += [(d, i, j, m) for j, m, d in mc]
                        if c.get("tokens") != a.get("tokens"):
                            first = next((j for j, (x, y) in enumerate(zip(c.get("tokens", []), a.get("tokens", [])))
                                          if x != y), None)
                            mism.append({"request": i, "prompt_tokens": len(sub[i]), "first_differing_token": first,
                                         "top2_logprob_margin_alone": top2_margin(a, first),
                                         "margin_change_there": next((d for j, _, d in mc if j == first), None)})
                    m0, m1 = p["m0"], p["m1"]
                    row = {
                        "variant": variant, "requests": n_req, "slots": slots,
                        "n_ctx_slot": props["default_generation_settings"]["n_ctx"],
                        "prompt_tokens": [min(len(x) for x in sub), max(len(x) for x in sub)],
                        "prompt_tokens_total": sum(len(x) for x in sub), "n_predict": args.n_predict,
                        "mismatches": mism, "incomplete": incomplete, "errors": errors,
                        "error_lines": srv.error_lines(), "alone_recheck_differs": recheck,
                        "wall_s": round(p["wall"], 2),
                        "throughput_gen_tok_s": round(n_gen / p["wall"], 3),
                        "throughput_all_tok_s": round((n_gen + sum(len(x) for x in sub)) / p["wall"], 1),
                        "latency_p50_s": pct(lat, 50), "latency_p95_s": pct(lat, 95),
                        "sparq_calls": int(m1.get("sparq_calls_total", 0) - m0.get("sparq_calls_total", 0)),
                        "sparq_dense_calls": {re.sub(r'.*reason="(\w+)".*', r"\1", k): int(m1[k] - m0.get(k, 0))
                                              for k in m1 if k.startswith("sparq_dense_calls_total") and m1[k] - m0.get(k, 0)},
                        "sparq_compression": m1.get("sparq_compression"),
                        "busy_slots_per_decode": m1.get("n_busy_slots_per_decode"),
                        "alone_s": round(alone_s, 2),
                        "sparq_settings": props.get("sparq"),
                        # how far the schedule moved the logits: per generated token (common prefix),
                        # the change of the alone run's top-2 log-probability margin
                        "margin_change": {"tokens": len(moves), "p50": pct(moves, 50, 4), "p95": pct(moves, 95, 4),
                                          "p99": pct(moves, 99, 4), "max": round(max(moves), 4) if moves else None,
                                          # the three largest: request, generated token, margin alone, change
                                          "largest": [{"request": i, "token": j, "margin_alone": m, "change": d}
                                                      for d, i, j, m in sorted(worst, reverse=True)[:3]]},
                    }
                    rows.append(row)
                    if on_row:
                        on_row({"rows": rows, "alone": alone_margins}, servers)
                    print(f"{variant} {n_req}x{slots}: mismatches {len(mism)}, errors {len(errors)}, incomplete "
                          f"{len(incomplete)}, {row['throughput_gen_tok_s']} gen tok/s, p95 {row['latency_p95_s']} s",
                          flush=True)
    return {"rows": rows, "alone": alone_margins}, servers


# SparQ no worse than dense on upstream's own schedule dependence: its logits may move under load
# by at most this factor (plus a rounding floor) times dense's, at the 95th percentile
MOVE_TOLERANCE, MOVE_FLOOR = 1.25, 0.01


def judge_sweep(res: dict) -> list[str]:
    """The sweep's failures ([] = PASS). Every row: no error, no incomplete response, no error line,
    the alone reference reproducible on every server. SparQ rows: SparQ calls, and either no
    mismatch or, where a dense row of the same requests and slots was run, each mismatch at a
    margin (alone) below the largest change dense's own logits showed in that load (upstream's
    rounding, which SparQ's answers inherit), with SparQ's logits moved no more than dense's
    (95th percentile of the margin change, within MOVE_TOLERANCE)."""
    rows, bad = res["rows"], []
    dense = {(r["requests"], r["slots"]): r for r in rows if r["variant"] == "dense"}
    for r in rows:
        name = f"{r['variant']} {r['requests']}x{r['slots']}"
        for key in ("errors", "incomplete", "error_lines", "alone_recheck_differs"):
            if r[key]:
                bad.append(f"{name}: {key} {r[key]}")
        if r["variant"] != "sparq":
            continue
        if r["sparq_calls"] <= 0:
            bad.append(f"{name}: no SparQ call")
        d = dense.get((r["requests"], r["slots"]))
        if r["mismatches"] and d is None:
            bad.append(f"{name}: {len(r['mismatches'])} mismatches and no dense row to compare with")
            continue
        if d is None:
            continue
        d_max, d_p95, s_p95 = d["margin_change"]["max"], d["margin_change"]["p95"], r["margin_change"]["p95"]
        for m in r["mismatches"]:
            margin = m["top2_logprob_margin_alone"]
            if margin is None or d_max is None or margin >= d_max:
                bad.append(f"{name}: request {m['request']} differs at a margin {margin} that dense's own change "
                           f"under this load (largest {d_max}) does not reach")
        if s_p95 is not None and d_p95 is not None and s_p95 > MOVE_TOLERANCE * d_p95 + MOVE_FLOOR:
            bad.append(f"{name}: logits moved more than dense's (margin change p95 {s_p95} against {d_p95})")
    return bad


def write_sweep(args, res, servers, meta, partial=False) -> bool:

    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{args.tag}.json", {"meta": {**meta, "servers": servers, "partial": partial}, "result": res},
               newline=True)
    rows = res["rows"]
    bad = judge_sweep(res)
    ok = not bad
    md = [
        f"# llama-server under load, SparQ and dense ({args.tag}{', partial: the run goes on' if partial else ''})",
        "",
        f"- command: `{meta['command']}`",
        f"- servers: one per variant and slot count, `-c` = slots x {args.ctx_per_slot} (one KV stream per slot); "
        f"the first: `{servers[0] if servers else ''}`",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['cpu_count']} CPUs, {args.threads} threads, load "
        f"average {meta['machine']['loadavg_1min_start']} at the start",
        f"- commit: `{meta['commit']}`, {meta['date']}",
        f"- model: `{Path(str(meta['model'])).name}`; SparQ: `{args.server_args}` "
        f"({json.dumps({k: rows[0]['sparq_settings'][k] for k in ('r', 'k', 'l', 'min_kv', 'n_layers')} if rows and rows[0].get('sparq_settings') else {})}; "
        "r = 0: head size / 4, k = 0: the calibrated k)",
        f"- requests: greedy `/completion` (temperature 0, top-k 1), n_predict {args.n_predict}, cache_prompt false, "
        f"prompts {args.min_tokens}-{args.max_tokens} tokens, all sent at once",
        "",
        "| variant | requests | slots | prompt tokens | mismatches | errors | wall s | generated tok/s | all tok/s "
        "| p50 latency s | p95 latency s | margin change p50 / p95 / max | SparQ calls | dense calls | compression "
        "| busy slots per decode |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = len(r["errors"]) + len(r["incomplete"]) + len(r["error_lines"])
        dense = ", ".join(f"{k} {v}" for k, v in r["sparq_dense_calls"].items()) or "-"
        comp = f"{r['sparq_compression']:.4f}" if r["variant"] == "sparq" and r["sparq_compression"] else "-"
        mv = r.get("margin_change") or {}
        md.append(f"| {r['variant']} | {r['requests']} | {r['slots']} | {r['prompt_tokens'][0]}-{r['prompt_tokens'][1]} "
                  f"| {len(r['mismatches'])} | {err} | {r['wall_s']} | {r['throughput_gen_tok_s']} "
                  f"| {r['throughput_all_tok_s']} | {r['latency_p50_s']} | {r['latency_p95_s']} "
                  f"| {mv.get('p50')} / {mv.get('p95')} / {mv.get('max')} | {r['sparq_calls']} "
                  f"| {dense} | {comp} | {r['busy_slots_per_decode']:.2f} |")
    mm = [(r, m) for r in rows for m in r["mismatches"]]
    alone = res.get("alone", {})
    if mm:
        md += ["", "Mismatches (the first differing token, the top-2 log-probability margin there alone, how much "
               "the load moved it; and the other variant's margin alone at the same token of the same request, "
               "where its tokens agree up to there):", ""]
        for r, m in mm:
            other = "dense" if r["variant"] == "sparq" else "sparq"
            i, j, there = m["request"], m["first_differing_token"], ""
            if other in alone and i < len(alone[other]) and r["variant"] in alone and j is not None:
                a_own, a_oth = alone[r["variant"]][i], alone[other][i]
                if a_oth["tokens"][:j + 1] == a_own["tokens"][:j + 1] and j < len(a_oth["top2_margins"]):
                    there = f"; {other} alone: margin {a_oth['top2_margins'][j]} at the same token"
                else:
                    there = f"; {other} alone: other tokens by then"
            md.append(f"- {r['variant']} {r['requests']}x{r['slots']}: request {i} ({m['prompt_tokens']} prompt "
                      f"tokens), token {j}, margin {m['top2_logprob_margin_alone']}, moved by "
                      f"{m.get('margin_change_there')}{there}")
    small = []
    for v, reqs in alone.items():
        ms = [x for q in reqs for x in q["top2_margins"] if x is not None]
        if ms:
            small.append(f"{v}: {sum(x < 0.5 for x in ms)} of {len(ms)} generated tokens alone have a top-2 margin "
                         f"under 0.5 (smallest {min(ms)})")
    if small:
        md += ["", "Near ties in the alone runs (where any schedule's rounding can flip a greedy token): "
               + "; ".join(small) + "."]
    md += [
        "",
        "A mismatch is a concurrent response whose tokens differ from the same request run alone (every request "
        "was run alone once per variant, on the server with the fewest slots; a few again on each other server: "
        "those must give the same tokens). Errors: HTTP errors, incomplete responses and error lines in the server "
        "log. Throughput: generated tokens (all tokens: with the prompts) per second of the concurrent pass; "
        "latency: each request's time from sending to its full answer (queueing included). Margin change: per "
        "generated token of the common prefix, how far the load moved log p(top 1) - log p(top 2) of the alone "
        "run (upstream's matrix products round differently for a one-row and a many-row ubatch, dense included).",
        "",
        "Verdict (no errors anywhere; SparQ: no mismatch, or only at a margin below the largest change dense's own "
        f"logits showed in the same load, with SparQ's margin change p95 within {MOVE_TOLERANCE}x dense's): "
        + ("PASS" if ok else "FAIL: " + "; ".join(bad)),
    ]
    write_md(out, args.tag, md, echo=not partial)  # a partial file each row: the row's line is printed
    return ok


def load_main(argv=None) -> int:
    from llama_sparq.models import resolve_model

    ap = argparse.ArgumentParser(description=LOAD_DOC.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF, gemma3 or smollm2 (default: Gemma 3 270M)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=0, help="server slots, -np (0 = the server's default, auto: 4)")
    ap.add_argument("--min-tokens", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=6144)
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=32768, help="KV cells in all (each slot gets ctx / slots)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-args", default="--sparq", help="SparQ flags and anything else for llama-server")
    ap.add_argument("--request-timeout", type=float, default=1800)
    ap.add_argument("--tag", default="server_load")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--sweep", default=None, metavar="NxS,...",
                    help="the load table: request counts x slot counts (e.g. 16x4,16x8,64x4,64x8), each variant")
    ap.add_argument("--variants", default="sparq,dense", help="with --sweep: sparq (--server-args) and/or dense")
    ap.add_argument("--ctx-per-slot", type=int, default=8192, help="with --sweep: KV cells per slot (default 8192)")
    args = ap.parse_args(argv)

    model = resolve_model(args.model)
    if args.sweep:
        load0 = loadavg()
        meta = {"command": command_line(), "commit": git_commit(), "date": now_iso(), "model": str(model),
                "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": args.threads,
                            "loadavg_1min_start": load0}}
        # the files after every row (marked partial), so a run stopped by a timeout keeps what it measured
        res, servers = sweep(args, model, on_row=lambda r, s: write_sweep(args, r, s, meta, partial=True))
        meta["machine"]["loadavg_1min_end"] = loadavg()
        return 0 if write_sweep(args, res, servers, meta) else 1
    srv_args = ["-c", args.ctx, *shlex.split(args.server_args)]
    if args.parallel:
        srv_args += ["-np", args.parallel]
    load0 = loadavg()
    with Server(model, srv_args, threads=args.threads) as srv:
        props = srv.get("/props")
        prompts = build_prompts(srv, args.requests, args.min_tokens, args.max_tokens, args.seed)
        res = run_load(srv, prompts, args.n_predict, args.request_timeout)
        errors = srv.error_lines()
        cmd = srv.cmd
    res.update({
        "slots": props["total_slots"],
        "n_ctx_slot": props["default_generation_settings"]["n_ctx"],
        "sparq_settings": {k: props["sparq"][k] for k in ("enabled", "r", "k", "l", "min_kv", "n_layers")},
        "error_lines": errors,
    })
    meta = {
        "command": command_line(),
        "server_command": " ".join(shlex.quote(str(a)) for a in cmd),
        "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": args.threads,
                    "loadavg_1min_start": load0, "loadavg_1min_end": loadavg()},
        "commit": git_commit(),
        "date": now_iso(),
        "model": str(model),
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{args.tag}.json", {"meta": meta, "result": res}, newline=True)
    ok = res["sparq_calls_concurrent"] > 0 and not res["mismatches"] and not res["incomplete"] and not errors
    md = [
        f"# llama-server under load with SparQ ({args.tag})",
        "",
        f"- command: `{meta['command']}`",
        f"- server: `{meta['server_command']}`",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['cpu_count']} CPUs, {args.threads} threads, "
        f"load average {load0} at the start",
        f"- commit: `{meta['commit']}`, {meta['date']}",
        f"- model: `{Path(str(model)).name}`; SparQ {res['sparq_settings']}",
        "",
        "| requests | slots | n_ctx per slot | prompt tokens | n_predict | concurrent s | alone s | SparQ calls (concurrent) "
        "| SparQ calls (alone) | dense calls (concurrent) | compression | busy slots per decode | incomplete | mismatches "
        "| error lines |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {res['requests']} | {res['slots']} | {res['n_ctx_slot']} | {min(res['prompt_tokens'])}-{max(res['prompt_tokens'])} "
        f"| {res['n_predict']} | {res['concurrent_seconds']} | {res['alone_seconds']} | {res['sparq_calls_concurrent']} "
        f"| {res['sparq_calls_alone']} | {', '.join(f'{k} {v}' for k, v in res['sparq_dense_concurrent'].items() if v)} "
        f"| {res['sparq_compression']:.4f} | {res['busy_slots_per_decode']:.2f} | {len(res['incomplete'])} "
        f"| {len(res['mismatches'])} | {len(errors)} |",
        "",
        "Concurrent: all requests sent at once (the slots decode together, the rest queue); alone: the same "
        "requests one at a time on the same server. A mismatch is a concurrent response whose tokens differ from "
        "the same request's alone. Greedy (temperature 0, top-k 1), cache_prompt false.",
        "",
        f"Verdict: {'PASS' if ok else 'FAIL'}",
    ]
    write_md(out, args.tag, md)
    return 0 if ok else 1

# ============================================================================================= soak

INVARIANCE_DOC = """Does a sequence's greedy output depend on what else shares its ubatches?

llama-server decodes several slots together and processes a new slot's prompt beside the
other slots' decode rows. This replays that schedule on the low-level API (4 sequences in
their own KV streams; each step: the generating sequences' decode rows plus one 512-token
chunk of the next prompt) and the same sequences one at a time, for dense attention and for
SparQ variants, and compares, per sequence, the greedy tokens and the top-2 logit margins.

Upstream's computation is not batch-invariant (the matrix products of 1-row and many-row
ubatches round differently), so even dense logits move between the two schedules; what
matters is whether a variant turns that into different tokens.

    python bench/server_load.py invariance --tag batch_invariance_gemma3

Writes bench/results/<tag>.{json,md} with the command, machine, commit, settings and the
SparQ counters of every run.
"""


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


def invariance_main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=INVARIANCE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    # the fork's library loads here: the tests import the server helpers above without it
    global Llama, _sparq, llama_cpp
    from llama_sparq import Llama, _sparq
    from llama_sparq._llama import llama_cpp  # after the package pointed llama_cpp at the fork
    from llama_sparq.models import resolve_model

    model_path = str(resolve_model(a.model))
    llm = Llama(model_path, n_ctx=512, verbose=False)  # loads the model (and the fork's library)
    prompts = make_prompts(llm, a.sequences, a.min_tokens, a.step_tokens)
    runner = Runner(llm._model.model, prompts, a.n_predict, a.threads, a.chunk)
    meta = {
        "command": command_line(),
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


# ============================================================================================= the subcommands

from soaklib import soak_main  # noqa: E402

SUBCOMMANDS = {"load": load_main, "soak": soak_main, "invariance": invariance_main}


def main(argv=None) -> int:
    return dispatch(__doc__, SUBCOMMANDS, argv, default="load")


if __name__ == "__main__":
    sys.exit(main())
