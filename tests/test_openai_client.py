"""The official ``openai`` Python client against both servers with SparQ on: llama-server
(``--sparq``) and ``python -m llama_sparq.server`` (``--sparq``), each on a loopback port.

Protocol cases run on the tiny random model (its text is meaningless; the plumbing is what is
checked): chat and text completions streamed and not, ``stop``, ``max_tokens`` with
finish_reason ``length``, ``usage``, ``seed``, logprobs, a prompt longer than the context (a 400
with a message), and a client that drops a stream midway (the next identical request gets the
same answer). Where one server lacks a feature the case is skipped naming it:

- llama-server: chat logprobs (``logprobs``, ``top_logprobs``), text-completion logprobs
  (``logprobs: N``, answered in the chat shape, not OpenAI's legacy lists), usage in a stream
  (``stream_options.include_usage``);
- the Python server (llama-cpp-python): text-completion logprobs in OpenAI's legacy lists, and
  chat logprobs, for a model loaded with ``logits_all`` (its default; Gemma is served here without
  it, and a logprobs request is then a 400 naming it); no usage in a stream (its chunks carry
  none).

On Gemma 3 270M (real_model): a pass key in a ~600-token context, past the dense threshold (512
here) so that SparQ runs (its counters: llama-server's /metrics, the Python server's /sparq/stats), is
answered by SparQ as by dense."""

from __future__ import annotations

import time

import pytest

from served import KINDS, LLAMA, PYTHON, start

openai = pytest.importorskip("openai", reason="the test extra's openai client is not installed")
for _mod in ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"):
    pytest.importorskip(_mod, reason="the server extra (pip install 'llama-sparq[server]') is not installed")

# long enough that decode steps hold more than --sparq-min-kv cells
PROMPT = "The quick brown fox jumps over the lazy dog. " * 6
MESSAGES = [{"role": "user", "content": PROMPT}]
# SparQ on every decode step past 16 cells (the tiny model's heads are 16 wide: r 4 of 16)
TINY_SPARQ = ["--sparq", "--sparq-k", 8, "--sparq-r", 4, "--sparq-min-kv", 16]


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tiny_model, tmp_path_factory):
    srv = start(request.param, tiny_model, tmp_path_factory.mktemp(request.param), n_ctx=1024,
                llama_args=TINY_SPARQ, py_args=TINY_SPARQ)
    yield srv
    srv.srv.stop()


# The tiny model's vocabulary is the 256 byte tokens (and three specials): its random text would
# split UTF-8 characters, which the servers handle differently streamed and not (and the Python
# server then generates past max_tokens until the character is whole, docs/serving.md). Printable
# ASCII bytes only, and no end of text: every reply runs to max_tokens.
ASCII_ONLY = {str(i): -100 for i in range(3)} | {str(3 + b): -100 for b in range(256) if not 0x20 <= b < 0x7F}


def greedy(**kw):
    return dict(model="m", temperature=0, logit_bias=ASCII_ONLY, **kw)


def chat_text(client, stream=False, **kw):
    """The reply's text and finish reason (a stream's chunks joined)."""
    if not stream:
        out = client.chat.completions.create(messages=MESSAGES, **greedy(**kw))
        return out.choices[0].message.content, out.choices[0].finish_reason
    text, finish, first = "", None, True
    for chunk in client.chat.completions.create(messages=MESSAGES, stream=True, **greedy(**kw)):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        if first:
            assert c.delta.role in ("assistant", None)
            first = False
        text += c.delta.content or ""
        finish = c.finish_reason or finish
    return text, finish


def completion_text(client, prompt=PROMPT, stream=False, **kw):
    kw = greedy(**kw) if "model" not in kw else kw
    if not stream:
        out = client.completions.create(prompt=prompt, **kw)
        return out.choices[0].text, out.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.completions.create(prompt=prompt, stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].text or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_chat_streamed_and_not_run_sparq(tiny):
    client = tiny.openai()
    before = tiny.sparq_calls()
    out = client.chat.completions.create(messages=MESSAGES, **greedy(max_tokens=8))
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    text, finish = out.choices[0].message.content, out.choices[0].finish_reason
    assert isinstance(text, str) and finish in ("length", "stop")
    assert tiny.sparq_calls() > before  # decode steps ran SparQ
    assert chat_text(client, stream=True, max_tokens=8) == (text, finish)


def test_completion_streamed_and_not(tiny):
    client = tiny.openai()
    before = tiny.sparq_calls()
    out = client.completions.create(prompt=PROMPT, **greedy(max_tokens=8))
    assert out.object == "text_completion"
    text, finish = out.choices[0].text, out.choices[0].finish_reason
    assert text and finish in ("length", "stop")
    assert tiny.sparq_calls() > before
    assert completion_text(client, stream=True, max_tokens=8) == (text, finish)


def test_max_tokens_gives_length(tiny):
    client = tiny.openai()
    out = client.completions.create(prompt=PROMPT, **greedy(max_tokens=5))
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    out = client.chat.completions.create(messages=MESSAGES, **greedy(max_tokens=5))
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5


@pytest.mark.parametrize("stream", [False, True])
def test_stop(tiny, stream):
    """A stop string from inside the greedy answer cuts the answer before it (finish "stop")."""
    client = tiny.openai()
    full, _ = completion_text(client, max_tokens=24)
    # a 3-character piece whose first occurrence is past the start
    at = next(i for i in range(4, len(full) - 3) if full.find(full[i:i + 3]) == i and full[i:i + 3].strip())
    stop = full[at:at + 3]
    text, finish = completion_text(client, stream=stream, max_tokens=24, stop=[stop])
    assert (text, finish) == (full[:at], "stop"), (full, stop)


def test_usage(tiny):
    client = tiny.openai()
    if tiny.kind == LLAMA:
        import json
        import urllib.request

        req = urllib.request.Request(tiny.base + "/tokenize", data=json.dumps({"content": PROMPT, "add_special": True})
                                     .encode(), headers={"Content-Type": "application/json"})
        n_prompt = len(json.loads(urllib.request.urlopen(req, timeout=30).read())["tokens"])
    else:
        n_prompt = client.post("/../extras/tokenize/count", body={"input": PROMPT}, cast_to=object)["count"]
    out = client.completions.create(prompt=PROMPT, **greedy(max_tokens=6))
    u = out.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (n_prompt, 6, n_prompt + 6)
    out = client.chat.completions.create(messages=MESSAGES, **greedy(max_tokens=6))
    u = out.usage
    assert u.prompt_tokens > n_prompt - 2 and u.completion_tokens == 6 and u.total_tokens == u.prompt_tokens + 6


def test_usage_in_a_stream(tiny):
    if tiny.kind == PYTHON:
        pytest.skip("the Python server (llama-cpp-python) sends no usage in a stream (stream_options ignored)")
    client = tiny.openai()
    chunks = list(client.chat.completions.create(messages=MESSAGES, stream=True, stream_options={"include_usage": True},
                                                 **greedy(max_tokens=6)))
    last = chunks[-1]
    assert last.usage is not None and last.usage.completion_tokens == 6 and not last.choices
    assert last.usage.total_tokens == last.usage.prompt_tokens + 6


def test_seed(tiny):
    """Sampled (temperature 1): the same seed gives the same text, other seeds (almost surely,
    on the tiny model's near-uniform distribution) another."""
    client = tiny.openai()
    # every sampled request below finds its prompt cached with a reply after it, and evaluates the
    # prompt's last token again alone (a decode step: SparQ); a cold prompt's last token is
    # evaluated with the prompt (dense), and on the tiny model's near-uniform distribution that
    # difference moves a draw
    completion_text(client, max_tokens=3)

    def sample(seed):
        return client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed,
                                         top_p=1.0, logit_bias=ASCII_ONLY).choices[0].text

    a = sample(42)
    assert sample(42) == a
    assert any(sample(s) != a for s in (1, 2, 3))


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_the_context_is_a_400(tiny, api, stream):
    client = tiny.openai()
    long_prompt = "lorem ipsum dolor sit amet " * 400  # ~2K tokens, over the 1024-cell context
    with pytest.raises(openai.BadRequestError) as e:
        if api == "completions":
            list(completion_text(client, prompt=long_prompt, stream=stream, max_tokens=4))
        else:
            client.chat.completions.create(messages=[{"role": "user", "content": long_prompt}], stream=stream,
                                           **greedy(max_tokens=4))
    assert e.value.status_code == 400
    assert "context" in e.value.message, e.value.message
    assert tiny.alive()
    # and the server goes on
    assert completion_text(client, max_tokens=4)[0]


def test_dropped_stream_then_the_same_answer(tiny):
    """A client that closes a stream after a few chunks: the server stops that generation, and
    the next identical request (which reuses the cached prompt, the dropped reply's cells
    removed) gets the answer the request got before the drop."""
    client = tiny.openai()
    body = greedy(max_tokens=100)
    full = client.completions.create(prompt=PROMPT, **body)
    assert full.usage.completion_tokens == 100
    full_streamed = completion_text(client, stream=True, **body)
    assert full_streamed == (full.choices[0].text, "length")
    stream = client.completions.create(prompt=PROMPT, stream=True, **body)
    got = ""
    for i, chunk in enumerate(stream):
        got += chunk.choices[0].text if chunk.choices else ""
        if i == 2:
            break
    stream.close()
    assert got and full.choices[0].text.startswith(got)
    time.sleep(0.3)
    assert tiny.alive()
    assert completion_text(client, stream=True, **body) == full_streamed
    assert client.completions.create(prompt=PROMPT, **body).choices[0].text == full.choices[0].text


# -- a real model: SparQ answers a retrieval prompt as dense does --------------------------------------

def passkey_prompt(n_filler=30, key=68342, at=0.4):
    lines = ["The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."] * n_filler
    lines.insert(int(at * n_filler), f"The pass key is {key}. Remember it. {key} is the pass key.")
    return ("There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
            "memorize it.\n" + "\n".join(lines) + "\nWhat is the pass key? The pass key is")


@pytest.fixture(scope="module")
def dense_passkey_answer(gemma_model):
    """Dense, in this process: the greedy answer to the pass-key prompt."""
    from llama_sparq import Llama

    llm = Llama(str(gemma_model), n_ctx=2048, n_threads=2, verbose=False, seed=0)
    try:
        n = len(llm.tokenize(passkey_prompt().encode()))
        out = llm(passkey_prompt(), max_tokens=6, temperature=0)
        return n, out["choices"][0]["text"]
    finally:
        llm.close()


@pytest.fixture(scope="module", params=KINDS)
def gemma(request, gemma_model, tmp_path_factory):
    # SparQ's defaults but the dense threshold: 512 cells (1024 by default), under the prompt
    srv = start(request.param, gemma_model, tmp_path_factory.mktemp("gemma-" + request.param), n_ctx=2048,
                llama_args=["--sparq", "--sparq-min-kv", 512],
                py_args=["--sparq", "--sparq-min-kv", 512, "--logits_all", "false"])
    yield srv
    srv.srv.stop()


@pytest.mark.real_model
def test_passkey_sparq_equals_dense(gemma, dense_passkey_answer):
    n_prompt, dense = dense_passkey_answer
    assert n_prompt > 560, n_prompt  # past the dense threshold (512 cells)
    assert "68342" in dense, dense
    client = gemma.openai(timeout=120)
    before = gemma.sparq_calls()
    out = client.completions.create(prompt=passkey_prompt(), **greedy(max_tokens=6))
    assert out.usage.prompt_tokens == n_prompt
    assert out.choices[0].text == dense
    assert gemma.sparq_calls() > before  # the decode steps ran SparQ


def test_completion_logprobs_python_tiny(tiny):
    """The Python server's logprobs (a model loaded with logits_all, its default): OpenAI's legacy
    lists. On the tiny model only their shape: its byte tokens' texts collide as keys of
    top_logprobs, and llama-cpp-python's logprobs are those before logit_bias."""
    if tiny.kind != PYTHON:
        pytest.skip("llama-server's logprobs: test_completion_logprobs on Gemma")
    client = tiny.openai()
    out = client.completions.create(prompt=PROMPT, logprobs=3, **greedy(max_tokens=4))
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(x <= 0 for x in lp.token_logprobs) and all(1 <= len(top) <= 4 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == out.choices[0].text


def logprobs_case(gemma):
    if gemma.kind == PYTHON:
        # served without logits_all (a 2K x 262K-logit array otherwise): refused, naming it
        client = gemma.openai(timeout=120)
        with pytest.raises(openai.BadRequestError, match="logits_all"):
            client.completions.create(model="m", prompt="The capital of France is", logprobs=3, max_tokens=2)
        pytest.skip("the Python server offers logprobs only for a model loaded with logits_all (off for Gemma here; "
                    "test_completion_logprobs_python_tiny has them)")


@pytest.mark.real_model
def test_chat_logprobs(gemma):
    """llama-server's (see the module's docstring)."""
    logprobs_case(gemma)
    client = gemma.openai(timeout=120)
    out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name three colours."}],
                                         temperature=0, logprobs=True, top_logprobs=3, max_tokens=4)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 4
    for tok in content:
        assert len(tok.top_logprobs) == 3 and tok.logprob <= 0
        # greedy: the token taken is the most likely
        assert tok.logprob == pytest.approx(max(t.logprob for t in tok.top_logprobs), abs=1e-3)
    assert "".join(t.token for t in content) == out.choices[0].message.content


@pytest.mark.real_model
def test_completion_logprobs(gemma):
    """llama-server answers text-completion logprobs in the chat shape (logprobs.content: token,
    logprob, top_logprobs), not OpenAI's legacy lists: upstream's choice (docs/serving.md, known
    limits)."""
    logprobs_case(gemma)
    client = gemma.openai(timeout=120)
    out = client.completions.create(model="m", prompt="The capital of France is", temperature=0, logprobs=3,
                                    max_tokens=4)
    lp = out.choices[0].logprobs
    assert lp.tokens is None and lp.token_logprobs is None
    content = lp.content  # an extra field of the client's model
    assert len(content) == 4
    for tok in content:
        assert tok["logprob"] <= 0 and len(tok["top_logprobs"]) == 3
        assert tok["logprob"] == pytest.approx(max(x["logprob"] for x in tok["top_logprobs"]), abs=1e-3)
    assert "".join(t["token"] for t in content) == out.choices[0].text
