"""Tests for the models: the tiny random llama GGUF (sparq_lab.models) and the Gemma 3 recipe
(llama_sparq.models)."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

try:
    import llama_sparq.models as M
except ImportError:  # not installed and PYTHONPATH=py not given
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))
    import llama_sparq.models as M
import sparq_lab.models as LM  # dev/, on sys.path from conftest.py

gguf = pytest.importorskip("gguf")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fields(reader) -> dict:
    out = {}
    for k, f in reader.fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = f.contents()
    return out


# ---------------------------------------------------------------- tiny model

def test_deterministic(tmp_path):
    a = LM.make_tiny_llama(tmp_path / "a.gguf", seed=3)
    b = LM.make_tiny_llama(tmp_path / "b.gguf", seed=3)
    c = LM.make_tiny_llama(tmp_path / "c.gguf", seed=4)
    assert a == tmp_path / "a.gguf"
    assert sha256(a) == sha256(b)
    assert sha256(a) != sha256(c)
    assert not list(tmp_path.glob(".*.tmp"))  # temp files cleaned up


@pytest.mark.parametrize("weight_type", ["f16", "q8_0"])
def test_deterministic_other_types(tmp_path, weight_type):
    a = LM.make_tiny_llama(tmp_path / "a.gguf", weight_type=weight_type, n_head_kv=2)
    b = LM.make_tiny_llama(tmp_path / "b.gguf", weight_type=weight_type, n_head_kv=2)
    assert sha256(a) == sha256(b)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),                                              # MHA, defaults
        dict(n_head_kv=2),                                   # GQA
        dict(n_head_kv=1, n_layer=3, weight_type="f16"),     # MQA
        dict(n_head=4, n_head_kv=2, head_dim=32, weight_type="q8_0"),  # head_dim != n_embd/n_head
        dict(n_embd=96, n_head=6, n_head_kv=3, n_ff=160, n_vocab=300, n_ctx_train=512),
    ],
    ids=["mha", "gqa", "mqa-f16", "headdim-q8_0", "odd-sizes"],
)
def test_metadata_and_shapes(tmp_path, kw):
    p = LM.make_tiny_llama(tmp_path / "m.gguf", **kw)
    n_layer = kw.get("n_layer", 2)
    n_embd = kw.get("n_embd", 64)
    n_head = kw.get("n_head", 4)
    n_head_kv = kw.get("n_head_kv", n_head)
    head_dim = kw.get("head_dim", n_embd // n_head)
    n_ff = kw.get("n_ff", 128)
    n_vocab = kw.get("n_vocab", 260)
    wt = kw.get("weight_type", "f32")

    r = gguf.GGUFReader(p)
    f = fields(r)
    assert f["general.architecture"] == "llama"
    assert f["general.file_type"] == {"f32": 0, "f16": 1, "q8_0": 7}[wt]
    assert f["llama.context_length"] == kw.get("n_ctx_train", 4096)
    assert f["llama.embedding_length"] == n_embd
    assert f["llama.block_count"] == n_layer
    assert f["llama.feed_forward_length"] == n_ff
    assert f["llama.attention.head_count"] == n_head
    assert f["llama.attention.head_count_kv"] == n_head_kv
    assert f["llama.rope.dimension_count"] == head_dim
    assert f["llama.rope.freq_base"] == pytest.approx(10000.0)
    assert f["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    if head_dim * n_head != n_embd:
        assert f["llama.attention.key_length"] == head_dim
        assert f["llama.attention.value_length"] == head_dim
    else:
        assert "llama.attention.key_length" not in f
        assert "llama.attention.value_length" not in f

    # vocabulary: SPM with byte fallback
    assert f["tokenizer.ggml.model"] == "llama"
    toks = f["tokenizer.ggml.tokens"]
    ttypes = f["tokenizer.ggml.token_type"]
    assert len(toks) == len(ttypes) == len(f["tokenizer.ggml.scores"]) == n_vocab
    assert len(set(toks)) == n_vocab
    assert toks[:3] == ["<unk>", "<s>", "</s>"]
    assert toks[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert toks[259] == "\u2581"
    assert ttypes[:3] == [2, 3, 3]
    assert set(ttypes[3:259]) == {6}
    assert set(ttypes[259:]) <= {1}
    assert (f["tokenizer.ggml.unknown_token_id"], f["tokenizer.ggml.bos_token_id"],
            f["tokenizer.ggml.eos_token_id"]) == (0, 1, 2)
    assert f["tokenizer.ggml.add_bos_token"] is True

    # tensors: shapes in ggml ne order (what llama.cpp's loader checks)
    qt = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}[wt]
    expect = {
        "token_embd.weight": [n_embd, n_vocab],
        "output_norm.weight": [n_embd],
        "output.weight": [n_embd, n_vocab],
    }
    for i in range(n_layer):
        expect.update({
            f"blk.{i}.attn_norm.weight": [n_embd],
            f"blk.{i}.attn_q.weight": [n_embd, n_head * head_dim],
            f"blk.{i}.attn_k.weight": [n_embd, n_head_kv * head_dim],
            f"blk.{i}.attn_v.weight": [n_embd, n_head_kv * head_dim],
            f"blk.{i}.attn_output.weight": [n_head * head_dim, n_embd],
            f"blk.{i}.ffn_norm.weight": [n_embd],
            f"blk.{i}.ffn_gate.weight": [n_embd, n_ff],
            f"blk.{i}.ffn_up.weight": [n_embd, n_ff],
            f"blk.{i}.ffn_down.weight": [n_ff, n_embd],
        })
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(expect)
    for name, ne in expect.items():
        t = got[name]
        assert [int(x) for x in t.shape] == ne, name
        if len(ne) == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
            assert np.all(np.asarray(t.data) == 1.0), name
        else:
            assert t.tensor_type == qt, name
            w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(-1)
            assert np.all(np.isfinite(w)), name
            assert 0.01 < float(w.std()) < 0.04, name


def test_vocab_helper():
    toks, scores, ttypes = LM.tiny_vocab(2000)
    assert len(toks) == len(set(toks)) == len(scores) == len(ttypes) == 2000
    assert all(s < 0 for s in scores[259:])
    assert scores[259:] == sorted(scores[259:], reverse=True)


@pytest.mark.parametrize(
    "kw, arg",
    [
        (dict(n_head=4, n_head_kv=3), "n_head_kv"),
        (dict(n_head=4, n_head_kv=8), "n_head_kv"),
        (dict(n_head_kv=0), "n_head_kv"),
        (dict(n_layer=0), "n_layer"),
        (dict(n_layer=2.0), "n_layer"),
        (dict(n_embd=-1), "n_embd"),
        (dict(n_embd=66, n_head=4), "n_embd"),
        (dict(n_head=0), "n_head"),
        (dict(head_dim=15), "head_dim"),
        (dict(n_ff=0), "n_ff"),
        (dict(n_vocab=100), "n_vocab"),
        (dict(n_ctx_train=0), "n_ctx_train"),
        (dict(seed=-1), "seed"),
        (dict(weight_type="q4_0"), "weight_type"),
        (dict(weight_type="q8_0", n_ff=48), "n_ff"),
        (dict(std=0.0), "std"),
        (dict(std=float("nan")), "std"),
    ],
)
def test_bad_arguments(tmp_path, kw, arg):
    out = tmp_path / "bad.gguf"
    with pytest.raises(ValueError, match=arg):
        LM.make_tiny_llama(out, **kw)
    assert not out.exists()
    assert not list(tmp_path.iterdir())


def test_cli_tiny(tmp_path, capsys):
    out = tmp_path / "sub" / "cli.gguf"
    assert LM.main(["tiny", str(out), "--n-layer", "3", "--n-head-kv", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    f = fields(gguf.GGUFReader(out))
    assert f["llama.block_count"] == 3
    assert f["llama.attention.head_count_kv"] == 2
    # same bytes as the Python API with the same arguments
    ref = LM.make_tiny_llama(tmp_path / "ref.gguf", n_layer=3, n_head_kv=2)
    assert sha256(out) == sha256(ref)

    assert LM.main(["tiny", str(tmp_path / "x.gguf"), "--n-head-kv", "3"]) == 2
    assert "n_head_kv" in capsys.readouterr().err


# ---------------------------------------------------------------- Gemma 3 recipe

def test_model_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMA_SPARQ_MODEL_DIR", str(tmp_path / "models"))
    assert M.model_dir() == tmp_path / "models"
    monkeypatch.delenv("LLAMA_SPARQ_MODEL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.model_dir() == tmp_path / "xdg" / "llama-sparq"


def test_gemma3_missing_package_no_install(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMA_SPARQ_MODEL_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, M.GEMMA3_MODULE, None)  # makes the import fail
    with pytest.raises(RuntimeError, match=M.GEMMA3_PACKAGE):
        M.default_model_path(install=False)
    assert M.main(["gemma3", "--no-install"]) == 2


def test_gemma3_assembles_once_with_fake_package(monkeypatch, tmp_path):
    """The caching logic, against a stand-in for the chunk package."""
    chunks = []
    for i, data in enumerate([b"GGUF" + b"a" * 60, b"b" * 64, b"c" * 10]):
        c = tmp_path / f"part{i}"
        c.write_bytes(data)
        chunks.append(c)
    calls = []

    def assemble(output_path=None, overwrite=False):
        calls.append(output_path)
        Path(output_path).write_bytes(b"".join(c.read_bytes() for c in chunks))
        return Path(output_path)

    fake = types.SimpleNamespace(
        MODEL_NAME="fake.gguf", chunk_paths=lambda: list(chunks),
        verify_chunks=lambda: None, assemble=assemble)
    monkeypatch.setitem(sys.modules, M.GEMMA3_MODULE, fake)
    monkeypatch.setenv("LLAMA_SPARQ_MODEL_DIR", str(tmp_path / "cache"))

    p = M.default_model_path(install=False)
    assert p == tmp_path / "cache" / "fake.gguf"
    assert p.stat().st_size == 138 and p.read_bytes()[:4] == b"GGUF"
    assert len(calls) == 1
    assert M.default_model_path(install=False) == p
    assert len(calls) == 1  # cached: not re-assembled
    p.write_bytes(b"GGUF")  # truncated -> re-assembled
    assert M.default_model_path(install=False) == p
    assert len(calls) == 2 and p.stat().st_size == 138
    assert sorted(x.name for x in p.parent.iterdir()) == ["fake.gguf"]


@pytest.mark.real_model
def test_gemma3_real():
    pytest.importorskip(M.GEMMA3_MODULE, reason=f"pip install {M.GEMMA3_PACKAGE}")
    p = M.default_model_path(install=False)
    assert p.is_file() and p.name == M.GEMMA3_FILE_NAME
    assert p.stat().st_size == M.GEMMA3_SIZE
    # GGUFReader parses all 262k tokens (slow); read just the header and first KV
    import struct
    with p.open("rb") as fh:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", fh.read(24))
        (klen,) = struct.unpack("<Q", fh.read(8))
        key = fh.read(klen).decode()
        (vtype,) = struct.unpack("<I", fh.read(4))
        (vlen,) = struct.unpack("<Q", fh.read(8))
        value = fh.read(vlen).decode()
    assert magic == b"GGUF" and version == 3 and n_tensors > 0 and n_kv > 0
    assert (key, vtype, value) == ("general.architecture", 8, "gemma3")


def _cached_synthetic_model(path_of, stem, tmp_path, monkeypatch):
    """Writes the 1-layer model once into the model folder, checks it is reused and that the layer
    count is checked; returns its single-valued GGUF fields and its tensors by name."""
    import gguf

    monkeypatch.setenv("LLAMA_SPARQ_MODEL_DIR", str(tmp_path))
    path = path_of(1)
    assert path == tmp_path / f"{stem}-1l.gguf"
    mtime = path.stat().st_mtime_ns
    assert path_of(1) == path and path.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match="n_layer"):
        path_of(0)
    r = gguf.GGUFReader(str(path))
    f = {k: int(v.parts[v.data[0]][0]) for k, v in r.fields.items() if len(v.data) == 1 and k.startswith("llama.")}
    return f, {x.name: x for x in r.tensors}


def test_paper_shape_model_has_llama2_7b_layer_shapes(tmp_path, monkeypatch):
    """The synthetic model for the paper's measurements: Llama 2 7B per-layer shapes, Q8_0,
    written once into the model folder and reused."""
    import gguf

    from sparq_lab.models import paper_shape_path

    f, t = _cached_synthetic_model(paper_shape_path, "paper-shape", tmp_path, monkeypatch)
    assert f["llama.embedding_length"] == 4096
    assert f["llama.attention.head_count"] == 32 and f["llama.attention.head_count_kv"] == 32
    assert f["llama.feed_forward_length"] == 11008 and f["llama.block_count"] == 1
    assert t["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert list(t["blk.0.ffn_up.weight"].shape) == [4096, 11008]
    assert list(t["token_embd.weight"].shape) == [4096, 32000]


def test_gqa_shape_model_has_llama3_8b_layer_shapes(tmp_path, monkeypatch):
    """The synthetic model for the long-context sweep: Llama 3 8B per-layer shapes (GQA 32/8),
    Q8_0, a training context of 2M tokens, written once into the model folder and reused."""
    import gguf

    from sparq_lab.models import gqa_shape_path

    f, t = _cached_synthetic_model(gqa_shape_path, "gqa-shape", tmp_path, monkeypatch)
    assert f["llama.embedding_length"] == 4096 and f["llama.context_length"] == 1 << 21
    assert f["llama.attention.head_count"] == 32 and f["llama.attention.head_count_kv"] == 8
    assert f["llama.feed_forward_length"] == 14336 and f["llama.block_count"] == 1
    assert t["blk.0.attn_k.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert list(t["blk.0.attn_k.weight"].shape) == [4096, 1024]
    assert list(t["token_embd.weight"].shape) == [4096, 32000]
