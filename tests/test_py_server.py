"""python -m llama_sparq.server: llama-cpp-python's OpenAI-compatible server on the fork, with
SparQ settings per model, exercised over real HTTP on loopback (a tiny random model, so it is
fast; the text it writes is meaningless, the plumbing is what is tested)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import free_port, stop_process  # noqa: E402

pytest.importorskip("fastapi", reason="the server extra (pip install 'llama-sparq[server]') is not installed")
pytest.importorskip("uvicorn")
pytest.importorskip("sse_starlette")
pytest.importorskip("starlette_context")
pytest.importorskip("pydantic_settings")

HOST = "127.0.0.1"
STARTUP_S = 120
REQUEST_S = 120
# long enough that the decode steps hold more than sparq_min_kv cells
PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


def _request(port, path, body=None, timeout=REQUEST_S):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers.get("content-type", ""), r.read().decode()


def _json(port, path, body=None):
    status, ctype, text = _request(port, path, body)
    assert status == 200, text
    assert ctype.startswith("application/json"), ctype
    return json.loads(text)


def _sse_events(port, path, body):
    """The data: payloads of an SSE response, in order (the last one is [DONE])."""
    status, ctype, text = _request(port, path, body)
    assert status == 200, text
    assert ctype.startswith("text/event-stream"), ctype
    events = []
    for line in text.splitlines():
        if line.startswith("data:"):
            events.append(line[len("data:"):].strip())
    return events


class _Server:
    def __init__(self, args, tmp_path):
        self.port = free_port()
        self.log = open(tmp_path / f"server-{self.port}.log", "w+")
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        env.pop("CONFIG_FILE", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "llama_sparq.server", "--host", HOST,
                                      "--port", str(self.port), *args],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                _request(self.port, "/v1/models", timeout=5)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    out = self.output()
                    self.stop()
                    raise AssertionError(f"server not up after {STARTUP_S} s:\n{out}")
                time.sleep(0.5)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-6000:]

    def stop(self):
        stop_process(self.proc)
        self.log.close()


@pytest.fixture(scope="module")
def sparq_server(tiny_model, tmp_path_factory):
    srv = _Server(["--model", str(tiny_model), "--model_alias", "tiny", "--n_ctx", "1024", "--n_threads", "2",
                   "--sparq", "--sparq-min-kv", "16", "--sparq-k", "8"], tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def _stats(port, alias):
    data = _json(port, "/sparq/stats")["data"]
    entry = [e for e in data if e["id"] == alias]
    assert len(entry) == 1, data
    return entry[0]


def test_models_endpoint(sparq_server):
    out = _json(sparq_server.port, "/v1/models")
    assert out["object"] == "list"
    assert [m["id"] for m in out["data"]] == ["tiny"]


def test_chat_completion_runs_sparq(sparq_server):
    port = sparq_server.port
    before = _stats(port, "tiny")["stats"]["n_sparq"]
    out = _json(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                               "max_tokens": 8, "temperature": 0})
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert out["usage"]["completion_tokens"] >= 1
    assert out["usage"]["prompt_tokens"] > 16
    st = _stats(port, "tiny")
    assert st["loaded"] is True
    assert st["sparq_settings"] == {"sparq": True, "sparq_k": 8, "sparq_min_kv": 16}
    assert st["params"]["sparq"] is True and st["params"]["sparq_k"] == 8 and st["params"]["sparq_min_kv"] == 16
    # every decode step past 16 cells runs SparQ in each of the 2 layers
    assert st["stats"]["n_sparq"] - before >= 2 * out["usage"]["completion_tokens"] - 2
    assert st["stats"]["n_layers"] == 2
    assert 0 < st["stats"]["compression"] < 1


def test_streaming_chat_completion(sparq_server):
    port = sparq_server.port
    events = _sse_events(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                        "max_tokens": 6, "temperature": 0, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    # the same request without streaming gives the same text (greedy)
    out = _json(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                               "max_tokens": 6, "temperature": 0})
    assert text == out["choices"][0]["message"]["content"]


def test_completion_and_streaming_completion(sparq_server):
    port = sparq_server.port
    before = _stats(port, "tiny")["stats"]["n_sparq"]
    out = _json(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    assert out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] >= 1
    assert _stats(port, "tiny")["stats"]["n_sparq"] > before
    events = _sse_events(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                   "stream": True})
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == out["choices"][0]["text"]


def test_config_file_sparq_settings_per_model(tiny_model, tmp_path):
    cfg = {"host": HOST, "models": [
        {"model": str(tiny_model), "model_alias": "tiny-sparq", "n_ctx": 1024, "n_threads": 2,
         "sparq_r": 4, "sparq_k": 8, "sparq_min_kv": 16},
        {"model": str(tiny_model), "model_alias": "tiny-dense", "n_ctx": 1024, "n_threads": 2},
    ]}
    path = tmp_path / "models.json"
    path.write_text(json.dumps(cfg))
    srv = _Server(["--config_file", str(path)], tmp_path)
    try:
        port = srv.port
        assert [m["id"] for m in _json(port, "/v1/models")["data"]] == ["tiny-sparq", "tiny-dense"]
        body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
        _json(port, "/v1/completions", dict(body, model="tiny-sparq"))
        st = _stats(port, "tiny-sparq")
        assert st["loaded"] and st["params"]["sparq"] and st["params"]["sparq_r"] == 4 and st["params"]["sparq_k"] == 8
        assert st["stats"]["n_sparq"] > 0
        assert _stats(port, "tiny-dense") == {"id": "tiny-dense", "model": str(tiny_model), "sparq_settings": {},
                                              "loaded": False}
        _json(port, "/v1/completions", dict(body, model="tiny-dense"))  # the proxy switches models
        st = _stats(port, "tiny-dense")
        assert st["loaded"] and st["params"]["sparq"] is False and st["stats"]["n_sparq"] == 0
        assert _stats(port, "tiny-sparq")["loaded"] is False
    finally:
        srv.stop()


def test_invalid_sparq_setting_is_refused(tiny_model):
    r = subprocess.run([sys.executable, "-m", "llama_sparq.server", "--model", str(tiny_model), "--sparq-k", "-3",
                        "--port", str(free_port()), "--host", HOST], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert r.returncode == 2
    assert "SparQ: k = -3 is out of range" in r.stderr, r.stderr[-500:]  # the C API's message, word for word


def test_logits_all_default_keeps_the_logits_array_within_a_budget(smollm2_model):
    """llama-cpp-python's server keeps every prompt token's logits (n_ctx x n_vocab floats) by
    default; ours turns that off, saying so, where the array would pass 1 GiB, and keeps an
    explicit --logits_all true."""
    import argparse

    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import Settings
    from llama_sparq import server as S

    def settings(*argv):
        ap = argparse.ArgumentParser()
        add_args_from_model(ap, Settings)
        S._add_sparq_args(ap)
        return S._as_sparq_settings(parse_model_from_args(S.SparqModelSettings, ap.parse_args(
            ["--model", str(smollm2_model), *argv])))

    # SmolLM2: 49152 tokens, so 2048 cells take 384 MiB and 8192 take 1.5 GiB
    assert S._bounded_logits_all(settings("--n_ctx", "2048")).logits_all is True
    assert S._bounded_logits_all(settings("--n_ctx", "8192")).logits_all is False
    assert S._bounded_logits_all(settings("--n_ctx", "0")).logits_all is False  # the model's 8192
    assert S._bounded_logits_all(settings("--n_ctx", "8192", "--logits_all", "true")).logits_all is True
    assert S._bounded_logits_all(settings("--n_ctx", "8192", "--logits_all", "false")).logits_all is False
