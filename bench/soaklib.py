"""The soak subcommand of bench/server_load.py (`server_load.py soak`): a long mixed run against a
SparQ and a dense server. A module of the load driver, not a driver of its own."""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import http.client
import json
import math
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, command_line, cpu_model, cpu_topology, git_commit, loadavg, now_iso,  # noqa: E402
                      pct, write_json, write_md)
from serverlib import PyServer, Server, read_rss  # noqa: E402

SOAK_DOC = """A long day of traffic: hundreds of mixed requests against one server with SparQ and the
same requests against one without (dense), with errors, resident memory, latency and SparQ's
counters recorded.

Two servers of one kind run side by side on 127.0.0.1: ``--server llama`` (``llama-sparq-server``,
``-np --slots`` slots of ``--ctx-per-slot`` cells each, ``--sparq`` or not) or ``--server python``
(``python -m llama_sparq.server``, ``--n_ctx --ctx-per-slot``). The request mix is drawn with
``--seed`` once and sent to both, in blocks of ``--block`` requests alternating between the two
(the SparQ block, then the same requests on dense, then the next block), so a change in the
machine's load falls on both alike; the idle server waits. ``--concurrency`` clients each send
their requests one after another, in sessions of ``--turns`` requests: a document of real text
(the Python documentation CPython ships, as ``real_text.py`` uses; a seeded offset), each turn's
prompt its first 1K-7.5K tokens (log-uniform in ``--min-tokens``..``--max-tokens``,
the longest first within the session; the server's tokenizer counts them) and a question, as
``/v1/completions`` or, a ``--chat-share`` of the sessions, ``/v1/chat/completions``. The servers'
prompt caches hold the document (llama-server: the client's slot; the Python server: its one
context), so after a session's first turn only the question is new; fresh prompts of these
lengths every time would be hours of prefill on a few cores. Streamed with ``--stream-share``, and a ``--cancel-share`` of the streamed ones closes its connection after the
first 1-4 events (a client that went away: not an error); ``max_tokens`` 8..``--n-predict``,
sampled (temperature 0.8, the request's own seed). ``--concurrency`` clients send (llama-server:
one per slot; the Python server decodes one request at a time and, by llama-cpp-python's
``interrupt_requests``, ends a stream early when another request waits: concurrency 1 there).

Recorded per variant: errors (HTTP errors, dropped or unfinished responses, a stream without its
``[DONE]``, a dead server, error lines in its log; must be 0), the server process's resident
memory (VmRSS) after every request and every second, latency p50/p99 end to end of the requests
that ran to the end and time to first token of the streamed ones, SparQ's counters (calls,
dense calls, compression). The memory verdict: RSS after the last request at most
``--rss-bound`` (5 %) above RSS after request ``--rss-from`` (100; the warm-up before it: the
slots' buffers, the model's pages).

    python bench/server_load.py soak --model smollm2 --server llama --tag soak_llama_smollm2
    python bench/server_load.py soak --model smollm2 --server python --tag soak_python_smollm2

Writes bench/results/<tag>.{json,md} with the command, servers, machine (CPU, cores, threads, load
and the busy processes beside the run), commit, the mix, and per variant the figures above.
"""


QUESTIONS = ("What is the text above about?", "Summarize the text above in one sentence.",
             "Which Python feature does the text above describe?", "Name one term the text above defines.",
             "What would a reader learn from the text above?")


def soak_text_prompt(count, chunk: str, target: int) -> tuple[str, int]:
    """A prefix of chunk of about target tokens (count: the server's tokenizer): the text and its
    token count (never above target)."""
    text, n = chunk, count(chunk)
    for _ in range(6):  # bounded: each cut by the ratio lands within a few tokens
        if n <= target and (n >= 0.97 * target or len(text) == len(chunk)):
            break
        text = text[:int(len(text) * min(target / n, 1.0) * (0.995 if n > target else 1.0))]
        n = count(text)
    return text, n


def soak_requests(server, args, python: bool, clients: int) -> list[dict]:
    """The request mix, drawn with args.seed. Request i belongs to client i % clients; a client's
    requests come in sessions of args.turns: one document (real text from a random offset), one
    endpoint (completions or chat), and per turn a prefix of the document (the session's lengths,
    log-uniform in min..max tokens, the longest first) and a question of its own. Each turn's
    document part is a prefix of the last one's, so the server's prompt cache holds it and only
    the question is new (fresh prompts of up to 7.5K tokens, 500 of them, twice, are hours of
    prefill on a few cores); the longest turn first fills the slot's cache to the session's
    largest at once, so the memory's warm-up ends with each client's first turns."""
    from real_text import python_docs

    def count(text):
        if python:
            return len(server.post("/extras/tokenize", {"input": text}, timeout=120)["tokens"])
        return len(server.post("/tokenize", {"content": text, "add_special": False}, timeout=120)["tokens"])

    docs = python_docs()
    rng = random.Random(args.seed)
    lo, hi = math.log(args.min_tokens), math.log(args.max_tokens)
    per_client = [list(range(c, args.requests, clients)) for c in range(clients)]
    out = {}
    for c, mine in enumerate(per_client):
        for s0 in range(0, len(mine), args.turns):
            ids = mine[s0:s0 + args.turns]
            n_chars = min(len(docs) - 1, args.max_tokens * 6)
            off = rng.randrange(0, len(docs) - n_chars)
            chunk = docs[off:off + n_chars]
            chat = rng.random() < args.chat_share
            targets = sorted((int(round(math.exp(rng.uniform(lo, hi)))) for _ in ids), reverse=True)
            session = f"{c}.{s0 // args.turns}"
            for i, target in zip(ids, targets):
                text, n = soak_text_prompt(count, chunk, target)
                stream = rng.random() < args.stream_share
                out[i] = {"i": i, "client": c, "session": session, "prompt_tokens": n,
                          "text": f"{text}\n\nQuestion {i}: {rng.choice(QUESTIONS)}", "chat": chat, "stream": stream,
                          "cancel_after": rng.randint(1, 4) if stream and rng.random() < args.cancel_share else None,
                          "max_tokens": rng.randint(min(8, args.n_predict), args.n_predict),
                          "seed": rng.randrange(1 << 30)}
    return [out[i] for i in range(args.requests)]


def soak_one(port: int, req: dict, timeout: float) -> dict:
    """One request of the mix over its own connection: {"ok"|"cancelled"|"error", seconds, ttft, tokens}."""
    if req["chat"]:
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": req["text"]}]}
    else:
        path, body = "/v1/completions", {"prompt": req["text"]}
    body.update({"max_tokens": req["max_tokens"], "temperature": 0.8, "top_p": 0.95, "seed": req["seed"],
                 "stream": req["stream"]})
    t0 = time.monotonic()
    res = {"i": req["i"], "stream": req["stream"], "chat": req["chat"]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return {**res, "status": "error", "error": f"HTTP {r.status}: {r.read()[:300]!r}"}
        if not req["stream"]:
            doc = json.loads(r.read())
            ch = doc["choices"][0]
            text = ch["message"]["content"] if req["chat"] else ch["text"]
            if ch.get("finish_reason") not in ("stop", "length") or not isinstance(text, str):
                return {**res, "status": "error", "error": f"unfinished answer: {json.dumps(doc)[:300]}"}
            return {**res, "status": "ok", "seconds": time.monotonic() - t0,
                    "tokens": doc.get("usage", {}).get("completion_tokens")}
        events, ttft, finish = 0, None, None
        for raw in r:  # server-sent events, a line at a time
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if finish is None:
                    return {**res, "status": "error", "error": "stream ended with [DONE] but no finish_reason"}
                return {**res, "status": "ok", "seconds": time.monotonic() - t0, "ttft": ttft, "tokens": events}
            ch = json.loads(data)["choices"]
            if not ch:
                continue  # a usage-only event
            ch = ch[0]
            piece = (ch.get("delta") or {}).get("content") if req["chat"] else ch.get("text")
            if piece:
                events += 1
                if ttft is None:
                    ttft = time.monotonic() - t0
            finish = ch.get("finish_reason") or finish
            if req["cancel_after"] and events >= req["cancel_after"]:
                # the client goes away mid-stream: the connection closed under the server's feet
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
                return {**res, "status": "cancelled", "seconds": time.monotonic() - t0, "ttft": ttft}
        return {**res, "status": "error", "error": "stream closed before [DONE]"}
    except Exception as e:  # a dropped connection, a timeout, a malformed answer: counted, not raised
        return {**res, "status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        conn.close()


class RssSampler:
    """The server process's VmRSS every interval seconds on a thread (for the peak and the curve),
    and once after each request (note)."""

    def __init__(self, pid: int, interval: float = 1.0):
        import threading

        self.pid, self.interval, self.samples, self.after = pid, interval, [], []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.interval):
            rss = read_rss(self.pid)
            if rss is None:
                return
            self.samples.append((round(time.monotonic() - self._t0, 1), rss))

    def note(self):
        """RSS after a request: self.after[n - 1] is after the server's n-th finished request."""
        self.after.append(read_rss(self.pid))

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)


def sparq_counters(server, python: bool) -> dict:
    """SparQ calls, dense calls by reason and compression: /metrics (llama-server) or /sparq/stats."""
    if python:
        st = server.get("/sparq/stats")["data"][0].get("stats") or {}
        return {"calls": int(st.get("n_sparq", 0)), "dense": st.get("n_dense", {}),
                "compression": st.get("compression")}
    m = server.metrics()
    return {"calls": int(m.get("sparq_calls_total", 0)), "prompt_tokens_processed": int(m.get("prompt_tokens_total", 0)),
            "dense": {re.sub(r'.*reason="(\w+)".*', r"\1", k): int(v) for k, v in m.items()
                      if k.startswith("sparq_dense_calls_total") and v},
            "compression": m.get("sparq_compression")}


def busy_processes() -> list[str]:
    """Other heavy work on the machine (builds, test runs), as pgrep lists it: the load beside a run."""
    try:
        out = subprocess.run(["pgrep", "-af", "ninja|cc1plus|pytest|llama-server|llama_sparq.server"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    me = str(os.getpid())
    return [ln[:160] for ln in out.splitlines() if ln.split(" ", 1)[0] != me]


def soak_judge(v: dict, rss_from: int, rss_bound: float) -> list[str]:
    """A variant's failures ([] = PASS): errors, SparQ not run, memory grown past the bound."""
    bad = []
    if v["errors"]:
        bad.append(f"{v['variant']}: {len(v['errors'])} errors, the first: {v['errors'][0]}")
    if v["error_lines"]:
        bad.append(f"{v['variant']}: {len(v['error_lines'])} error lines in the log, the first: {v['error_lines'][0]}")
    if v["variant"] == "sparq" and not v["sparq"]["calls"] > 0:
        bad.append("sparq: no SparQ call")
    if v["variant"] == "dense" and v["sparq"]["calls"]:
        bad.append(f"dense: {v['sparq']['calls']} SparQ calls")
    g = v["rss"]["growth"]
    if g is None:
        bad.append(f"{v['variant']}: no RSS at request {rss_from} and the end")
    elif g > rss_bound:
        bad.append(f"{v['variant']}: RSS grew {100 * g:.1f} % from request {rss_from} to the end "
                   f"(bound {100 * rss_bound:.0f} %)")
    return bad


def soak_main(argv=None) -> int:
    from llama_sparq.models import resolve_model

    ap = argparse.ArgumentParser(description=SOAK_DOC.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="GGUF, gemma3 or smollm2 (default smollm2)")
    ap.add_argument("--server", choices=("llama", "python"), default="llama")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--variants", default="sparq,dense")
    ap.add_argument("--block", type=int, default=25, help="requests per block, alternating between the variants")
    ap.add_argument("--turns", type=int, default=40, help="a client's requests per session (one document)")
    ap.add_argument("--slots", type=int, default=4, help="llama-server's -np")
    ap.add_argument("--ctx-per-slot", type=int, default=8192, help="KV cells per slot (the Python server's n_ctx)")
    ap.add_argument("--concurrency", type=int, default=0, help="clients at once (0: the slots; 1 for --server python)")
    ap.add_argument("--min-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=7680, help="prompt tokens at most (SmolLM2: an 8K context)")
    ap.add_argument("--n-predict", type=int, default=32, help="max_tokens at most")
    ap.add_argument("--stream-share", type=float, default=0.5)
    ap.add_argument("--cancel-share", type=float, default=0.2, help="of the streamed requests")
    ap.add_argument("--chat-share", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sparq-args", default="--sparq", help="the SparQ server's flags")
    ap.add_argument("--server-args", default="", help="flags for both servers (e.g. --cache-ram 0)")
    ap.add_argument("--rss-from", type=int, default=100, help="the memory verdict's first request (after warm-up)")
    ap.add_argument("--rss-bound", type=float, default=0.05, help="most RSS growth from --rss-from to the end")
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--max-seconds", type=float, default=6 * 3600, help="stop sending after this long (a partial run)")
    ap.add_argument("--tag", default="soak")
    ap.add_argument("--out-dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    python = args.server == "python"
    # a SIGTERM (timeout, kill) unwinds like an exception, so the servers are stopped too; the
    # clients send nothing more, the requests in flight end with the servers
    stopping = threading.Event()

    def on_term(*_):
        stopping.set()
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    conc = args.concurrency or (1 if python else args.slots)
    variants = [v.strip() for v in args.variants.split(",")]
    model = resolve_model(args.model)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix=f"soak-{args.tag}-"))

    def make(variant):
        flags = shlex.split(args.server_args) + (shlex.split(args.sparq_args) if variant == "sparq" else [])
        if python:
            env = dict(os.environ)
            env.pop("CONFIG_FILE", None)
            return PyServer(model, ["--n_ctx", args.ctx_per_slot, "--flash_attn", "true", *flags], args.threads,
                            log_path=logs / f"{variant}.log", env=env)
        return Server(model, ["-c", args.slots * args.ctx_per_slot, "-np", args.slots, *flags], args.threads,
                      log_path=logs / f"{variant}.log")

    meta = {"command": command_line(), "commit": git_commit(), "date": now_iso(), "model": str(model),
            "server": "llama-sparq-server" if python is False else "python -m llama_sparq.server",
            "machine": {"cpu": cpu_model(), **cpu_topology(), "threads": args.threads,
                        "loadavg_1min_start": round(loadavg() or 0, 2), "busy_start": busy_processes()},
            "mix": {k: getattr(args, k) for k in ("requests", "block", "slots", "ctx_per_slot", "min_tokens",
                                                   "max_tokens", "n_predict", "stream_share", "cancel_share",
                                                   "chat_share", "turns", "seed", "rss_from", "rss_bound")},
            "concurrency": conc, "logs": str(logs)}
    state = {v: {"variant": v, "results": [], "rss": None} for v in variants}
    t_start = time.monotonic()
    with contextlib.ExitStack() as stack:
        srv = {v: stack.enter_context(make(v)) for v in variants}
        meta["servers"] = {v: " ".join(shlex.quote(str(a)) for a in s.cmd) for v, s in srv.items()}
        t0 = time.monotonic()
        reqs = soak_requests(srv[variants[0]], args, python, conc)
        meta["prompt_build_s"] = round(time.monotonic() - t0, 1)
        for v in variants:
            state[v]["sparq0"] = sparq_counters(srv[v], python)
            state[v]["sampler"] = RssSampler(srv[v].proc.pid)
            state[v]["rss_start"] = read_rss(srv[v].proc.pid)
        n_blocks = math.ceil(len(reqs) / args.block)
        for b in range(n_blocks):
            block = reqs[b * args.block:(b + 1) * args.block]
            if time.monotonic() - t_start > args.max_seconds:
                meta["stopped_early"] = f"after {b * args.block} requests: --max-seconds {args.max_seconds}"
                break
            for v in (variants if b % 2 == 0 else variants[::-1]):  # who goes first alternates
                s, st = srv[v], state[v]
                if s.proc.poll() is not None:
                    st["results"] += [{"i": r["i"], "status": "error", "error": s.death()[:2000]} for r in block]
                    continue
                def client(mine, s=s, st=st):  # a client's requests one after another, as a user waits
                    for r in mine:
                        if stopping.is_set():
                            return
                        st["results"].append(soak_one(s.port, r, args.request_timeout))
                        st["sampler"].note()  # list appends: atomic under the GIL

                with cf.ThreadPoolExecutor(max_workers=conc) as ex:
                    futs = [ex.submit(client, [r for r in block if r["client"] == c]) for c in range(conc)]
                    for f in futs:
                        f.result()
                if s.proc.poll() is not None:  # died in the block: its answers show errors, the log says how
                    st["death"] = s.death()
            done = min(len(reqs), (b + 1) * args.block)
            print(f"{done}/{len(reqs)} requests, {time.monotonic() - t_start:.0f} s: " + "; ".join(
                f"{v} errors {sum(r['status'] == 'error' for r in state[v]['results'])} RSS "
                f"{(state[v]['sampler'].after[-1] or 0) / 2**20:.0f} MiB" for v in variants), flush=True)
        meta["wall_s"] = round(time.monotonic() - t_start, 1)
        for v in variants:
            st = state[v]
            st["sampler"].stop()
            alive = srv[v].proc.poll() is None
            st["sparq1"] = sparq_counters(srv[v], python) if alive else st["sparq0"]
            st["error_lines"] = srv[v].error_lines()
            st["alive_at_end"] = alive
    meta["machine"]["loadavg_1min_end"] = round(loadavg() or 0, 2)
    meta["machine"]["busy_end"] = busy_processes()

    rows = []
    for v in variants:
        st = state[v]
        res = sorted(st["results"], key=lambda r: r["i"])
        ok = [r for r in res if r["status"] == "ok"]
        after = st["sampler"].after
        at_from = after[args.rss_from - 1] if len(after) >= args.rss_from else None
        end = after[-1] if after else None
        s0, s1 = st["sparq0"], st["sparq1"]
        row = {
            "variant": v, "requests": len(res), "ok": len(ok),
            "cancelled": sum(r["status"] == "cancelled" for r in res),
            "streamed": sum(r["stream"] for r in res if "stream" in r),
            "errors": [{"i": r["i"], "error": r["error"]} for r in res if r["status"] == "error"],
            "error_lines": st["error_lines"][:20], "alive_at_end": st["alive_at_end"], "death": st.get("death"),
            "latency_s": {"p50": pct([r["seconds"] for r in ok], 50, 3), "p99": pct([r["seconds"] for r in ok], 99, 3),
                          "mean": round(float(np.mean([r["seconds"] for r in ok])), 3) if ok else None},
            "ttft_s": {"p50": pct([r["ttft"] for r in ok if r.get("ttft") is not None], 50, 3),
                       "p99": pct([r["ttft"] for r in ok if r.get("ttft") is not None], 99, 3)},
            "rss": {"start": st["rss_start"], "at_from": at_from, "end": end,
                    "max": max([x for _, x in st["sampler"].samples] + [x for x in after if x] or [0]),
                    "growth": round((end - at_from) / at_from, 4) if at_from and end else None,
                    "after_each_request_mib": [round(x / 2**20, 1) if x else None for x in after],
                    "every_second": st["sampler"].samples},
            "prompt_tokens_processed": (s1["prompt_tokens_processed"] - s0["prompt_tokens_processed"]
                                        if "prompt_tokens_processed" in s1 else None),
            "prompt_tokens_sent": sum(q["prompt_tokens"] for q in reqs),
            "sparq": {"calls": s1["calls"] - s0["calls"], "compression": s1["compression"],
                      "dense": {k: int(n - s0["dense"].get(k, 0)) for k, n in s1["dense"].items()
                                if n - s0["dense"].get(k, 0)}},
            "latencies": [{k: r.get(k) for k in ("i", "status", "stream", "chat", "seconds", "ttft", "tokens")}
                          for r in res],
        }
        row["verdict"] = soak_judge(row, args.rss_from, args.rss_bound)
        rows.append(row)
    ok_all = all(not r["verdict"] for r in rows) and not meta.get("stopped_early")
    write_json(out / f"{args.tag}.json", {"meta": meta, "requests": [{k: r[k] for k in r if k != "text"}
                                                                     for r in reqs], "rows": rows}, newline=True)
    write_md(out, args.tag, soak_md(args, meta, reqs, rows, ok_all))
    return 0 if ok_all else 1


def soak_md(args, meta, reqs, rows, ok_all) -> list[str]:
    mib = lambda x: "-" if x is None else f"{x / 2**20:.0f}"  # noqa: E731
    pt = [r["prompt_tokens"] for r in reqs]
    m = meta["machine"]
    md = [
        f"# A long day of traffic: {meta['server']}, SparQ and dense ({args.tag})",
        "",
        f"- command: `{meta['command']}`",
        *[f"- server ({v}): `{c}`" for v, c in meta["servers"].items()],
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['logical_cpus']} hardware threads, {m['threads']} threads "
        f"used; load average {m['loadavg_1min_start']} at the start, {m['loadavg_1min_end']} at the end",
        f"- beside the run: {len(m['busy_start'])} busy processes at the start, {len(m['busy_end'])} at the end "
        "(builds, test runs, other servers: `pgrep -af 'ninja|cc1plus|pytest|llama-server|llama_sparq.server'`, "
        "in the JSON)",
        f"- commit: `{meta['commit']}`, {meta['date']}; {meta['wall_s']} s",
        f"- model: `{Path(meta['model']).name}`",
        f"- mix: {len(reqs)} requests of {min(pt)}-{max(pt)} prompt tokens (median {int(np.median(pt))}, real text), "
        f"{sum(r['stream'] for r in reqs)} streamed ({sum(bool(r['cancel_after']) for r in reqs)} cancelled "
        f"mid-stream), {sum(r['chat'] for r in reqs)} chat; max_tokens up to {args.n_predict}; {meta['concurrency']} "
        f"clients at once, each in sessions of {args.turns} turns (one document, the longest prefix first: "
        f"{len({r['session'] for r in reqs})} sessions); blocks of {args.block} alternating between the variants"
        + (f"; STOPPED EARLY {meta['stopped_early']}" if meta.get("stopped_early") else ""),
        "",
        "| variant | requests | errors | cancelled | prompt tokens sent / processed | RSS start MiB | RSS at request "
        f"{args.rss_from} MiB | RSS end MiB | growth | RSS max MiB | p50 s | p99 s | TTFT p50 s | TTFT p99 s "
        "| SparQ calls | dense calls | compression |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = r["rss"]["growth"]
        md.append(
            f"| {r['variant']} | {r['requests']} | {len(r['errors']) + len(r['error_lines'])} | {r['cancelled']} "
            f"| {r['prompt_tokens_sent']} / {'-' if r['prompt_tokens_processed'] is None else r['prompt_tokens_processed']} "
            f"| {mib(r['rss']['start'])} | {mib(r['rss']['at_from'])} | {mib(r['rss']['end'])} "
            f"| {'-' if g is None else f'{100 * g:+.2f} %'} | {mib(r['rss']['max'])} | {r['latency_s']['p50']} "
            f"| {r['latency_s']['p99']} | {r['ttft_s']['p50']} | {r['ttft_s']['p99']} | {r['sparq']['calls']} "
            f"| {', '.join(f'{k} {v}' for k, v in r['sparq']['dense'].items()) or '-'} "
            f"| {'-' if not r['sparq']['calls'] else round(r['sparq']['compression'], 4)} |")
    bad = [b for r in rows for b in r["verdict"]]
    md += [
        "",
        "Errors: HTTP errors, dropped or unfinished answers, streams without `[DONE]`, a dead server and error lines "
        "in its log (a cancelled request is the client's doing, not an error). RSS: the server process's VmRSS "
        f"after its n-th finished request. Latency: end to end of the requests that ran to the end (queueing "
        "included), time to first token of the streamed ones. Prompt tokens processed: what the server's prefill "
        "ran (`/metrics` prompt_tokens_total; the rest came from its prompt cache). Counters: over the run.",
        "",
        f"Verdict (0 errors, SparQ calls > 0, RSS growth from request {args.rss_from} to the end at most "
        f"{100 * args.rss_bound:.0f} %): " + ("PASS" if ok_all else "FAIL: " + "; ".join(
            bad + ([meta["stopped_early"]] if meta.get("stopped_early") else []))),
    ]
    return md


# ============================================================================================= invariance

