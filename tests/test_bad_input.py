"""Bad input: every one gives a clear error naming what is wrong, never a crash.

- a truncated or corrupt GGUF, through Python and the tools;
- a GGUF whose attention SparQ does not compute (Gemma 2's soft-capping by a negative cap) with SparQ asked for;
- SparQ settings out of range through llama-server's flags and the Python server's per-model
  config (Python, the common flags and llama-bench's lists: tests/test_bindings.py);
- a request for more context than the server's slot holds;
- a fuzz of GGUF headers: a few hundred mutated copies of the tiny model, each loaded and, when
  it loads, decoded with SparQ, in one process that must not crash."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llama_sparq import tool_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import Server, ServerError, free_port  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def run(args, timeout=120):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace", timeout=timeout,
                          stdin=subprocess.DEVNULL, env=ENV)


def not_a_crash(res):
    """Exited by itself with an error status: no signal (negative), no abort (134)."""
    return res.returncode > 0 and res.returncode not in (128 + signal.SIGABRT, 128 + signal.SIGSEGV)


# -- corrupt files -------------------------------------------------------------------------

def _set_f32(data: bytes, key: bytes, v: float) -> bytes:
    """The file with the f32 value of a key-value replaced (after the key: its u32 type, 6)."""
    i = data.index(key) + len(key)
    assert struct.unpack("<I", data[i:i + 4])[0] == 6  # GGUF_TYPE_FLOAT32
    return data[:i + 4] + struct.pack("<f", v) + data[i + 8:]


def _corrupt(tiny_model: Path, tmp_path: Path) -> dict:
    data = tiny_model.read_bytes()
    import gguf

    hdr_end = gguf.GGUFReader(str(tiny_model)).data_offset
    out = {
        "empty": b"",
        "not_gguf": b"hello, this is not a model\n" * 10,
        "bad_version": data[:4] + struct.pack("<I", 99) + data[8:],
        "header_cut": data[:hdr_end // 2],
        "tensor_data_cut": data[:hdr_end + (len(data) - hdr_end) // 2],
        "tensor_count_huge": data[:8] + struct.pack("<Q", 2**62) + data[16:],
        # upstream asserted on these (an abort): two tokens with one text, and an RMS-norm
        # epsilon below 0 (loaded, then the first decode's rms_norm asserted)
        "duplicate_token": data.replace(b"<0x41>", b"<0x42>", 1),
        "negative_rms_eps": _set_f32(data, b"llama.attention.layer_norm_rms_epsilon", -1e-5),
    }
    paths = {}
    for name, b in out.items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(b)
        paths[name] = p
    return paths


@pytest.fixture(scope="module")
def corrupt_files(tiny_model, tmp_path_factory):
    return _corrupt(Path(tiny_model), tmp_path_factory.mktemp("corrupt"))


@pytest.mark.parametrize("name", ["empty", "not_gguf", "bad_version", "header_cut", "tensor_data_cut",
                                  "tensor_count_huge", "duplicate_token", "negative_rms_eps"])
def test_corrupt_gguf_is_refused_by_every_entry_point(corrupt_files, name):
    """Python's Llama raises ValueError naming the file; llama-completion, llama-server and
    llama-bench exit with an error status and a message, without a signal or an abort."""
    from llama_sparq import Llama

    path = corrupt_files[name]
    with pytest.raises(ValueError) as e:
        Llama(str(path), n_ctx=256, verbose=False, sparq=True)
    assert str(path) in str(e.value)
    res = run([tool_path("llama-completion"), "-m", path, "-p", "hi", "-n", "2", "-no-cnv", "--sparq", "-t", "1"])
    assert not_a_crash(res), (res.returncode, res.stderr[-2000:])
    assert "failed to load model" in res.stderr or "error" in res.stderr.lower(), res.stderr[-2000:]
    if name in ("duplicate_token", "negative_rms_eps"):
        assert "invalid model file: " in res.stderr, res.stderr[-2000:]
        assert ("id_to_token.size() == token_to_id.size()" if name == "duplicate_token" else
                "attention.layer_norm_rms_epsilon = -1e-05; allowed a number >= 0") in res.stderr
    res = run([tool_path("llama-server"), "-m", path, "--port", free_port(), "--sparq", "-t", "1"])
    assert not_a_crash(res), (res.returncode, res.stderr[-2000:])
    assert "failed to load model" in res.stderr + res.stdout or "error" in (res.stderr + res.stdout).lower()
    res = run([tool_path("llama-bench"), "-m", path, "-p", "0", "-n", "1", "-r", "1", "--sparq", "1"])
    assert not_a_crash(res), (res.returncode, res.stderr[-2000:])
    assert "failed to load model" in res.stderr, res.stderr[-2000:]


# -- attention SparQ does not compute ------------------------------------------------------

@pytest.fixture(scope="module")
def gemma2_model(tmp_path_factory):
    from sparq_lab.models import make_tiny_gemma2

    return make_tiny_gemma2(tmp_path_factory.mktemp("gemma2") / "tiny-gemma2.gguf", softcap=-50.0)


WHY = ("no KV-cache layer of this context can run SparQ (1 attn_variant: attention logit soft-capping by a value "
       "that is not finite and > 0)")


def test_unsupported_attention_with_sparq_is_refused(gemma2_model):
    """Gemma 2 with a negative soft-cap, which the op does not take: it runs dense without SparQ;
    with SparQ asked for, Python, llama-completion, llama-server and llama-bench refuse, naming the
    reason (never "SparQ on" and every step dense)."""
    from llama_sparq import Llama

    llm = Llama(str(gemma2_model), n_ctx=256, verbose=False)
    assert llm("hello", max_tokens=2, temperature=0)["choices"][0]["text"] is not None
    llm.close()
    with pytest.raises(RuntimeError, match=r"SparQ: " + WHY.replace("(", r"\(").replace(")", r"\)")):
        Llama(str(gemma2_model), n_ctx=256, verbose=False, sparq=True)
    res = run([tool_path("llama-completion"), "-m", gemma2_model, "-p", "hi", "-n", "2", "-no-cnv", "--sparq", "-t", "1"])
    assert not_a_crash(res) and WHY in res.stderr, res.stderr[-2000:]
    assert "SparQ on: " not in res.stderr
    res = run([tool_path("llama-server"), "-m", gemma2_model, "--port", free_port(), "--sparq", "-t", "1"])
    assert not_a_crash(res) and WHY in res.stderr + res.stdout, (res.stderr + res.stdout)[-2000:]
    res = run([tool_path("llama-bench"), "-m", gemma2_model, "-p", "0", "-n", "1", "-r", "1", "--sparq", "1"])
    assert not_a_crash(res) and WHY in res.stderr, res.stderr[-2000:]


# -- settings out of range: the servers ------------------------------------------------------

@pytest.mark.parametrize("flags,message", [
    (["--sparq-k", "-2"], "SparQ: k = -2 is out of range: allowed 1..1048576, or 0 for the calibrated k"),
    (["--sparq-coverage", "1.5"], "SparQ: coverage = 1.5 is out of range: allowed (0, 1]"),
    (["--sparq-r", "99"], "SparQ: r = 99 is out of range: allowed 1..head size (head size = 16)"),
])
def test_llama_server_refuses_out_of_range_settings(tiny_model, flags, message):
    res = run([tool_path("llama-server"), "-m", tiny_model, "--port", free_port(), "-t", "1", *flags])
    assert not_a_crash(res), (res.returncode, res.stderr[-2000:])
    assert message in res.stderr + res.stdout, (res.stderr + res.stdout)[-2000:]


def test_python_server_refuses_a_bad_per_model_setting_at_start(tiny_model, tmp_path):
    """A config file whose second model (loaded only when a request asks for it) has an
    out-of-range SparQ setting: the server refuses to start, naming the model and the library's
    message; the new calibrated-k fields are config fields too."""
    cfg = {"models": [
        {"model": str(tiny_model), "model_alias": "good", "sparq_k": 8, "sparq_r": 4, "n_ctx": 512},
        {"model": str(tiny_model), "model_alias": "bad", "sparq_coverage": 0.0, "n_ctx": 512},
    ]}
    path = tmp_path / "models.json"
    path.write_text(json.dumps(cfg))
    res = run([sys.executable, "-m", "llama_sparq.server", "--config_file", path, "--port", free_port()])
    assert res.returncode == 2, res.stderr[-2000:]
    assert "model bad: SparQ: coverage = 0 is out of range: allowed (0, 1]" in res.stderr, res.stderr[-2000:]


# -- more context than the slot holds --------------------------------------------------------

def test_request_longer_than_the_slot_is_an_error(tiny_model, tmp_path):
    """llama-server with SparQ, slots of 512 cells: a 700-token prompt is answered with an error
    that says so; the next request is served (with SparQ). Python: a prompt over n_ctx raises."""
    from llama_sparq import Llama

    with Server(tiny_model, ["-c", 1024, "-np", 2, "--sparq", "--sparq-k", 16, "--sparq-min-kv", 0],
                log_path=tmp_path / "s.log", start_timeout=120) as srv:
        long_prompt = [1] + [5 + (i % 200) for i in range(700)]
        with pytest.raises(ServerError, match=r"HTTP 400.*exceed.*context"):
            srv.post("/completion", {"prompt": long_prompt, "n_predict": 4})
        r = srv.post("/completion", {"prompt": long_prompt[:300], "n_predict": 8, "temperature": 0})
        assert r["tokens_predicted"] == 8
        assert srv.metrics()["sparq_calls_total"] > 0
    llm = Llama(str(tiny_model), n_ctx=256, verbose=False, sparq=True, sparq_k=16, sparq_min_kv=0)
    with pytest.raises(ValueError, match=r"exceed context window"):
        llm(long_prompt, max_tokens=4)


# -- a fuzz of GGUF headers ------------------------------------------------------------------

_FUZZ_DRIVER = textwrap.dedent("""
    # loads each file; a file that loads gets a context, SparQ and a few decode steps
    import sys
    from llama_sparq._llama import llama_cpp as lc
    from llama_sparq import _sparq
    lc.llama_backend_init()

    @lc.llama_log_callback
    def quiet(level, text, user_data):
        pass

    lc.llama_log_set(quiet, None)
    mp = lc.llama_model_default_params()
    for path in sys.argv[1:]:
        print("load", path, flush=True)
        m = lc.llama_model_load_from_file(path.encode(), mp)
        if not m:
            print("refused", flush=True)
            continue
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 256, 256, 256, 1, 1
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        ctx = lc.llama_init_from_model(m, cp)
        if not ctx:
            print("no_context", flush=True)
            lc.llama_model_free(m)
            continue
        try:
            _sparq.set_params(ctx, enabled=True, k=8, min_kv=0)
        except (ValueError, RuntimeError):
            pass
        n_vocab = max(1, lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(m)))
        toks = (lc.llama_token * 8)(*[t % n_vocab for t in (1, 5, 6, 7, 8, 9, 10, 11)])
        rc = lc.llama_decode(ctx, lc.llama_batch_get_one(toks, 8))
        one = (lc.llama_token * 1)(3 % n_vocab)
        for _ in range(3):
            rc = rc or lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1))
        print("loaded", rc, flush=True)
        lc.llama_free(ctx)
        lc.llama_model_free(m)
""")


def _mutants(src: Path, out: Path, n: int, seed: int) -> list[Path]:
    """n copies of src, each with its header (key-values and tensor table) mutated: bit flips,
    random bytes, 32- and 64-bit fields overwritten with extremes, or the file cut in it."""
    import gguf

    data = src.read_bytes()
    hdr_end = gguf.GGUFReader(str(src)).data_offset
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        b = bytearray(data)
        kind = rng.choice(["flip", "byte", "u64", "u32", "cut", "several"])
        if kind == "cut":
            b = b[:rng.randrange(0, hdr_end + 64)]
        else:
            for _ in range(1 if kind != "several" else rng.randint(2, 8)):
                pos = rng.randrange(0, hdr_end)
                if kind in ("flip", "several"):
                    b[pos] ^= 1 << rng.randrange(8)
                elif kind == "byte":
                    b[pos] = rng.randrange(256)
                elif kind == "u64":
                    b[pos:pos + 8] = struct.pack("<Q", rng.choice([0, 1, 2**63 - 1, 2**64 - 1, 2**32, rng.randrange(2**64)]))
                else:
                    b[pos:pos + 4] = struct.pack("<I", rng.choice([0, 1, 2**31 - 1, 2**32 - 1, 13, rng.randrange(2**32)]))
        p = out / f"m{i:04d}-{kind}.gguf"
        p.write_bytes(bytes(b))
        paths.append(p)
    return paths


def test_gguf_header_fuzz_never_crashes(tiny_model, tmp_path):
    """300 mutated headers of the tiny model (fixed seed): each is refused or loads and decodes
    with SparQ; the process never dies. Before patch 0013 a duplicated token string aborted in
    the vocabulary's assertion, and a negative RMS-norm epsilon aborted the first decode."""
    paths = _mutants(Path(tiny_model), tmp_path, 300, seed=2025)
    driver = tmp_path / "driver.py"
    driver.write_text(_FUZZ_DRIVER)
    res = subprocess.run([sys.executable, str(driver), *map(str, paths)], capture_output=True, text=True,
                         timeout=600, env=ENV)
    lines = res.stdout.splitlines()
    last = next((ln for ln in reversed(lines) if ln.startswith("load ")), None)
    assert res.returncode == 0, f"crashed ({res.returncode}) on {last}: {res.stderr[-1500:]}"
    outcomes = [ln.split()[0] for ln in lines if not ln.startswith("load ")]
    assert len(outcomes) == len(paths)
    # most mutations break the file; some hit bytes that do not matter (token texts, scores)
    assert outcomes.count("refused") > len(paths) // 2 and outcomes.count("loaded") > 0, outcomes


@pytest.mark.real_model
def test_vocab_only_load_is_not_checked_as_a_full_model(smollm2_model):
    """A vocab-only load leaves the hyperparameters unset (SmolLM2's GGUF has no rope.freq_base:
    a full load defaults it, a vocab-only one leaves 0): the load-time checks of patch 0013 skip
    it, so tokenizer-only use of a model file (the eval suite's prompt builder) still works."""
    from llama_sparq import Llama

    v = Llama(str(smollm2_model), vocab_only=True, verbose=False)
    assert v.tokenize(b"hello", add_bos=False)
