"""Tests of the NumPy SparQ reference and of the cost model (fast, NumPy only)."""

import time

import numpy as np
import pytest

from sparq_lab import cost
from sparq_lab.reference import (
    combined_scores,
    dense_attention,
    selection_matches,
    sparq_attention,
)

LN = np.log
NEG = -np.inf


def rand_inputs(rng, n_rows, n_head, n_head_kv, S, d, dv=None, dtype=np.float64):
    dv = d if dv is None else dv
    q = rng.standard_normal((n_rows, n_head, d)).astype(dtype)
    K = rng.standard_normal((S, n_head_kv, d)).astype(dtype)
    V = rng.standard_normal((S, n_head_kv, dv)).astype(dtype)
    return q, K, V


def dense_probs(q, K, mask=None, scale=None):
    """Exact softmax(q.K^T*scale + mask), (n_rows, n_head, S), written out plainly."""
    n_rows, n_head, d = q.shape
    g = n_head // K.shape[1]
    scale = 1 / np.sqrt(d) if scale is None else scale
    p = np.zeros((n_rows, n_head, K.shape[0]))
    for i in range(n_rows):
        for h in range(n_head):
            x = K[:, h // g, :] @ q[i, h] * scale
            if mask is not None:
                x = x + mask[i]
            e = np.exp(x - x.max())
            p[i, h] = e / e.sum()
    return p


# --------------------------------------------------------------------------------------
# hand-worked cases
# --------------------------------------------------------------------------------------

# Case A: d = 4 (scale = 1/2), S = 3, one head, dv = 2.
#   q = [1, 1, 1, 1]: sum|q| ties everywhere, so r = 1 picks the lowest index: i1 = [0].
#   ||q||_1 = 4, ||q[i1]||_1 = 1: factor = scale * sqrt(4/1) = 1/2 * 2 = 1,
#   so the approximate logits are K[:, 0] = [0, ln2, ln5] -> exp = [1, 2, 5]
#   -> shat = [1/8, 2/8, 5/8].
#   Dense logits 1/2 * (q . K_i) = 1/2 * rowsum(K_i) = [0, 0, ln3].
#   V = [[8, 0], [0, 8], [16, 16]] -> vbar = [8, 8].
CASE_A_Q = np.array([[[1.0, 1.0, 1.0, 1.0]]])
CASE_A_K = np.array([
    [0.0, 0.0, 0.0, 0.0],
    [LN(2), -LN(2), 0.0, 0.0],
    [LN(5), 2 * LN(3) - LN(5), 0.0, 0.0],
])[:, None, :]
CASE_A_V = np.array([[8.0, 0.0], [0.0, 8.0], [16.0, 16.0]])[:, None, :]


def test_hand_case_a_k1():
    # k = 1: i2 = [2] (score 5/8), alpha = 5/8, y = V[2] = [16, 16];
    # out = 5/8 * 16 + 3/8 * 8 = 10 + 3 = 13.
    out, info = sparq_attention(CASE_A_Q, CASE_A_K, CASE_A_V, r=1, k=1, return_info=True)
    np.testing.assert_array_equal(info["i1"], [[[0]]])
    np.testing.assert_array_equal(info["i2"][0][0], [2])
    np.testing.assert_allclose(info["alpha"], [[5 / 8]], rtol=1e-14)
    np.testing.assert_array_equal(info["dense_rows"], [False])
    np.testing.assert_allclose(out, [[[13.0, 13.0]]], rtol=1e-14)


def test_hand_case_a_k2():
    # k = 2: i2 = [1, 2] (scores 2/8, 5/8), alpha = 7/8.
    # Dense logits on i2: [0, ln3] -> weights [1/4, 3/4];
    # y = 1/4 * [0, 8] + 3/4 * [16, 16] = [12, 14];
    # out = 7/8 * [12, 14] + 1/8 * [8, 8] = [11.5, 13.25].
    out, info = sparq_attention(CASE_A_Q, CASE_A_K, CASE_A_V, r=1, k=2, return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], [1, 2])
    np.testing.assert_allclose(info["alpha"], [[7 / 8]], rtol=1e-14)
    np.testing.assert_allclose(out, [[[11.5, 13.25]]], rtol=1e-14)


def test_hand_case_a_r2_components():
    # r = 2 with all |q| tied: the two lowest indices, i1 = [0, 1].
    _, info = sparq_attention(CASE_A_Q, CASE_A_K, CASE_A_V, r=2, k=1, return_info=True)
    np.testing.assert_array_equal(info["i1"], [[[0, 1]]])


def test_hand_case_a_masked_cell():
    # Cell 2 masked, k = 1: 2 valid cells > k, so SparQ runs over cells {0, 1}.
    # shat over valid cells: exp [1, 2] -> [1/3, 2/3]; i2 = [1], alpha = 2/3.
    # vbar = mean(V0, V1) = [4, 4]; y = V[1] = [0, 8];
    # out = 2/3 * [0, 8] + 1/3 * [4, 4] = [4/3, 20/3].
    mask = np.array([[0.0, 0.0, NEG]])
    out, info = sparq_attention(CASE_A_Q, CASE_A_K, CASE_A_V, r=1, k=1, mask=mask,
                                return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], [1])
    np.testing.assert_allclose(info["alpha"], [[2 / 3]], rtol=1e-14)
    np.testing.assert_allclose(out, [[[4 / 3, 20 / 3]]], rtol=1e-14)


def test_hand_case_window_lowest_score():
    # Case A with the cells reversed: shat = [5/8, 2/8, 1/8].
    # k = 2, l = 1: the window {2} is kept although its score is the lowest; the one
    # free slot goes to cell 0 (5/8). i2 = [0, 2], alpha = 5/8 + 1/8 = 3/4.
    # Dense logits on i2: [ln3, 0] -> weights [3/4, 1/4];
    # y = 3/4 * [16, 16] + 1/4 * [8, 0] = [14, 12]; vbar = [8, 8];
    # out = 3/4 * [14, 12] + 1/4 * [8, 8] = [12.5, 11].
    K = CASE_A_K[::-1].copy()
    V = CASE_A_V[::-1].copy()
    out, info = sparq_attention(CASE_A_Q, K, V, r=1, k=2, l=1, return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], [0, 2])
    np.testing.assert_allclose(info["alpha"], [[3 / 4]], rtol=1e-14)
    np.testing.assert_allclose(out, [[[12.5, 11.0]]], rtol=1e-14)
    # Without the window the two best cells are taken: i2 = [0, 1], alpha = 7/8.
    _, info = sparq_attention(CASE_A_Q, K, V, r=1, k=2, l=0, return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], [0, 1])
    np.testing.assert_allclose(info["alpha"], [[7 / 8]], rtol=1e-14)


# Case E (GQA): d = 4 (scale = 1/2), S = 3, n_head = 2, n_head_kv = 1, dv = 2, r = 2.
#   q0 = [0, 0, 6, 6], q1 = [3, 3, 1, -1]: sum|q| = [3, 3, 7, 7] -> i1 = [2, 3].
#   head 0: ||q0||_1 = 12 = ||q0[i1]||_1 -> factor = 1/2;
#   head 1: ||q1||_1 = 8, ||q1[i1]||_1 = 2 -> factor = 1/2 * sqrt(4) = 1.
#   K columns: c0 = [ln(1.5)/3, 0, 0], c1 = 0, c2 = a = [ln6/2, 0, ln2/6],
#   c3 = b = [-ln6/2, 0, ln2/6].
#   approx head 0: 1/2 * 6 * (a + b) = [0, 0, ln2] -> shat0 = [1/4, 1/4, 1/2]
#   approx head 1: 1 * (a - b)       = [ln6, 0, 0] -> shat1 = [3/4, 1/8, 1/8]
#   combined = [1, 3/8, 5/8].
#   dense head 0: 1/2 * 6 * (a + b)            = [0, 0, ln2]
#   dense head 1: 1/2 * (3 c0 + a - b)         = [1/2 (ln1.5 + ln6), 0, 0] = [ln3, 0, 0]
#   V = [[4, 0], [0, 4], [8, 8]] -> vbar = [4, 4].
CASE_E_Q = np.array([[[0.0, 0.0, 6.0, 6.0], [3.0, 3.0, 1.0, -1.0]]])
CASE_E_K = np.array([
    [LN(1.5) / 3, 0.0, LN(6) / 2, -LN(6) / 2],
    [0.0, 0.0, 0.0, 0.0],
    [0.0, 0.0, LN(2) / 6, LN(2) / 6],
])[:, None, :]
CASE_E_V = np.array([[4.0, 0.0], [0.0, 4.0], [8.0, 8.0]])[:, None, :]


def test_hand_case_gqa_k1():
    # k = 1: i2 = [0]; alpha = [1/4, 3/4]; y = V[0] = [4, 0] for both heads.
    # out0 = 1/4 * [4, 0] + 3/4 * [4, 4] = [4, 3]
    # out1 = 3/4 * [4, 0] + 1/4 * [4, 4] = [4, 1]
    out, info = sparq_attention(CASE_E_Q, CASE_E_K, CASE_E_V, r=2, k=1, return_info=True)
    np.testing.assert_array_equal(info["i1"], [[[2, 3]]])
    np.testing.assert_array_equal(info["i2"][0][0], [0])
    np.testing.assert_allclose(info["alpha"], [[1 / 4, 3 / 4]], rtol=1e-14)
    np.testing.assert_allclose(out, [[[4.0, 3.0], [4.0, 1.0]]], rtol=1e-14, atol=1e-14)
    cs = combined_scores(CASE_E_Q, CASE_E_K, r=2)
    np.testing.assert_allclose(cs, [[[1.0, 3 / 8, 5 / 8]]], rtol=1e-14)


def test_hand_case_gqa_k2():
    # k = 2: i2 = [0, 2]; alpha0 = 1/4 + 1/2 = 3/4, alpha1 = 3/4 + 1/8 = 7/8.
    # head 0: logits [0, ln2] -> [1/3, 2/3]; y0 = 1/3 [4, 0] + 2/3 [8, 8] = [20/3, 16/3]
    #         out0 = 3/4 * y0 + 1/4 * [4, 4] = [6, 5]
    # head 1: logits [ln3, 0] -> [3/4, 1/4]; y1 = 3/4 [4, 0] + 1/4 [8, 8] = [5, 2]
    #         out1 = 7/8 * [5, 2] + 1/8 * [4, 4] = [39/8, 18/8]
    out, info = sparq_attention(CASE_E_Q, CASE_E_K, CASE_E_V, r=2, k=2, return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], [0, 2])
    np.testing.assert_allclose(info["alpha"], [[3 / 4, 7 / 8]], rtol=1e-14)
    np.testing.assert_allclose(out, [[[6.0, 5.0], [39 / 8, 18 / 8]]], rtol=1e-14)


def test_hand_case_gqa_dense_when_k_ge_S():
    out, info = sparq_attention(CASE_E_Q, CASE_E_K, CASE_E_V, r=2, k=3, return_info=True)
    np.testing.assert_array_equal(info["dense_rows"], [True])
    np.testing.assert_array_equal(info["alpha"], [[1.0, 1.0]])
    np.testing.assert_array_equal(info["i2"][0][0], [0, 1, 2])
    np.testing.assert_allclose(out, dense_attention(CASE_E_Q, CASE_E_K, CASE_E_V),
                               rtol=1e-14)


# --------------------------------------------------------------------------------------
# random cases
# --------------------------------------------------------------------------------------

HEADS = [(4, 4), (8, 2), (6, 3), (4, 1)]  # (n_head, n_head_kv): MHA, GQA, MQA


@pytest.mark.parametrize("n_head,n_head_kv", HEADS)
@pytest.mark.parametrize("k", [50, 80])
def test_r_eq_d_k_ge_S_is_dense(n_head, n_head_kv, k):
    rng = np.random.default_rng(1)
    q, K, V = rand_inputs(rng, 3, n_head, n_head_kv, S=50, d=16, dv=12)
    out, info = sparq_attention(q, K, V, r=16, k=k, l=4, return_info=True)
    assert info["dense_rows"].all()
    np.testing.assert_allclose(out, dense_attention(q, K, V), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n_head,n_head_kv", HEADS)
def test_r_eq_d_scores_are_exact_probabilities(n_head, n_head_kv):
    # With r = d the temperature is exactly the dense scale: shat_h = the dense softmax.
    rng = np.random.default_rng(2)
    q, K, V = rand_inputs(rng, 2, n_head, n_head_kv, S=40, d=8)
    mask = np.zeros((2, 40))
    mask[1, 30:] = NEG
    p = dense_probs(q, K, mask)
    g = n_head // n_head_kv
    expect = p.reshape(2, n_head_kv, g, 40).sum(axis=2)
    np.testing.assert_allclose(combined_scores(q, K, r=8, mask=mask), expect,
                               rtol=1e-12, atol=1e-15)
    # ... and alpha is the exact probability mass on the selected cells.
    _, info = sparq_attention(q, K, V, r=8, k=10, mask=mask, return_info=True)
    for row in range(2):
        for h in range(n_head):
            sel = info["i2"][row][h // g]
            np.testing.assert_allclose(info["alpha"][row, h], p[row, h, sel].sum(),
                                       rtol=1e-12)


@pytest.mark.parametrize("n_head,n_head_kv", HEADS)
def test_mask_holes_are_honoured(n_head, n_head_kv):
    rng = np.random.default_rng(3)
    n_rows, S, d = 3, 64, 16
    q, K, V = rand_inputs(rng, n_rows, n_head, n_head_kv, S, d)
    mask = np.where(rng.random((n_rows, S)) < 0.4, NEG, 0.0)
    mask[:, -1] = NEG  # the most recent cell is a hole too: the window must skip it
    out, info = sparq_attention(q, K, V, r=4, k=12, l=3, mask=mask, return_info=True)
    for row in range(n_rows):
        valid = np.flatnonzero(np.isfinite(mask[row]))
        for j in range(n_head_kv):
            sel = info["i2"][row][j]
            assert np.isfinite(mask[row, sel]).all()
            assert set(valid[-3:]) <= set(sel.tolist())  # window of valid cells
            assert len(sel) == 12
    # Changing K and V at cells masked in every row changes nothing (vbar is over the
    # valid cells only).
    K2, V2 = K.copy(), V.copy()
    masked_everywhere = ~np.isfinite(mask).any(axis=0)
    assert masked_everywhere.sum() >= 1
    K2[masked_everywhere] = 1e3
    V2[masked_everywhere] = -1e3
    out2 = sparq_attention(q, K2, V2, r=4, k=12, l=3, mask=mask)
    np.testing.assert_array_equal(out, out2)
    # Per row, changing V at that row's masked cells leaves that row unchanged.
    for row in range(n_rows):
        V3 = V.copy()
        V3[~np.isfinite(mask[row])] = 7.0
        out3 = sparq_attention(q, K, V3, r=4, k=12, l=3, mask=mask)
        np.testing.assert_array_equal(out3[row], out[row])
    # Default vbar = per-row mean of V over the row's valid cells.
    vb = np.stack([V[np.isfinite(mask[row])].mean(axis=0) for row in range(n_rows)])
    out4 = sparq_attention(q, K, V, r=4, k=12, l=3, mask=mask, vbar=vb)
    np.testing.assert_allclose(out4, out, rtol=1e-13, atol=1e-14)


def test_window_always_selected_even_with_lowest_scores():
    rng = np.random.default_rng(4)
    S, d, l, k = 40, 16, 4, 8
    q, K, V = rand_inputs(rng, 1, 2, 1, S, d)
    # Make the l most recent keys point against both queries: lowest scores of all.
    K[-l:, 0, :] = -10.0 * np.sign(q[0].sum(axis=0))
    scores = combined_scores(q, K, r=4)[0, 0]
    assert scores[-l:].max() < np.sort(scores[:-l])[0]
    _, info = sparq_attention(q, K, V, r=4, k=k, l=l, return_info=True)
    sel = info["i2"][0][0]
    assert set(range(S - l, S)) <= set(sel.tolist())
    # The other k - l are the top scores of the non-window cells.
    expect = np.sort(np.argsort(-scores[:-l], kind="stable")[: k - l])
    np.testing.assert_array_equal(sel[: k - l], expect)
    # l = k: the selection is exactly the window.
    _, info = sparq_attention(q, K, V, r=4, k=k, l=k, return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], np.arange(S - k, S))


def test_position_ties_go_to_lower_index():
    # All keys equal: every score ties; the lowest free indices win, plus the window.
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 8))
    K = np.zeros((20, 1, 8))
    V = rng.standard_normal((20, 1, 8))
    _, info = sparq_attention(q, K, V, r=2, k=5, l=2, return_info=True)
    np.testing.assert_array_equal(info["i2"][0][0], [0, 1, 2, 18, 19])


def test_component_ties_go_to_lower_index():
    # d = 64: |q| = 2 at every 5th component (13 of them), 1 elsewhere. r = 20 takes the
    # 13 large ones, then the 7 lowest indices among the tied rest.
    q = np.ones((1, 1, 64))
    q[0, 0, ::5] = -2.0
    K = np.zeros((3, 1, 64))
    V = np.zeros((3, 1, 4))
    _, info = sparq_attention(q, K, V, r=20, k=1, return_info=True)
    expect = sorted(set(range(0, 64, 5)) | {1, 2, 3, 4, 6, 7, 8})
    np.testing.assert_array_equal(info["i1"][0, 0], expect)


def test_n_valid_le_k_is_exact_dense():
    rng = np.random.default_rng(6)
    n_rows, S = 4, 30
    q, K, V = rand_inputs(rng, n_rows, 8, 2, S, d=16)
    mask = np.full((n_rows, S), NEG)
    mask[0, [2, 7, 11]] = 0.0  # 3 valid cells <= k
    mask[1, :5] = 0.0  # exactly k valid cells
    mask[2, :] = 0.0  # SparQ row
    # row 3: no valid cell at all -> zeros
    out, info = sparq_attention(q, K, V, r=4, k=5, l=2, mask=mask, return_info=True)
    np.testing.assert_array_equal(info["dense_rows"], [True, True, False, True])
    np.testing.assert_array_equal(info["alpha"][[0, 1, 3]], 1.0)
    np.testing.assert_array_equal(info["i2"][0][1], [2, 7, 11])
    np.testing.assert_array_equal(info["i2"][3][0], np.zeros(0, int))
    dense = dense_attention(q, K, V, mask=mask)
    np.testing.assert_allclose(out[:2], dense[:2], rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(out[3], 0.0)
    np.testing.assert_array_equal(dense[3], 0.0)


@pytest.mark.parametrize("n_head,n_head_kv", HEADS)
def test_multi_row_equals_single_rows(n_head, n_head_kv):
    rng = np.random.default_rng(7)
    n_rows, S, d = 4, 48, 16
    q, K, V = rand_inputs(rng, n_rows, n_head, n_head_kv, S, d, dv=8)
    mask = np.zeros((n_rows, S))
    mask[0, 20:] = NEG  # shorter sequence
    mask[1, ::3] = NEG  # interleaved sequences
    mask[2, :10] = NEG
    vbar_rows = rng.standard_normal((n_rows, n_head_kv, 8))
    for vb in (None, vbar_rows):
        out, info = sparq_attention(q, K, V, r=3, k=9, l=2, mask=mask, vbar=vb,
                                    return_info=True)
        assert info["i1"].shape == (n_rows, n_head_kv, 3)
        assert info["alpha"].shape == (n_rows, n_head)
        for row in range(n_rows):
            o1, i1 = sparq_attention(q[row:row + 1], K, V, r=3, k=9, l=2,
                                     mask=mask[row:row + 1],
                                     vbar=None if vb is None else vb[row],
                                     return_info=True)
            np.testing.assert_allclose(out[row], o1[0], rtol=1e-14, atol=1e-15)
            np.testing.assert_array_equal(info["i1"][row], i1["i1"][0])
            for j in range(n_head_kv):
                np.testing.assert_array_equal(info["i2"][row][j], i1["i2"][0][j])


def test_custom_scale_and_shared_vbar():
    # scale enters both the dense logits and the approximate ones; r = d, k >= S: dense.
    rng = np.random.default_rng(8)
    q, K, V = rand_inputs(rng, 2, 4, 2, 20, 8)
    np.testing.assert_allclose(
        sparq_attention(q, K, V, r=8, k=20, scale=0.3),
        dense_attention(q, K, V, scale=0.3), rtol=1e-13)
    vb = rng.standard_normal((2, 8))
    out, info = sparq_attention(q, K, V, r=2, k=4, vbar=vb, scale=0.3, return_info=True)
    # Recompute out from info by hand: out_h = alpha_h y_h + (1 - alpha_h) vbar.
    for row in range(2):
        for h in range(4):
            sel = info["i2"][row][h // 2]
            x = K[sel, h // 2] @ q[row, h] * 0.3
            p = np.exp(x - x.max())
            y = (p / p.sum()) @ V[sel, h // 2]
            a = info["alpha"][row, h]
            np.testing.assert_allclose(out[row, h], a * y + (1 - a) * vb[h // 2],
                                       rtol=1e-13)


def test_float32_naive_close_to_float64():
    rng = np.random.default_rng(9)
    q, K, V = rand_inputs(rng, 3, 8, 2, 300, 32, dtype=np.float32)
    mask = np.zeros((3, 300), np.float32)
    mask[1, 200:] = NEG
    o64, i64 = sparq_attention(q, K, V, r=8, k=32, l=8, mask=mask, return_info=True)
    o32, i32 = sparq_attention(q, K, V, r=8, k=32, l=8, mask=mask, dtype=np.float32,
                               return_info=True)
    assert o32.dtype == np.float32 and o64.dtype == np.float64
    np.testing.assert_allclose(o32, o64, rtol=1e-4, atol=1e-5)
    cs = combined_scores(q, K, r=8, mask=mask)
    for row in range(3):
        for j in range(2):
            assert selection_matches(i64["i2"][row][j], i32["i2"][row][j], cs[row, j],
                                     atol=1e-5)
    o16 = sparq_attention(q, K, V, r=8, k=32, l=8, mask=mask, dtype=np.float16)
    assert o16.dtype == np.float16
    np.testing.assert_allclose(o16.astype(np.float64), o64, atol=5e-2)
    d32 = dense_attention(q, K, V, mask=mask, dtype=np.float32)
    assert d32.dtype == np.float32
    np.testing.assert_allclose(d32, dense_attention(q, K, V, mask=mask), rtol=1e-4,
                               atol=1e-5)


def test_large_shape_is_fast():
    rng = np.random.default_rng(10)
    q, K, V = rand_inputs(rng, 1, 8, 2, 33000, 256, dtype=np.float32)
    sparq_attention(q[:, :, :], K[:100], V[:100], r=32, k=16)  # warm up
    t0 = time.perf_counter()
    out = sparq_attention(q, K, V, r=32, k=128, l=32)
    elapsed = time.perf_counter() - t0
    assert out.shape == (1, 8, 256) and np.isfinite(out).all()
    assert elapsed < 1.0, f"sparq_attention took {elapsed:.2f} s"


# --------------------------------------------------------------------------------------
# helpers for kernel tests
# --------------------------------------------------------------------------------------


def test_combined_scores_shape_and_invalid_cells():
    rng = np.random.default_rng(11)
    q, K, _ = rand_inputs(rng, 2, 6, 3, 25, 8)
    mask = np.zeros((2, 25))
    mask[0, 5:9] = NEG
    cs = combined_scores(q, K, r=3, mask=mask)
    assert cs.shape == (2, 3, 25)
    np.testing.assert_array_equal(cs[0, :, 5:9], 0.0)
    # each shat_h sums to 1, so the group sum is g = 2 per row and KV head
    np.testing.assert_allclose(cs.sum(axis=-1), 2.0, rtol=1e-13)


def test_selection_matches():
    scores = np.array([0.9, 0.5, 0.5, 0.1, 0.5000001, 0.05])
    ref = [0, 1]  # top 2 with ties at 0.5 broken to the lower index
    assert selection_matches(ref, [1, 0], scores, atol=0)  # same set, any order
    assert selection_matches(ref, [0, 2], scores, atol=0)  # exact tie
    assert selection_matches(ref, [0, 4], scores, atol=1e-6)  # tie within atol
    assert not selection_matches(ref, [0, 4], scores, atol=1e-9)
    assert not selection_matches(ref, [0, 3], scores, atol=1e-3)  # not a tie
    assert not selection_matches(ref, [1, 2], scores, atol=1e-3)  # dropped the best
    assert not selection_matches(ref, [0], scores, atol=1.0)  # wrong size
    assert not selection_matches(ref, [0, 0], scores, atol=1.0)  # duplicate
    # forced (window) positions must be present and do not set the boundary
    ref_w = [0, 5]  # 5 is the forced window cell
    assert selection_matches(ref_w, [0, 5], scores, atol=0, forced=[5])
    assert not selection_matches(ref_w, [0, 3], scores, atol=0.1, forced=[5])


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


def _small():
    rng = np.random.default_rng(12)
    return rand_inputs(rng, 2, 4, 2, 10, 8)


@pytest.mark.parametrize("kw,pattern", [
    (dict(r=0, k=4), r"\br\b.*\[1, 8\]"),
    (dict(r=9, k=4), r"\br\b.*\[1, 8\]"),
    (dict(r=1.5, k=4), r"\br\b.*integer"),
    (dict(r=2, k=0), r"\bk\b.*>= 1"),
    (dict(r=2, k=4, l=-1), r"\bl\b.*\[0, 4\]"),
    (dict(r=2, k=4, l=5), r"\bl\b.*\[0, 4\]"),
    (dict(r=2, k=4, scale=-1.0), r"\bscale\b"),
    (dict(r=2, k=4, mask=np.zeros((2, 9))), r"\bmask\b.*\(n_rows=2, S=10\)"),
    (dict(r=2, k=4, vbar=np.zeros((3, 8))), r"\bvbar\b"),
    (dict(r=2, k=4, dtype=np.int32), r"\bdtype\b"),
    (dict(r=2, k=4, topk_buckets=3), r"\btopk_buckets\b.*>= k = 4"),
    (dict(r=2, k=4, topk_buckets=-4), r"\btopk_buckets\b.*>= k = 4"),
    (dict(r=2, k=4, topk_buckets=2.0), r"\btopk_buckets\b.*integer"),
    (dict(r=2, k=4, topk_buckets=8, coverage=(0.9, 2)), r"\btopk_buckets\b.*fixed k"),
    (dict(r=2, k=4, topk_buckets=8, h2o_scores=np.zeros((2, 10))), r"\btopk_buckets\b.*h2o"),
    (dict(r=2, k=4, topk_buckets=8, streaming=True), r"\btopk_buckets\b.*streaming"),
])
def test_validation_errors_name_the_parameter(kw, pattern):
    q, K, V = _small()
    with pytest.raises(ValueError, match=pattern):
        sparq_attention(q, K, V, **kw)


def test_validation_shapes():
    q, K, V = _small()
    with pytest.raises(ValueError, match=r"\bq\b"):
        sparq_attention(q[0], K, V, r=2, k=4)
    with pytest.raises(ValueError, match=r"\bK\b"):
        sparq_attention(q, K[:, :, :4], V, r=2, k=4)
    with pytest.raises(ValueError, match=r"\bV\b"):
        sparq_attention(q, K, V[:5], r=2, k=4)
    with pytest.raises(ValueError, match=r"n_head \(4\) must be a multiple of n_head_kv \(3\)"):
        sparq_attention(q, np.zeros((10, 3, 8)), np.zeros((10, 3, 8)), r=2, k=4)
    with pytest.raises(ValueError, match=r"\bV\b"):
        dense_attention(q, K, V[:, :1])
    with pytest.raises(ValueError, match=r"\br\b"):
        combined_scores(q, K, r=0)


# --------------------------------------------------------------------------------------
# cost model
# --------------------------------------------------------------------------------------


def test_cost_hand_values():
    # S = 4096, d = 128, r = 16, k = 128:
    #   M_dense = 2*4096*128 + 2*128 = 1048576 + 256 = 1048832
    #   M_sparq = 4096*16 + 2*128*128 + 4*128 = 65536 + 32768 + 512 = 98816
    assert cost.m_dense(4096, 128) == 1048832
    assert cost.m_sparq(4096, 128, 16, 128) == 98816
    c = cost.compression(4096, 128, 16, 128)
    assert c == pytest.approx((4096 * 16 + 2 * 128 * 128 + 512) / (2 * 4096 * 128 + 256))
    assert c == pytest.approx(98816 / 1048832)
    assert cost.attention_bound(4096, 128, 16, 128) == pytest.approx(1048832 / 98816)
    # bytes: F16 cache (2 bytes), 8 KV heads
    assert cost.bytes_moved(4096, 128, 16, 128, 2, 8, True) == 98816 * 16
    assert cost.bytes_moved(4096, 128, 16, 128, 2, 8, sparq=False) == 1048832 * 16
    assert cost.bytes_moved(4096, 128, 16, 128, 34 / 32, 1) == pytest.approx(98816 * 1.0625)


def test_cost_dense_when_S_le_k_and_limits():
    assert cost.m_sparq(100, 128, 16, 128) == cost.m_dense(100, 128)
    assert cost.m_sparq(128, 128, 16, 128) == cost.m_dense(128, 128)
    assert cost.compression(128, 128, 16, 128) == 1.0
    assert cost.m_sparq(129, 128, 16, 128) == 129 * 16 + 2 * 128 * 128 + 512
    # with k fixed, compression -> r / (2d) as S grows
    assert cost.compression(10**9, 128, 16, 128) == pytest.approx(16 / 256, rel=1e-5)
    # arrays of S
    S = np.array([64, 128, 4096, 131072])
    c = cost.compression(S, 128, 16, 128)
    assert isinstance(c, np.ndarray) and c.shape == (4,)
    np.testing.assert_array_equal(c[:2], 1.0)
    assert np.all(np.diff(c[1:]) < 0)
    np.testing.assert_array_equal(cost.m_dense(S, 128), 2 * S * 128 + 256)
    np.testing.assert_allclose(cost.attention_bound(S, 128, 16, 128), 1 / c)


def test_amdahl_bound():
    assert cost.amdahl_bound(0.0, 0.125) == 1.0
    assert cost.amdahl_bound(1.0, 0.125) == pytest.approx(8.0)
    assert cost.amdahl_bound(0.5, 0.125) == pytest.approx(1 / 0.5625)
    assert cost.amdahl_bound(0.7, 1.0) == pytest.approx(1.0)
    z = np.linspace(0, 1, 11)
    b = cost.amdahl_bound(z, 0.125)
    assert np.all(np.diff(b) > 0) and b[-1] == pytest.approx(8.0)


@pytest.mark.parametrize("call,pattern", [
    (lambda: cost.m_dense(-1, 128), r"\bS\b"),
    (lambda: cost.m_dense(10, 0), r"\bd\b.*>= 1"),
    (lambda: cost.m_sparq(10, 128, 0, 128), r"\br\b.*\[1, d\]"),
    (lambda: cost.m_sparq(10, 128, 129, 128), r"\br\b.*\[1, 128\]"),
    (lambda: cost.compression(10, 128, 16, 0), r"\bk\b.*>= 1"),
    (lambda: cost.amdahl_bound(1.5, 0.1), r"\bz\b.*\[0, 1\]"),
    (lambda: cost.amdahl_bound(0.5, 0.0), r"\bcompression\b"),
    (lambda: cost.bytes_moved(10, 128, 16, 128, 0, 8, True), r"\belem_bytes\b"),
    (lambda: cost.bytes_moved(10, 128, 16, 128, 2, 0, True), r"\bn_head_kv\b"),
])
def test_cost_validation(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


# ---- the paper's baselines (Appendix G) ------------------------------------------------


def _baseline_inputs(S=40, n_head=4, n_head_kv=2, d=8, seed=3):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n_head, d))
    K = rng.standard_normal((S, n_head_kv, d))
    V = rng.standard_normal((S, n_head_kv, d))
    return q, K, V


def test_streaming_attends_over_the_sinks_and_the_recent_cells():
    """LM-Infinite: the first k - l and the last l valid cells, exact attention over them, no mean-V."""
    q, K, V = _baseline_inputs()
    mask = np.zeros((1, 40))
    mask[0, [1, 30]] = -np.inf
    out, info = sparq_attention(q, K, V, r=1, k=10, l=6, mask=mask, streaming=True, return_info=True)
    want_cells = np.array([0, 2, 3, 4, 33, 34, 35, 36, 37, 38, 39][:4] + [34, 35, 36, 37, 38, 39])
    for j in range(2):
        assert np.array_equal(info["i2"][0][j], np.sort(want_cells))
    # exactly dense attention restricted to those cells
    m2 = np.full((1, 40), -np.inf)
    m2[0, want_cells] = 0.0
    assert np.allclose(out, dense_attention(q, K, V, mask=m2))
    # with k >= S it is dense attention
    assert np.allclose(sparq_attention(q, K, V, r=1, k=40, l=10, streaming=True), dense_attention(q, K, V))


def test_streaming_window_list_names_recent_then_earliest_positions():
    q, K, V = _baseline_inputs()
    win = [[39, 20, 21, 5, 6, 7, -1]]  # l = 3 recent cells, then the sinks (cells of the earliest positions)
    _, info = sparq_attention(q, K, V, r=1, k=7, l=3, streaming=True, window=win, return_info=True)
    assert info["i2"][0][0].tolist() == [5, 6, 7, 20, 21, 39]


def test_h2o_picks_the_heavy_hitters_and_adds_the_weights():
    """H2O: the window and the k - l cells of largest score (ties to the lower index); the new
    scores add each head's softmax weights over the chosen cells, summed over the group."""
    q, K, V = _baseline_inputs()
    h = np.zeros((2, 40))
    h[0, [3, 9, 17]] = [5.0, 4.0, 3.0]
    h[1, [11, 12]] = [2.0, 2.0]
    out, info = sparq_attention(q, K, V, r=1, k=6, l=2, h2o_scores=h, return_info=True)
    assert info["i2"][0][0].tolist() == [0, 3, 9, 17, 38, 39]   # 3 heavy hitters, then the tie at 0 to cell 0
    assert info["i2"][0][1].tolist() == [0, 1, 11, 12, 38, 39]  # 2 heavy hitters, then ties at 0 to the lower index
    g = 2
    added = info["h2o"] - h
    for j in range(2):
        assert added[j].sum() == pytest.approx(g)
        assert np.all(added[j][np.setdiff1d(np.arange(40), info["i2"][0][j])] == 0)
        m2 = np.full((1, 40), -np.inf)
        m2[0, info["i2"][0][j]] = 0.0
        want = dense_attention(q, K, V, mask=m2)[0, j * g:(j + 1) * g]
        assert np.allclose(out[0, j * g:(j + 1) * g], want)
    # dense rows (k >= S) score every valid cell
    _, info = sparq_attention(q, K, V, r=1, k=64, l=16, h2o_scores=h, return_info=True)
    assert np.all(info["h2o"] - h > 0) and (info["h2o"] - h).sum() == pytest.approx(4.0)


# ---- the vector-index selector ------------------------------------------------------------


def test_index_probing_every_list_is_the_oracle_for_one_head_per_group():
    """With every list probed all valid cells are candidates, ranked by q . k: for g = 1 that is
    the oracle top-k (exact scores), so selection and output equal the oracle without mean-V."""
    rng = np.random.default_rng(8)
    q, K, V = rand_inputs(rng, 1, 2, 2, 300, 16)
    cent = rng.standard_normal((2, 8, 16))
    lists = -np.ones((2, 300))
    out, info = sparq_attention(q, K, V, r=1, k=40, l=10, ivf=(cent, lists, 8), return_info=True)
    want, winfo = sparq_attention(q, K, V, r=16, k=40, l=10, oracle=True, mean_v=False, return_info=True)
    for j in range(2):
        assert np.array_equal(info["i2"][0][j], winfo["i2"][0][j])
    assert np.allclose(out, want)
    # every cell joined its nearest centroid
    d2 = ((K[:, :, None, :] - cent[None]) ** 2).sum(-1)   # (S, hkv, lists)
    assert np.array_equal(info["ivf_lists"].T, d2.argmin(-1))


def test_index_reads_only_the_probed_lists():
    """Cells outside the probed lists are never chosen (the window aside), whatever their logit;
    the lists are ranked by the group's summed query against the centroids."""
    rng = np.random.default_rng(9)
    q, K, V = rand_inputs(rng, 1, 4, 1, 200, 8)
    qs = q[0].sum(axis=0)
    cent = np.stack([qs, -qs, np.roll(qs, 3)])[None]        # list 0 aligns with the summed query
    lists = np.full((1, 200), 2.0)
    lists[0, 50:60] = 0.0                                      # ten cells in the best list
    lists[0, 100:150] = 1.0
    K[120, 0] = 10 * qs                                        # the largest logit, in an unprobed list
    _, info = sparq_attention(q, K, V, r=1, k=20, l=4, ivf=(cent, lists, 1), return_info=True)
    assert info["i2"][0][0].tolist() == list(range(50, 60)) + [196, 197, 198, 199]
    assert np.array_equal(info["ivf_lists"], lists)            # no cell was unassigned


# ---- a quantized (q8_0) cache --------------------------------------------------------


def test_q8_0_blocks_are_ggmls():
    """quantize_q8_0 is ggml's reference quantizer, byte for byte (gguf-py's port of it), and
    dequantized values quantize back to the same blocks (the cache's values are a fixed point)."""
    import gguf

    from sparq_lab.reference import dequantize_q8_0, q8_0_bytes, quantize_q8_0, round_kv

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((40, 128)) * np.exp(rng.normal(0, 2, size=(40, 1)))).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block: scale 0
    x[5, 7] = 1e4    # one outlier in its block
    assert q8_0_bytes(x) == gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).tobytes()
    d, qs = quantize_q8_0(x)
    assert d.shape == (40, 4) and qs.shape == (40, 128) and np.abs(qs).max() == 127
    y = dequantize_q8_0(d, qs)
    # half a step, plus the scale's f16 rounding (the values divide by the f32 scale) times 127
    assert np.all(np.abs(y - x) <= d.astype(np.float32).repeat(32, axis=1) * (0.5 + 127 * 2.0 ** -11))
    d2, qs2 = quantize_q8_0(y)
    assert np.array_equal(d2, d) and np.array_equal(qs2, qs)
    assert np.array_equal(round_kv(x, "q8_0"), y) and round_kv(x, None) is x
    with pytest.raises(ValueError, match=r"multiple of 32"):
        quantize_q8_0(np.zeros((2, 40)))
    with pytest.raises(ValueError, match=r"kv_quant.*q8_0.*'bf16'"):
        round_kv(x, "bf16")


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_block_formats_are_ggmls(kv_type):
    """The NumPy block formats: dequantize_blocks equals gguf-py's dequantize (ggml's dequantize_row_*
    in NumPy) on the blocks quantize_blocks makes and on random bytes (any scale, any bits); the
    quantizers of all but iq4_nl are ggml's reference ones, byte for byte (gguf-py's ports); the
    values stay within the type's step of x and are a fixed point of quantize and dequantize."""
    import gguf

    from sparq_lab.reference import dequantize_blocks, quantize_blocks, round_kv

    qt = getattr(gguf.GGMLQuantizationType, kv_type.upper())
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((40, 128)) * np.exp(rng.normal(0, 2, size=(40, 1)))).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block: scale 0
    x[5, 7] = 1e4    # one outlier in its block
    b = quantize_blocks(x, kv_type)
    assert b.shape == (40, 4, gguf.GGML_QUANT_SIZES[qt][1]) and b.dtype == np.uint8
    y = dequantize_blocks(b, kv_type)
    np.testing.assert_array_equal(y, gguf.quants.dequantize(b.reshape(40, -1), qt))
    raw = rng.integers(0, 256, size=(64, b.shape[-1]), dtype=np.uint8)
    raw[:, :2] = np.array([0.37], np.float16).view(np.uint8)  # a finite scale (random bytes may make inf / nan)
    if kv_type in ("q4_1", "q5_1"):
        raw[:, 2:4] = np.array([-1.5], np.float16).view(np.uint8)
    np.testing.assert_array_equal(dequantize_blocks(raw, kv_type).reshape(64, 32),
                                  gguf.quants.dequantize(raw.reshape(64, -1), qt))
    if kv_type != "iq4_nl":  # (gguf-py has no iq4_nl quantizer)
        assert b.tobytes() == gguf.quants.quantize(x, qt).tobytes()
    # the scale d (the block's extreme, or for q4_1 / q5_1 its range, over the levels) and the error
    # in units of d: half a step; a whole one at the end q4_0 and q5_0 clip (7 d against -8 d);
    # 14 at the end iq4_nl's table clips (113 d against -127 d); plus the scale's f16 rounding
    levels, half = {"q8_0": (127, 0.5), "q4_0": (8, 1.0), "q4_1": (15, 0.5), "q5_0": (16, 1.0), "q5_1": (31, 0.5),
                    "iq4_nl": (127, 14.0)}[kv_type]
    b32 = x.reshape(40, 4, 32)
    span = b32.max(axis=-1) - b32.min(axis=-1) if kv_type in ("q4_1", "q5_1") else np.abs(b32).max(axis=-1)
    d = np.repeat(span / levels, 32, axis=1)
    assert np.all(np.abs(y - x) <= d * (half + levels * 2.0 ** -10))
    np.testing.assert_array_equal(round_kv(y, kv_type), y)
    with pytest.raises(ValueError, match=r"multiple of 32"):
        quantize_blocks(np.zeros((2, 40)), kv_type)


def test_kv_quant_rounds_k_and_v_and_keeps_kt_in_f16():
    """sparq_attention(kv_quant="q8_0") = the same on K and V rounded through q8_0, with the
    approximate scores on the f16 of those keys (the K^T the fork keeps); with k >= S it is dense
    attention on the rounded cache."""
    from sparq_lab.reference import round_kv

    rng = np.random.default_rng(5)
    q, K, V = rand_inputs(rng, 2, 4, 2, 300, 64)
    Kq, Vq = round_kv(K, "q8_0"), round_kv(V, "q8_0")
    kw = dict(r=8, k=40, l=8)
    got, info = sparq_attention(q, K, V, kv_quant="q8_0", return_info=True, **kw)
    want, winfo = sparq_attention(q, Kq, Vq, K_sel=Kq.astype(np.float16), return_info=True, **kw)
    np.testing.assert_array_equal(got, want)
    assert all(np.array_equal(a, b) for ra, rb in zip(info["i2"], winfo["i2"]) for a, b in zip(ra, rb))
    exact = sparq_attention(q, K, V, r=64, k=300, kv_quant="q8_0")
    np.testing.assert_allclose(exact, dense_attention(q, K, V, kv_quant="q8_0"), rtol=1e-12, atol=1e-12)
    assert np.abs(exact - dense_attention(q, K, V)).max() > 0  # the rounding is there


def test_cost_in_bytes():
    """compression is a ratio of bytes: an f16 cache gives the ratio of elements exactly; a q8_0
    cache's rows cost 34/32 bytes per value and K^T (f16) 2."""
    for S, d, r, k in ((4096, 128, 16, 128), (8000, 64, 16, 500), (129, 128, 16, 128)):
        assert cost.compression(S, d, r, k) == pytest.approx(cost.m_sparq(S, d, r, k) / cost.m_dense(S, d), rel=1e-12)
        assert cost.compression(S, d, r, k, kv_type="f16") == cost.compression(S, d, r, k)
        assert cost.b_dense(S, d) == 2 * cost.m_dense(S, d)
        assert cost.b_sparq(S, d, r, k) == 2 * cost.m_sparq(S, d, r, k)
    # q8_0, S = 4096, d = 128, r = 16, k = 128:
    #   B_dense = 4097*128*2*34/32 = 1114384,  B_sparq = 4096*16*2 + 129*128*2*34/32 + 512 = 166672
    assert cost.b_dense(4096, 128, "q8_0") == pytest.approx(1114384)
    assert cost.b_sparq(4096, 128, 16, 128, "q8_0") == pytest.approx(166672)
    assert cost.compression(4096, 128, 16, 128, "q8_0") == pytest.approx(166672 / 1114384)
    assert cost.compression(100, 128, 16, 128, "q8_0") == 1.0
    # with k fixed the limit is r * 2 / (2 d * 34/32): K^T's f16 against 8-bit rows
    assert cost.compression(10**9, 128, 16, 128, "q8_0") == pytest.approx(16 * 2 / (256 * 34 / 32), rel=1e-5)
    assert cost.cache_type_id("q8_0") == 8 and cost.cache_type_id("f16") == 1
    # q4_0: 18 bytes per block of 32; B_dense = 4097*128*2*18/32 = 589968
    assert cost.b_dense(4096, 128, "q4_0") == pytest.approx(589968)
    assert cost.cache_type_id("q4_0") == 2 and cost.cache_type_id("iq4_nl") == 20
    with pytest.raises(ValueError, match=r"kv_type.*f16, f32, q8_0.*'bf16'"):
        cost.compression(4096, 128, 16, 128, kv_type="bf16")
    with pytest.raises(ValueError, match=r"cache type.*'bf16'"):
        cost.cache_type_id("bf16")


# --------------------------------------------------------------------------------------
# the approximate bucketed top-k (topk_buckets)
# --------------------------------------------------------------------------------------


def test_bucket_winners_keep_each_buckets_best_ties_to_the_lower_cell():
    from sparq_lab._reference_steps import bucket_winners

    x = np.array([[5.0, 1.0, 7.0, 3.0, 7.0, NEG, 2.0]])  # buckets of 3: {0, 3, 6}, {1, 4}, {2, 5}
    want = np.array([[5.0, NEG, 7.0, NEG, 7.0, NEG, NEG]])
    assert np.array_equal(bucket_winners(x, 3), want)
    # buckets of 2: evens {5, 7, 7, 2} -> the first 7 (cell 2); odds {1, 3, -inf} -> 3 (cell 3)
    assert np.array_equal(bucket_winners(x, 2), [[NEG, NEG, 7.0, 3.0, NEG, NEG, NEG]])
    assert np.array_equal(bucket_winners(np.full((1, 4), NEG), 2), np.full((1, 4), NEG))
    assert np.array_equal(bucket_winners(x, 7), x) and np.array_equal(bucket_winners(x, 64), x)


@pytest.mark.parametrize("per_head", [False, True])
def test_bucketed_topk_with_a_bucket_per_cell_is_the_exact_top_k(per_head):
    rng = np.random.default_rng(31)
    q, K, V = rand_inputs(rng, 3, 6, 2, 50, 16)
    exact, ie = sparq_attention(q, K, V, r=4, k=12, l=3, per_head=per_head, return_info=True)
    bucketed, ib = sparq_attention(q, K, V, r=4, k=12, l=3, per_head=per_head, topk_buckets=50, return_info=True)
    assert np.array_equal(exact, bucketed)
    for a, b in zip(ie["i2"], ib["i2"]):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


def brute_bucketed(q, K, r, k, l, B, mask_row=None):
    """Row 0's choice per KV head, written out with loops: the window (the last l valid cells), then
    per bucket (cell mod B) the cell of largest summed approximate probability (the lower cell on a
    tie), and the k - l best of those."""
    shat = combined_scores(q, K, r=r, mask=None if mask_row is None else mask_row[None])[0]  # (hkv, S)
    S = K.shape[0]
    valid = np.ones(S, bool) if mask_row is None else np.isfinite(mask_row)
    cells = [c for c in range(S) if valid[c]]
    win = cells[len(cells) - l:] if l else []
    out = []
    for j in range(shat.shape[0]):
        best = {}
        for c in cells:
            if c in win:
                continue
            b = c % B
            if b not in best or shat[j, c] > shat[j, best[b]]:
                best[b] = c
        won = sorted(best.values(), key=lambda c: (-shat[j, c], c))[: k - l]
        out.append(sorted(won + win))
    return out


@pytest.mark.parametrize("S,k,l,B", [(200, 16, 4, 16), (200, 16, 0, 40), (333, 24, 6, 64), (97, 8, 2, 9)])
def test_bucketed_topk_is_the_best_of_each_bucket(S, k, l, B):
    rng = np.random.default_rng(S + B)
    q, K, V = rand_inputs(rng, 1, 6, 2, S, 16)
    mask = np.zeros((1, S))
    mask[0, rng.choice(S, S // 10, replace=False)] = NEG  # holes: some buckets lose cells
    _, info = sparq_attention(q, K, V, r=5, k=k, l=l, mask=mask, topk_buckets=B, return_info=True)
    want = brute_bucketed(q, K, 5, k, l, B, mask[0])
    for j in range(2):
        got = info["i2"][0][j]
        assert got.tolist() == want[j]
        chosen = [c for c in got if c not in want[j][len(want[j]) - l:]] if l else got.tolist()
        assert len({c % B for c in chosen}) == len(chosen)  # never two cells of one bucket
    _, ie = sparq_attention(q, K, V, r=5, k=k, l=l, mask=mask, return_info=True)
    assert any(not np.array_equal(a, b) for a, b in zip(ie["i2"][0], info["i2"][0]))  # the cases do differ


def test_bucketed_topk_with_fewer_occupied_buckets_than_k_takes_fewer_cells():
    rng = np.random.default_rng(4)
    q, K, V = rand_inputs(rng, 1, 2, 1, 64, 8)
    mask = np.full((1, 64), NEG)
    mask[0, ::8] = 0.0  # 8 valid cells, all in bucket 0 of 8 buckets
    out, info = sparq_attention(q, K, V, r=8, k=4, l=1, mask=mask, topk_buckets=8, return_info=True)
    sel = info["i2"][0][0]
    assert sel.size == 2 and sel[-1] == 56  # one bucket's best and the window
    p = dense_probs(q, K, mask)[0]
    assert sel[0] == np.argmax(np.where(np.arange(64) < 56, p.sum(0), -1.0))
    assert np.all(np.isfinite(out))


def test_a_kq_bias_is_scaled_and_added_as_the_mask_is():
    """A KQ bias the same for every query head is a mask times scale (build_attn_mha adds kq_b before
    soft_max_ext's scale): dense and exact SparQ give the same output either way; a bias of another
    shape is refused naming kq_b."""
    rng = np.random.default_rng(7)
    q, K, V = rng.standard_normal((2, 4, 16)), rng.standard_normal((50, 2, 16)), rng.standard_normal((50, 2, 16))
    b = rng.normal(0.0, 8.0, size=(2, 50))
    scale = 0.25
    kq_b = np.broadcast_to(b[:, None, :], (2, 4, 50))
    want = dense_attention(q, K, V, mask=scale * b, scale=scale)
    assert np.allclose(dense_attention(q, K, V, scale=scale, kq_b=kq_b), want, atol=1e-12)
    got = sparq_attention(q, K, V, r=16, k=50, scale=scale, kq_b=kq_b)
    assert np.allclose(got, want, atol=1e-12)
    assert not np.allclose(dense_attention(q, K, V, scale=scale), want, atol=1e-3)
    with pytest.raises(ValueError, match="kq_b must have shape"):
        dense_attention(q, K, V, scale=scale, kq_b=b)
