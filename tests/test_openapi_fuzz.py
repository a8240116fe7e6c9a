"""Schema-driven fuzz of ``python -m llama_sparq.server --sparq`` (the tiny random model, loopback):
schemathesis reads the server's own ``/openapi.json`` and generates requests for every
operation in it (completions, chat, embeddings, tokenize, detokenize, models, /sparq/stats),
valid ones (positive) and ones that break the schema (negative), from a fixed seed and a
bounded count per operation and mode.

Each answer must come within REQUEST_S (else it is a hang) and pass schemathesis's checks: not
a 5xx, a status code the schema declares, the declared content type, the declared response
schema (headers too). Failures are collected, not shrunk, and the test lists them all. Before
and after the fuzz a greedy request gives the same text, and the server process lives.

Not checked: that the server rejects every schema-violating body (pydantic's lax mode takes
``"5"`` for an integer, as llama-cpp-python always has) or accepts every schema-valid one (a
prompt longer than the context, a token id outside the vocabulary: the schema cannot say).

What the fuzz found is also kept as fixed requests (REGRESSIONS), and the schema's own claims
(the 400, no bearer token without an API key, stream events) are checked directly."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from served import PYTHON, start

for _mod in ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"):
    pytest.importorskip(_mod, reason="the server extra (pip install 'llama-sparq[server]') is not installed")
schemathesis = pytest.importorskip("schemathesis", reason="schemathesis (make deps) is not installed")

import requests  # noqa: E402  (schemathesis's transport)
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

SEED = 4802
MAX_EXAMPLES = 25  # per operation and mode (positive, negative)
REQUEST_S = 60     # an answer later than this is a hang
N_CTX = 128        # asked for; llama.cpp makes it 256 cells, and a request without max_tokens runs to them
SPARQ = ["--sparq", "--sparq-k", 8, "--sparq-r", 4, "--sparq-min-kv", 16]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
OPERATIONS = ("POST /v1/completions", "POST /v1/chat/completions", "POST /v1/embeddings", "GET /v1/models",
              "POST /extras/tokenize", "POST /extras/tokenize/count", "POST /extras/detokenize", "GET /sparq/stats")


def _checks():
    from schemathesis import checks
    from schemathesis.specs.openapi import checks as oa

    return [checks.not_a_server_error, oa.status_code_conformance, oa.content_type_conformance,
            oa.response_schema_conformance, oa.response_headers_conformance]


def fuzz(base: str, max_examples: int = MAX_EXAMPLES, fuzz_seed: int = SEED):
    """Runs the generated cases against the server at ``base``: ({operation: (cases, seconds)},
    failures). The seed fixes the cases (Hypothesis's example database is off)."""
    with urllib.request.urlopen(base + "/openapi.json", timeout=30) as r:
        raw = json.loads(r.read())
    schema = schemathesis.openapi.from_dict(raw, config=schemathesis.Config())
    checks = _checks()
    session = requests.Session()
    session.trust_env = False  # loopback: no proxy from the environment
    counts, failures = {}, []
    for result in schema.get_all_operations():
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"
        counts[label] = 0
        t_op = time.monotonic()
        for mode in MODES:
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=max_examples, database=None, deadline=None, derandomize=False,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                      print_blob=False)
            @seed(fuzz_seed)
            def run(case):
                counts[label] += 1
                t0 = time.monotonic()
                try:
                    response = case.call(base_url=base, session=session, timeout=REQUEST_S)
                except requests.Timeout:
                    failures.append(f"{label} ({mode.value}): no answer within {REQUEST_S} s: {_body(case)}")
                    return
                except requests.RequestException as e:
                    failures.append(f"{label} ({mode.value}): {type(e).__name__} {e}: {_body(case)}")
                    return
                try:
                    case.validate_response(response, checks=checks)
                except (AssertionError, BaseExceptionGroup) as e:  # a check failed, or several (FailureGroup)
                    failures.append(f"{label} ({mode.value}) HTTP {response.status_code} in "
                                    f"{time.monotonic() - t0:.1f} s: {_first_lines(e)}\n  body {_body(case)}\n"
                                    f"  answer {response.content[:300]!r}")
            try:
                run()
            except Unsatisfiable:
                # no request breaks the schema of an operation without parameters or body (GET /v1/models)
                assert mode is GenerationMode.NEGATIVE and not op.body and not op.query, label
        counts[label] = (counts[label], round(time.monotonic() - t_op, 1))
    return counts, failures


def _body(case) -> str:
    try:
        return json.dumps(case.body)[:400]
    except (TypeError, ValueError):
        return repr(case.body)[:400]


def _first_lines(e) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Reproduce")]
    return " | ".join(lines[:6])[:600]


def greedy_text(base: str) -> str:
    body = json.dumps({"model": "m", "prompt": "The quick brown fox jumps over the lazy dog. ",
                       "max_tokens": 12, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_S) as r:
        return json.loads(r.read())["choices"][0]["text"]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    # one thread: most chat cases generate to the context, and two threads of a model this small
    # spend their time in OpenMP's barrier (10 times slower when the machine is busy)
    srv = start(PYTHON, tiny_model, tmp_path_factory.mktemp("openapi-fuzz"), n_ctx=N_CTX, py_args=SPARQ, threads=1)
    yield srv
    srv.srv.stop()


def test_openapi_fuzz(server):
    before = greedy_text(server.base)
    t0 = time.monotonic()
    counts, failures = fuzz(server.base)
    took = time.monotonic() - t0
    print(f"schemathesis {schemathesis.__version__}: {sum(n for n, _ in counts.values())} cases in {took:.1f} s, "
          f"seed {SEED}, at most {MAX_EXAMPLES} per operation and mode; (cases, seconds) per operation: {counts}")
    assert server.alive(), server.log()[-3000:]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)
    assert set(OPERATIONS) <= set(counts), counts  # every operation was reached
    assert greedy_text(server.base) == before


# What the fuzz found (each a 500 or a dead request before), as fixed requests: (label, path, body,
# status, what the answer must have)
LEAD_BYTE = 198  # the tiny model's token for the byte 0xC3, which starts a two-byte UTF-8 character
REGRESSIONS = [
    ("presence_penalty null", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 3, "presence_penalty": None}, 200, {}),
    ("frequency_penalty null", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "frequency_penalty": None}, 200, {}),
    ("embeddings from a model without embedding", "/v1/embeddings", {"input": "Hello"}, 400, {"param": "model"}),
    ("assistant message without content", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}], "max_tokens": 3}, 200, {}),
    ("tool_choice not among the tools", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, {"param": "tool_choice"}),
    ("function_call not among the functions", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
      "functions": [{"name": "f", "parameters": {"type": "object"}}], "function_call": {"name": "g"}},
     400, {"param": "function_call"}),
    ("echo of an empty prompt with logprobs", "/v1/completions",
     {"prompt": "", "echo": True, "logprobs": 2, "max_tokens": 2}, 200, {}),
    # past the n_ctx asked for (128) into the context llama.cpp made (256): llama-cpp-python's
    # arrays were 128 long
    ("a completion past the n_ctx asked for", "/v1/completions",
     {"prompt": "Hi", "max_tokens": 140, "temperature": 0, "logit_bias": {"2": -100}}, 200,
     {"completion_tokens": 140}),
    # every token a UTF-8 lead byte: llama-cpp-python skips its max_tokens check while the text
    # ends inside a character, so it ran on past max_tokens, and on to a decode with no KV cell left
    ("text ending inside a character at max_tokens", "/v1/completions",
     {"prompt": "Hi", "max_tokens": 4, "temperature": 0, "logit_bias": {str(LEAD_BYTE): 100}}, 200,
     {"finish_reason": "length", "completion_tokens": 4}),
    ("text ending inside a character at the context's end", "/v1/completions",
     {"prompt": "Hi", "max_tokens": 0, "temperature": 0, "logit_bias": {str(LEAD_BYTE): 100}}, 200,
     {"finish_reason": "length"}),
    ("the same, streamed", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "temperature": 0,
      "logit_bias": {str(LEAD_BYTE): 100}}, 200, {"finish_reason": "length"}),
]


@pytest.mark.parametrize("label,path,body,status,want", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_openapi_fuzz_findings(server, label, path, body, status, want):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_S) as r:
            got, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        got, data = e.code, e.read()
    assert got == status, data[:500]
    if status == 400:
        assert json.loads(data)["error"]["param"] == want["param"], data
        return
    if body.get("stream"):
        chunks = [json.loads(ln[5:]) for ln in data.decode().splitlines()
                  if ln.startswith("data:") and ln[5:].strip() != "[DONE]"]
        answer = {"choices": [chunks[-1]["choices"][0]]}
    else:
        answer = json.loads(data)
    if "finish_reason" in want:
        assert answer["choices"][0]["finish_reason"] == want["finish_reason"], answer
    if "completion_tokens" in want:
        assert answer["usage"]["completion_tokens"] == want["completion_tokens"], answer["usage"]
    assert server.alive()


def test_openapi_schema_says_what_the_server_answers(server):
    """The schema that the fuzz checks answers against: a bad body's 400 with OpenAI's error
    object (not FastAPI's 422, which the server never sends), no bearer token without an API key,
    and a stream's events as events."""
    with urllib.request.urlopen(server.base + "/openapi.json", timeout=30) as r:
        schema = json.loads(r.read())
    assert "securitySchemes" not in schema["components"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/extras/tokenize",
                 "/extras/tokenize/count", "/extras/detokenize"):
        op = schema["paths"][path]["post"]
        assert sorted(op["responses"]) == ["200", "400"], (path, sorted(op["responses"]))
        assert op["responses"]["400"]["content"]["application/json"]["schema"] == \
            {"$ref": "#/components/schemas/ErrorResponse"}
        assert "security" not in op
    event = schema["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert event["required"] == ["data"]
