"""bench/coverage.py: the attention mass of the top-k cells and SparQ's recall, computed right
(against a softmax done here) and written out complete (on the tiny model, a few decode steps)."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def load_coverage():
    spec = importlib.util.spec_from_file_location("coverage_bench", REPO / "bench" / "coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_call_metrics_against_a_plain_softmax():
    cov = load_coverage()
    rng = np.random.default_rng(5)
    S, hkv, g, d = 300, 2, 3, 16
    q = rng.normal(size=(1, hkv * g, d)) * 2.0
    K = rng.normal(size=(S, hkv, d))
    V = rng.normal(size=(S, hkv, d))
    mask = np.zeros((1, S))
    mask[0, 250:] = -np.inf                     # 250 valid cells
    scale = 0.3
    x = dict(q=q, K=K, V=V, mask=mask, comp_w=None)
    ks = [1, 10, 100, 250, 400]
    recs = cov.call_metrics(x, scale, ks=ks, fracs=[0.1], rs=[4, 16], recall_ks=[20, 300], basis="scaled")
    assert len(recs) == hkv
    for j, rec in enumerate(recs):
        assert rec["S"] == 250
        logits = np.einsum("hd,sd->hs", q[0, j * g:(j + 1) * g], K[:250, j]) * scale
        P = np.exp(logits - logits.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)                                   # (g, 250)
        own = np.cumsum(-np.sort(-P, axis=-1), axis=-1).mean(0)         # each head's own best cells
        shared_order = np.argsort(-P.sum(0), kind="stable")
        shared = np.cumsum(P[:, shared_order], axis=-1)                 # (g, 250)
        for k in ks:
            kk = min(k, 250)
            assert np.isclose(rec[f"cov_head_k{k}"], own[kk - 1], atol=1e-9)
            assert np.isclose(rec[f"cov_group_k{k}"], shared[:, kk - 1].mean(), atol=1e-9)
            assert np.isclose(rec[f"covmin_group_k{k}"], shared[:, kk - 1].min(), atol=1e-9)
        assert rec["cov_group_k250"] == rec["cov_group_k400"] and abs(rec["cov_group_k400"] - 1) < 1e-9
        assert rec["cov_head_k1"] >= rec["cov_group_k1"]                  # own choice is the best per head
        for lv in (90, 95, 99):
            want = int(np.argmax(shared.mean(0) >= lv / 100)) + 1
            assert rec[f"k{lv}_group"] == want
            assert rec[f"k{lv}_head"] <= rec[f"k{lv}_group"] <= rec[f"k{lv}_groupall"] <= 250
        assert rec["k90_group"] <= rec["k95_group"] <= rec["k99_group"]
        for r in (4, 16):
            assert 0 <= rec[f"overlap_k20_r{r}"] <= 1
            assert 0 < rec[f"massratio_k20_r{r}"] <= 1 + 1e-9               # the exact top-k holds the most
            assert 0 < rec[f"sparqmass_k20_r{r}"] <= 1 + 1e-9
            assert np.isnan(rec[f"overlap_k300_r{r}"])                      # k >= S: the op runs dense
    # the bucketed top-k: with a bucket per cell (64 x 20 buckets > 300 cells) it is the exact top-k
    bk = cov.call_metrics(x, scale, ks=[8], fracs=[], rs=[4], recall_ks=[20], basis="scaled", buckets=[1, 64])
    for rec in bk:
        for m in ("overlap", "massratio", "sparqmass"):
            assert rec[f"{m}b64_k20_r4"] == rec[f"{m}_k20_r4"]
            assert 0 < rec[f"{m}b1_k20_r4"] <= 1 + 1e-9
    # r = d: the approximate scores are the exact ones, so the top-k is found exactly
    full = cov.call_metrics(x, scale, ks=[8], fracs=[], rs=[16], recall_ks=[20], basis="model")
    assert all(r["overlap_k20_r16"] == 1.0 and abs(r["massratio_k20_r16"] - 1) < 1e-12 for r in full)
    assert cov.parse_rs("4,d/8,d/4,d/2,d,999", 64) == [4, 8, 16, 32, 64]


def test_coverage_script_on_the_tiny_model(tiny_gqa_model, tmp_path):
    ks = [4, 16, 64, 4096]
    p = subprocess.run([sys.executable, str(REPO / "bench" / "coverage.py"), "--model", str(tiny_gqa_model),
                        "--lengths", "120", "--samples", "2", "--steps", "2", "--ks", ",".join(map(str, ks)),
                        "--fracs", "0.1", "--rs", "2,d/2", "--recall-ks", "8", "--kt-formats", "e5m2,int8", "--buckets", "2",
                        "--tag", "t", "--out-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for ext in ("csv", "json", "md", "png"):
        assert (tmp_path / f"t.{ext}").stat().st_size > 0, ext
    res = json.loads((tmp_path / "t.json").read_text())
    meta = res["meta"]
    for key in ("command", "machine", "commit", "sparq", "counters"):
        assert meta[key], key
    assert "threads" in meta["machine"] and "n_sparq=" in meta["counters"] and "n_sparq=0," not in meta["counters"]
    assert meta["sparq_layers"] == [0, 1] and meta["d"] == 16 and meta["rs"] == [2, 8]
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    # 2 prompts x 2 steps x 2 layers x 2 KV heads
    assert len(rows) == 16
    for r in rows:
        S = int(r["S"])
        cov = [float(r[f"cov_group_k{k}"]) for k in ks]
        assert all(a <= b + 1e-9 for a, b in zip(cov, cov[1:])), cov          # monotone in k
        assert abs(float(r["cov_group_k4096"]) - 1) < 1e-4 and abs(float(r["cov_head_k4096"]) - 1) < 1e-4
        assert 4096 >= S > 64
        assert int(r["k90_group"]) <= int(r["k95_group"]) <= int(r["k99_group"]) <= S
        assert 0 <= float(r["overlap_k8_r2"]) <= 1
        for fmt in ("e5m2", "int8"):  # K^T in 8 bits: a recall of its own, from the same captured steps
            assert 0 <= float(r[f"overlap{fmt}_k8_r2"]) <= 1 and 0 < float(r[f"massratio{fmt}_k8_r8"]) <= 1 + 1e-9
    assert {len(L["curve_group"]) for L in res["by_layer"]} == {len(res["plot_ks"])}
    md = (tmp_path / "t.md").read_text()
    assert "k90 shared: median / worst" in md and "## Recall" in md and "overlap e5m2" in md and "overlap b2" in md
    assert all(0 <= float(r["overlapb2_k8_r2"]) <= 1 for r in rows)


def test_kt_formats_round_as_8_bit_floats_and_blocks():
    """The 8-bit K^T formats of the coverage study: e5m2 is f16's upper byte (round half to even),
    e4m3 saturates at 448, int8 blocks keep each block's largest value exactly."""
    cov = load_coverage()

    x = np.array([1.0, 1.1, 1.2, 1.125, 1.375, -3.3, 6e4, 2.0 ** -20])
    e5 = cov.KT_FORMATS["e5m2"](x)
    np.testing.assert_array_equal(e5[:6], [1.0, 1.0, 1.25, 1.0, 1.5, -3.5])
    assert e5[6] == 57344.0 and e5[7] == 0.0
    # e5m2 is exactly f16 with its lower byte rounded away
    h = x[:6].astype(np.float16).view(np.uint16).astype(np.uint32)
    top = ((h + 0x7F + ((h >> 8) & 1)) & 0xFF00).astype(np.uint16).view(np.float16).astype(np.float64)
    np.testing.assert_array_equal(e5[:6], top)
    e4 = cov.KT_FORMATS["e4m3"](np.array([1.0625, 1.1, 500.0, -500.0, 2.0 ** -9, 2.0 ** -11]))
    np.testing.assert_array_equal(e4, [1.0, 1.125, 448.0, -448.0, 2.0 ** -9, 0.0])
    K = np.random.default_rng(0).standard_normal((70, 2, 8))
    q = cov.KT_FORMATS["int8"](K)
    assert q.shape == K.shape
    blocks = np.abs(K[:64].reshape(2, 32, 2, 8)).max(axis=1)
    np.testing.assert_allclose(np.abs(q[:64].reshape(2, 32, 2, 8)).max(axis=1), blocks, rtol=1e-3)
    assert np.abs(q - K).max() <= np.abs(K).max() / 127 * 0.51 + 1e-3
    # int8 per cell: each key's largest component kept (to its f16 scale), every value within half a step
    c = cov.KT_FORMATS["int8cell"](K)
    assert c.shape == K.shape
    np.testing.assert_allclose(np.abs(c).max(axis=-1), np.abs(K).max(axis=-1), rtol=1e-3)
    step = np.abs(K).max(axis=-1, keepdims=True) / 127
    assert (np.abs(c - K) <= step * 0.51 + 1e-3).all()
