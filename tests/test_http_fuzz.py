"""Hostile HTTP against both servers with SparQ on (llama-server ``--sparq``, ``python -m
llama_sparq.server --sparq``), each on a loopback port with the tiny random model.

A fixed seed draws a bounded list of cases per server: JSON bodies for the generation and
tokenizer endpoints with one field broken (wrong types, huge and negative numbers for
max_tokens, n_probs, logprobs, temperature, top_k, seed, ..., NaN and Infinity, token ids out
of the vocabulary, logit_bias keys out of it), unknown fields, SparQ settings out of range in
the request (neither server takes SparQ settings per request: they are unknown fields, ignored),
invalid UTF-8, malformed and truncated JSON, a body of several MB; and raw socket garbage (bad
request lines, bad Content-Length, bodies cut short on a kept-alive connection, oversized
headers) with socket timeouts.

Every case must get a 4xx or a valid answer (200 with JSON, or an event stream), within its
timeout, and the server must still run; the few 5xx answers that are upstream's own behaviour
are listed in KNOWN_5XX (docs/serving.md, "Known limits") and asserted as they are. At the end a
greedy request gives the text it gave before the fuzz."""

from __future__ import annotations

import http.client
import json
import random
import socket
import time

import pytest

from served import KINDS, LLAMA, PYTHON, start

for _mod in ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"):
    pytest.importorskip(_mod, reason="the server extra (pip install 'llama-sparq[server]') is not installed")

SEED = 4801
N_JSON = 140     # JSON-body cases per server (plus the fixed raw-socket ones)
REQUEST_S = 60   # a case that takes longer is a hang
RAW_S = 1.5      # a raw-socket case: how long to wait for an answer (a cut body may get none)
N_CTX = 512      # the context: a runaway max_tokens ends within it

SPARQ = ["--sparq", "--sparq-k", 8, "--sparq-r", 4, "--sparq-min-kv", 16]



def strict_json(raw: bytes) -> bool:
    """JSON as RFC 8259 has it: UTF-8, no NaN or Infinity, no lone surrogate"""
    def no_constant(c):
        raise ValueError(c)
    try:
        json.loads(raw.decode("utf-8"), parse_constant=no_constant)
        raw.decode("utf-8").encode("utf-8")
        json.dumps(json.loads(raw)).encode("utf-8")
        return "\\ud8" not in raw.decode().lower() and "\\udc" not in raw.decode().lower()
    except ValueError:
        return False


def known_5xx(kind, ep, raw, data):
    """Why a 5xx is upstream llama-server's own answer (docs/serving.md, "Known limits"), or None"""
    if kind != LLAMA:
        return None
    if not strict_json(raw) and b"json.exception.parse_error" in data:
        return "llama-server: a body that is not JSON is a 500"
    if ep == "/detokenize" and b"_M_range_check" in data:
        return "llama-server: /detokenize of an id outside the vocabulary is a 500"
    return None

HOSTILE_NUMBERS = [-1, -2, 0, 1.5, -2**31, 2**31, 2**32 + 7, 2**63, -2**63 - 1, 2**64, 10**30, -10**30, 1e308, -1e308,
                   1e-320, "NaN", "Infinity", "-Infinity", "5", "", None, True, [], {}, [1, 2]]
NUMERIC = ["max_tokens", "n_predict", "n_probs", "logprobs", "top_logprobs", "temperature", "top_k", "top_p", "min_p",
           "typical_p", "seed", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
           "mirostat_mode", "mirostat", "mirostat_tau", "mirostat_eta", "n", "best_of", "min_tokens", "n_keep",
           "n_indent", "n_discard", "dry_multiplier", "dry_base", "xtc_probability", "xtc_threshold", "t_max_predict_ms",
           "id_slot", "n_cmpl"]
SPARQ_FIELDS = {"sparq": [2, "x", -1], "sparq_r": [-3, 0, 10**9], "sparq_k": [-2, 2**40], "sparq_l": [-7],
                "sparq_min_kv": [-5, 10**12], "sparq_coverage": [0, 1.5, -1, "NaN"], "sparq_k_min": [-1],
                "sparq_k_frac": [2.0, -0.5], "sparq_selector": ["nope", 7], "sparq_gqa": ["x"], "sparq_basis": [3],
                "sparq_index_lists": [-1, 10**9], "sparq_index_probe": [0, -4], "sparq_all_rows": ["maybe"],
                "sparq_mean_v": [{}]}
BAD_TOKENS = [[-1], [2**31 - 1], [2**31], [10**20], [1, -5, 3], ["a"], [None], [1.5], 7, "abc", [[1]], {"a": 1}]
STRUCT = {
    "prompt": [5, None, [], [[]], [[1, 2]], {"a": 1}, [-1, 3], [10**9], [1, 2**40], ["a", "b"], ["a", 1], True,
               "\u0000\u0001", "x" * 20000],
    "messages": ["x", [], [{}], [{"role": "bogus", "content": "hi"}], [{"role": "user", "content": 5}],
                 [{"role": "user"}], [{"role": "user", "content": [{"type": "text"}]}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}],
                 [{"role": "tool", "content": "x"}], [None], {"role": "user"}],
    "stop": [5, [None], [""], ["x"] * 1000, [{}], "", [5]],
    "logit_bias": [{"-1": 1}, {"999999": 5}, {"abc": 1}, [], {"1": "x"}, {"1": 1e308}, [[1, 2]], {"2": None}],
    "stream": ["yes", 2, None, {}],
    "stream_options": ["x", {"include_usage": "x"}],
    "response_format": ["json", {"type": "nope"}, {"type": "json_object", "schema": 5},
                        {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}],
    "grammar": ["root ::= (", "root ::= x", 5, "root ::= root"],
    "json_schema": [{"type": "bogus"}, 5, {"$ref": "#/nowhere"}],
    "tools": ["x", [{"type": "function"}], [5]],
    "tool_choice": [5, {"type": "function", "function": {"name": 5}}],
    "model": [5, None, [], "no-such-model", "../../etc/passwd"],
    "samplers": [5, ["nope"], "zzz"],
    "suffix": [5, "s"],
    "echo": ["x", 5],
    "cache_prompt": ["x"],
    "lora": [[{"id": 99, "scale": 1}], "x"],
    "input": [5, None, ["a"]],
    "content": [5, None, [[1]], [-1]],
    "tokens": BAD_TOKENS,
    "with_pieces": ["x"],
    "add_special": [5],
}


def _bodies(kind):
    """endpoint -> the valid request it is mutated from (short replies, greedy)"""
    comp = {"model": "m", "prompt": "Hello there, how are you", "max_tokens": 4, "temperature": 0}
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4, "temperature": 0}
    if kind == LLAMA:
        return {"/v1/completions": comp, "/v1/chat/completions": chat,
                "/completion": {"prompt": "Hello there", "n_predict": 4, "temperature": 0},
                "/tokenize": {"content": "Hello there", "add_special": True},
                "/detokenize": {"tokens": [1, 20, 30]}}
    return {"/v1/completions": comp, "/v1/chat/completions": chat, "/extras/tokenize": {"input": "Hello there"},
            "/extras/tokenize/count": {"input": "Hello there"}, "/extras/detokenize": {"tokens": [1, 20, 30]}}


def _dump(body) -> bytes:
    """JSON with NaN and Infinity spelled as JavaScript does (not JSON: a server may refuse them)"""
    return json.dumps(body, allow_nan=True).replace('"NaN"', "NaN").replace('"-Infinity"', "-Infinity") \
        .replace('"Infinity"', "Infinity").encode()


def json_cases(kind, rng, n):
    """n cases: (label, endpoint, body bytes, content type)"""
    bodies = _bodies(kind)
    cases = []
    for i in range(n):
        ep = rng.choice(sorted(bodies))
        body = json.loads(json.dumps(bodies[ep]))
        what = rng.random()
        if what < 0.35:
            f, v = rng.choice(NUMERIC), rng.choice(HOSTILE_NUMBERS)
            body[f] = v
            if rng.random() < 0.2:
                body["stream"] = True
            label = f"{f}={v!r}" + (" stream" if body.get("stream") else "")
        elif what < 0.6:
            f = rng.choice(sorted(STRUCT))
            body[f] = rng.choice(STRUCT[f])
            label = f"{f}={json.dumps(body[f])[:40]}"
        elif what < 0.72:
            f = rng.choice(sorted(SPARQ_FIELDS))
            body[f] = rng.choice(SPARQ_FIELDS[f])
            label = f"per-request {f}={body[f]!r}"
        elif what < 0.78:
            body.update({f"unknown_{j}": rng.choice([1, "x", None, {"a": [1]}]) for j in range(rng.randint(1, 20))})
            label = "unknown fields"
        else:
            raw = _dump(body)
            k = rng.randint(0, 4)
            if k == 0:
                cut = rng.randint(0, len(raw) - 1)
                raw, label = raw[:cut], f"truncated JSON at {cut}"
            elif k == 1:
                s = bytearray(raw)
                for _ in range(rng.randint(1, 4)):
                    s[rng.randrange(len(s))] = rng.randrange(256)
                raw, label = bytes(s), "flipped bytes"
            elif k == 2:
                # invalid UTF-8 inside a string value
                bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80\x80", b"\xe2\x82"])
                i0 = raw.find(b'": "') + 4  # the first string value's start
                if i0 == 3:
                    raw, i0 = raw[:-1] + b', "s": "x"}', len(raw) + 7
                raw, label = raw[:i0] + bad + raw[i0:], f"invalid UTF-8 {bad!r}"
            elif k == 3:
                raw, label = rng.choice([b"", b"null", b"[]", b"42", b'"x"', b"{", b"}", b"{}", b"[" * 5000,
                                         b'{"a":' * 3000, b"\x00" * 64]), "malformed JSON"
                label += f" {raw[:12]!r}"
            else:
                raw = raw.replace(b"Hello", "H\u00e9llo \U0001F600 \\ud800".encode(), 1)
                label = "lone surrogate escape"
            cases.append((f"{i} {ep} {label}", ep, raw, "application/json"))
            continue
        cases.append((f"{i} {ep} {label}", ep, _dump(body), rng.choice(["application/json"] * 5 + ["text/plain"])))
    # and every time: what crashed or answered 500 once
    bodies = _bodies(kind)
    comp, chat = bodies["/v1/completions"], bodies["/v1/chat/completions"]
    detok = "/detokenize" if kind == LLAMA else "/extras/detokenize"
    fixed = [(detok, {"tokens": t}) for t in ([-1], [10**9], [2**31 - 1], [1, 260])]
    fixed += [("/v1/completions", dict(comp, grammar="root ::= (")),
              ("/v1/completions", dict(comp, grammar="root ::= root")),
              ("/v1/completions", dict(comp, grammar="root ::= (", stream=True)),
              ("/v1/chat/completions", dict(chat, response_format={"type": "json_object", "schema": {"type": "bogus"}})),
              ("/v1/completions", dict(comp, logit_bias={"abc": 1})),
              ("/v1/completions", dict(comp, logit_bias={"999999": 5}, stream=True)),
              ("/v1/completions", dict(comp, logit_bias={"-1": 5})),
              ("/v1/completions", dict(comp, prompt=["a", "b"])),
              ("/v1/completions", dict(comp, temperature="NaN")),
              ("/v1/chat/completions", dict(chat, top_p="Infinity", stream=True)),
              ("/v1/completions", dict(comp, prompt="lorem ipsum " * 400, stream=True))]  # over the context
    for ep, body in fixed:
        cases.append((f"fixed {ep} {json.dumps(body)[-60:]}", ep, _dump(body), "application/json"))
    cases.append(("fixed nested 100000 deep", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, "application/json"))
    # a body of several MB: a 4 MB prompt (over the context, or refused before it is tokenized)
    big = dict(_bodies(kind)["/v1/completions"], prompt="lorem ipsum " * 350_000)
    cases.append(("big body 4 MB", "/v1/completions", _dump(big), "application/json"))
    return cases


def send(port, method, path, body, ctype, timeout=REQUEST_S):
    """(status, content type, body bytes) of one request on a fresh connection"""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": ctype} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        conn.close()


def check_answer(status, ctype, data, stream_asked):
    """a 4xx with a message, or a valid answer"""
    if 400 <= status < 500:
        return
    assert status == 200, (status, data[:300])
    if "text/event-stream" in ctype:
        events = [ln[5:].strip() for ln in data.decode().splitlines() if ln.startswith("data:")]
        assert events, data[:300]
        for e in events:
            if e != "[DONE]":
                json.loads(e)
    else:
        json.loads(data)


RAW_CASES = [
    ("garbage line", b"GARBAGE\r\n\r\n"),
    ("binary", bytes(range(256)) * 4),
    ("unknown version", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"),
    ("no version", b"GET /health\r\n\r\n"),
    ("unknown method", b"BREW /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("long URL", b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("huge header", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 1_000_000 + b"\r\n\r\n"),
    ("many headers", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 5000 + b"\r\n"),
    ("header without colon", b"GET /v1/models HTTP/1.1\r\nHost x\r\nnonsense\r\n\r\n"),
    ("NUL in request line", b"GET /v1/mo\x00dels HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("negative Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: -5\r\n\r\n{}"),
    ("non-numeric Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"),
    ("huge Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 99999999999999999999\r\n\r\n{}"),
    ("two Content-Lengths", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 2\r\nContent-Length: 30\r\n\r\n{}"),
    ("body cut short, kept alive", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n"
                                   b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"prompt\": \"Hel"),
    ("body cut short, closed", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 200\r\n\r\n{\"prompt\": \"Hel"),
    ("bad chunk size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\n{}\r\n0\r\n\r\n"),
    ("chunk cut short", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\nffff\r\n{\"prompt\""),
    ("chunked and Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
    ("pipelined, then garbage", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01\x00\xa5garbage\r\n\r\n"),
    ("TLS hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64)),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(30)),
    ("only CRLF", b"\r\n" * 1000),
    ("nothing sent", b""),
]


def raw_case(port, payload, close_write, meanwhile):
    """Sends payload on a socket; the status of the first answer (None: closed without one,
    "waits": none within RAW_S, a server waiting for the rest of a request; then, with this
    connection still open, ``meanwhile()`` must get its answer)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=RAW_S)
    try:
        try:
            s.sendall(payload)
            if close_write:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed on a bad start: fine
        data = b""
        try:
            while b"\r\n" not in data and len(data) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            meanwhile()
            return "waits"
        except ConnectionResetError:
            return None
        if not data:
            return None
        line = data.split(b"\r\n", 1)[0].split()
        assert len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit(), data[:200]
        return int(line[1])
    finally:
        s.close()


@pytest.fixture(scope="module", params=KINDS)
def server(request, tiny_model, tmp_path_factory):
    srv = start(request.param, tiny_model, tmp_path_factory.mktemp("fuzz-" + request.param), n_ctx=N_CTX,
                llama_args=SPARQ, py_args=SPARQ)
    yield srv
    srv.srv.stop()


def greedy_text(server):
    body = json.dumps({"model": "m", "prompt": "The quick brown fox jumps over the lazy dog. " * 4,
                       "max_tokens": 12, "temperature": 0}).encode()
    status, _, data = send(server.port, "POST", "/v1/completions", body, "application/json")
    assert status == 200, data[:300]
    return json.loads(data)["choices"][0]["text"]


def test_hostile_http(server):
    before = greedy_text(server)
    rng = random.Random(SEED)
    cases = json_cases(server.kind, rng, N_JSON)
    statuses, failures, known = {}, [], {}
    t0 = time.monotonic()
    for label, ep, raw, ctype in cases:
        try:
            status, rtype, data = send(server.port, "POST", ep, raw, ctype)
        except (socket.timeout, TimeoutError) as e:
            failures.append(f"{label}: no answer within {REQUEST_S} s ({e})")
            break
        except (ConnectionError, http.client.HTTPException) as e:
            failures.append(f"{label}: {type(e).__name__} {e}" + ("" if server.alive() else " (server died)"))
            if not server.alive():
                break
            continue
        statuses[status] = statuses.get(status, 0) + 1
        if status >= 500:
            why = known_5xx(server.kind, ep, raw, data)
            if why:
                known[why] = known.get(why, 0) + 1
                continue
        try:
            check_answer(status, rtype, data, b'"stream": true' in raw)
        except (AssertionError, ValueError) as e:
            failures.append(f"{label}: HTTP {status}: {data[:200]!r} ({type(e).__name__} {e})"[:600])
        if not server.alive():
            failures.append(f"{label}: server died")
            break
    t_json = time.monotonic() - t0
    raw_results = {}
    def meanwhile():
        status, _, data = send(server.port, "GET", "/v1/models", None, "", timeout=30)
        assert status == 200, data[:200]

    for label, payload in RAW_CASES:
        # the connection kept open (the server may wait for the rest), then closed for writing
        for close_write in (False, True):
            try:
                got = raw_case(server.port, payload, close_write, meanwhile)
            except (AssertionError, OSError) as e:
                failures.append(f"raw {label}: {type(e).__name__} {e}")
                continue
            raw_results[(label, close_write)] = got
            if isinstance(got, int) and got >= 500:
                failures.append(f"raw {label}: HTTP {got}")
            if got == "waits" and close_write:
                failures.append(f"raw {label}: no answer within {RAW_S} s after the client's end of data")
            if not server.alive():
                failures.append(f"raw {label}: server died")
                break
        if not server.alive():
            break
    raw_counts = {}
    for got in raw_results.values():
        raw_counts[str(got)] = raw_counts.get(str(got), 0) + 1
    print(f"{server.kind}: {len(cases)} JSON cases in {t_json:.1f} s, statuses {statuses}, upstream's known 5xx "
          f"{known}; {len(raw_results)} raw cases: {raw_counts}")
    assert not failures, "\n".join(failures)
    assert server.alive()
    assert greedy_text(server) == before
