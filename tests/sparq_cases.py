"""Test cases for the SparQ kernels: generation, the case-file format of
tests/native/sparq-op-test.cpp, running it, and checking its results against the
NumPy reference (sparq_lab.reference).

Checks, per FlashAttention's rule for kernels (a kernel's error against the exact reference
may be at most a small multiple of the error of the naive reference in the kernel's precision):
- the selected cells equal the reference's up to ties of the combined score;
- the output error against the float64 reference (on the same f16-rounded inputs)
  is within 2x the error of the naive float32 reference (plus a tiny floor).
"""

from __future__ import annotations

import dataclasses
import struct
import subprocess
from pathlib import Path

import numpy as np

from sparq_lab import reference as ref


@dataclasses.dataclass
class Case:
    d: int
    S: int
    r: int
    k: int
    l: int = 0
    dv: int | None = None
    n_rows: int = 1
    n_head: int = 1
    n_head_kv: int = 1
    n_stream: int = 1
    kv_type: str = "f16"      # f16 | f32 | a block type of ref.KV_QUANT_TYPES (q8_0, q4_0, ...: K and V rows
                              # in its blocks, K^T f16 of the dequantized keys)
    mask: str = "full"        # none | full | holes | pad | causal
    mask_type: str = "f16"    # f16 | f32
    kt_pad: int = 0
    win: str = "none"         # none | tail (the last l valid cells, given explicitly) | random (l random valid cells)
    selector: str = "sparq"   # sparq | oracle | streaming | h2o (the paper's baselines) | index (IVF top-k)
    n_list: int = 16          # index: lists (centroids) per KV head
    n_probe: int = 4          # index: lists probed per query
    per_head: bool = False    # per-head position choice (union over the group)
    mean_v: bool = True       # mean-value reallocation
    basis: bool = False       # approximate scores in a rotated basis (q_sel, K_sel, comp_w)
    dense_streams: tuple = () # streams marked dense (negative v_count): exact attention over every valid cell
    coverage: float = 0.0     # > 0: the calibrated k's coverage target (at least k_min cells, at most k)
    k_min: int = 0
    kt_bits: int = 16         # 8: K^T in e5m2 (the keys' f16, then its upper byte); 4: the 4-bit K^T (S % 32 == 0)
    topk_buckets: int = 0     # > 0: the approximate bucketed top-k with that many buckets
    softcap: float = 0.0      # > 0: logit soft-capping
    max_bias: float = 0.0     # > 0: ALiBi (with mask "alibi": each valid cell's mask is minus its distance)
    sinks: bool = False       # a sink logit per query head
    kq_b: bool = False        # a bias per (row, query head, cell) added to the scores (T5's position bias)
    v_view: bool = False      # V is the first dv components of K's rows, read through K's rows (MLA's cache)
    seed: int = 0

    def __post_init__(self):
        if self.dv is None:
            self.dv = self.d
        if self.v_view and self.dv > self.d:
            raise ValueError(f"v_view needs dv <= d, got dv={self.dv}, d={self.d}")

    @property
    def id(self):
        return (f"d{self.d}-S{self.S}-r{self.r}-k{self.k}-l{self.l}-rows{self.n_rows}-h{self.n_head}/{self.n_head_kv}"
                f"-st{self.n_stream}-{self.kv_type}-{self.mask}" + ("" if self.win == "none" else f"-win{self.win}")
                + ("" if self.selector == "sparq" else f"-{self.selector}") + ("-perhead" if self.per_head else "")
                + ("" if self.mean_v else "-nomeanv") + ("-basis" if self.basis else "")
                + (f"-dense{''.join(map(str, self.dense_streams))}" if self.dense_streams else "")
                + (f"-cov{self.coverage:g}-kmin{self.k_min}" if self.coverage else "")
                + (f"-kt{self.kt_bits}" if self.kt_bits != 16 else "") + (f"-tkb{self.topk_buckets}" if self.topk_buckets else "")
                + (f"-cap{self.softcap:g}" if self.softcap else "") + (f"-alibi{self.max_bias:g}" if self.max_bias else "")
                + ("-sinks" if self.sinks else "") + ("-kqb" if self.kq_b else "")
                + (f"-dv{self.dv}" if self.dv != self.d else "")
                + ("-vview" if self.v_view else ""))

    @property
    def baseline(self):
        return self.selector in ("streaming", "h2o", "index")

    @property
    def g(self):
        return self.n_head // self.n_head_kv

    @property
    def sel_n(self):
        """Entries per (row, KV head) of the kernel's selection output (sparq_sel_max)."""
        per_head = self.per_head and self.g > 1 and self.selector not in ("streaming", "h2o")
        return self.g * self.k if per_head else self.k


SELECTORS = {"sparq": 0, "oracle": 1, "streaming": 2, "h2o": 3, "index": 4}


def generate(c: Case):
    """Arrays of the case, in the reference's shapes, f16 values already rounded."""
    rng = np.random.default_rng(c.seed)
    kv_dt = np.float32 if c.kv_type == "f32" else np.float16  # K^T's type (a quantized cache keeps f16)
    # queries with a heavy tail over components (as real ones have), keys with a few
    # large channels, values plain
    comp_scale = np.exp(rng.normal(0.0, 0.7, size=c.d)).astype(np.float32)
    q = (rng.standard_normal((c.n_stream, c.n_rows, c.n_head, c.d)) * comp_scale).astype(np.float32)
    K = (rng.standard_normal((c.n_stream, c.S, c.n_head_kv, c.d)) * np.sqrt(comp_scale)).astype(kv_dt)
    V = rng.standard_normal((c.n_stream, c.S, c.n_head_kv, c.dv)).astype(kv_dt)
    if c.v_view:
        V = K[..., :c.dv].copy()
    blocks = {}
    if c.kv_type in ref.KV_QUANT_TYPES:
        # the cache's blocks (write() stores them) and their values (float32, as ggml dequantizes them)
        blocks = {n: ref.quantize_blocks(x, c.kv_type) for n, x in (("K", K), ("V", V))}
        K, V = (ref.dequantize_blocks(blocks[n], c.kv_type) for n in ("K", "V"))
    mask = None
    if c.mask != "none":
        mask = np.zeros((c.n_stream, c.n_rows, c.S), np.float32)
        for st in range(c.n_stream):
            if c.mask == "holes":
                holes = rng.random(c.S) < 0.3
                mask[st, :, holes] = -np.inf
            elif c.mask == "pad":
                n_pad = int(rng.integers(0, max(1, c.S // 3)))
                if n_pad:
                    mask[st, :, c.S - n_pad:] = -np.inf
            elif c.mask == "alibi":
                # ALiBi's mask (llama.cpp's): minus the distance to the row's position, a few holes
                for i in range(c.n_rows):
                    pos = c.S - c.n_rows + i
                    mask[st, i] = -np.abs(pos - np.arange(c.S))
                    mask[st, i, pos + 1:] = -np.inf
                mask[st, :, rng.random(c.S) < 0.1] = -np.inf
            elif c.mask == "causal":
                # row i sees the cells up to S - n_rows + i, with a few holes
                for i in range(c.n_rows):
                    mask[st, i, c.S - c.n_rows + i + 1:] = -np.inf
                holes = rng.random(c.S) < 0.1
                mask[st, :, holes] = -np.inf
        if c.mask_type == "f16":
            mask = mask.astype(np.float16).astype(np.float32)
    # the running sum and count over the stream's valid cells (cells any row may see)
    v_sum = np.zeros((c.n_stream, c.n_head_kv, c.dv), np.float32)
    v_count = np.zeros(c.n_stream, np.float32)
    for st in range(c.n_stream):
        cells = np.ones(c.S, bool) if mask is None else np.isfinite(mask[st]).any(axis=0)
        v_sum[st] = V[st][cells].astype(np.float64).sum(axis=0)
        v_count[st] = cells.sum() * (-1 if st in c.dense_streams else 1)
    a = dict(q=q, K=K, V=V, mask=mask, v_sum=v_sum, v_count=v_count, scale=np.float32(1.0 / np.sqrt(c.d)),
             win=None, q_sel=None, K_sel=None, comp_w=None, h2o=None, ivf_cent=None, ivf_lists=None,
             sinks=(rng.normal(1.0, 2.0, size=c.n_head).astype(np.float32) if c.sinks else None),
             K_blocks=blocks.get("K"), V_blocks=blocks.get("V"), kq_b=None)
    if c.kq_b:
        # a position bias (st, row, head, cell): a per-head profile over the cells, a little noise per row; it
        # enters times scale, so it is drawn on the scale of the logits before it
        prof = rng.normal(0.0, 1.5, size=(c.n_stream, 1, c.n_head, c.S))
        noise = rng.normal(0.0, 0.3, size=(c.n_stream, c.n_rows, c.n_head, c.S))
        a["kq_b"] = ((prof + noise) * np.sqrt(c.d)).astype(np.float32)
    if c.selector == "h2o":
        # accumulated attention: continuous values, with a third of the cells at exactly 0 (cells
        # no step attended yet), so the choice also meets ties (to the lower index)
        h = rng.exponential(1.0, size=(c.n_stream, c.n_head_kv, c.S)).astype(np.float32)
        h[rng.random(h.shape) < 0.33] = 0.0
        a["h2o"] = h
    if c.selector == "index":
        # centroids: keys of random cells, jittered; two thirds of the cells in a list (any list: the op
        # trusts the ids it is given), the rest unassigned (-1: the op assigns them)
        cent = np.empty((c.n_stream, c.n_head_kv, c.n_list, c.d), np.float32)
        lists = np.full((c.n_stream, c.n_head_kv, c.S), -1.0, np.float32)
        for st in range(c.n_stream):
            for j in range(c.n_head_kv):
                pick = rng.choice(c.S, size=c.n_list, replace=c.S < c.n_list)
                cent[st, j] = K[st, pick, j].astype(np.float32) + 0.1 * rng.standard_normal((c.n_list, c.d))
                assigned = rng.random(c.S) < 2 / 3
                lists[st, j, assigned] = rng.integers(0, c.n_list, size=int(assigned.sum()))
        a["ivf_cent"], a["ivf_lists"] = cent, lists
    if c.win != "none":
        # per row: the window's cells, scrambled, -1 padded (the kernel keeps the valid ones); with the
        # streaming selector entries 0..l-1 the l most recent positions' cells, then l..k-1 the earliest
        # positions' cells (the sinks)
        streaming = c.selector == "streaming"
        win = -np.ones((c.n_stream, c.n_rows, (c.k if streaming else c.l) + 2), np.int32)
        for st in range(c.n_stream):
            for row in range(c.n_rows):
                valid = np.ones(c.S, bool) if mask is None else np.isfinite(mask[st, row])
                cells = np.flatnonzero(valid)
                if streaming:
                    if c.win == "tail":
                        recent, sinks = cells[max(0, cells.size - c.l):], cells[: c.k - c.l]
                    else:
                        perm = rng.permutation(cells)
                        recent = perm[: min(c.l, cells.size)]
                        sinks = perm[recent.size: recent.size + c.k - c.l]
                    win[st, row, :recent.size] = recent[::-1]
                    win[st, row, c.l: c.l + sinks.size] = sinks
                    continue
                if c.win == "tail":
                    pick = cells[max(0, cells.size - c.l):]
                else:
                    # cells of the most recent positions need not be the last by index
                    pick = rng.choice(cells, size=min(c.l, cells.size), replace=False)
                pick = np.concatenate([pick[1::2], pick[0::2]])
                win[st, row, :pick.size] = pick
        a["win"] = win
    if c.basis:
        # an orthogonal basis per KV head: K^T holds K @ P, the query is rotated with it
        P = np.linalg.qr(rng.standard_normal((c.n_head_kv, c.d, c.d)))[0]
        Ks = np.einsum("sjd,jde->sje", K.astype(np.float64).reshape(-1, c.n_head_kv, c.d), P)
        a["K_sel"] = Ks.reshape(K.shape).astype(kv_dt)
        kvh = np.arange(c.n_head) // c.g
        a["q_sel"] = np.einsum("srhd,hde->srhe", q.astype(np.float64), P[kvh]).astype(np.float32)
        a["comp_w"] = np.exp(rng.normal(0.0, 0.5, size=(c.n_head_kv, c.d))).astype(np.float32)
    return a


# the kernels' enum sparq_type (ggml-sparq/cpu/sparq-cpu.h)
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 4, "q4_1": 5, "q5_0": 6, "q5_1": 7, "iq4_nl": 8}
BLOCK_KV_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # the 4- and 5-bit ones


def write(path: Path, c: Case, a: dict) -> None:
    kv_type = KV_TYPES[c.kv_type]
    mask_type = -1 if a["mask"] is None else (1 if c.mask_type == "f16" else 0)
    win_n = 0 if a["win"] is None else a["win"].shape[-1]
    hdr = struct.pack("<4s19if", b"SPQ2", c.d, c.dv, c.S, c.n_rows, c.n_head, c.n_head_kv, c.n_stream,
                      c.r, c.k, c.l, kv_type, mask_type, c.kt_pad, win_n, SELECTORS[c.selector],
                      int(c.per_head), int(not c.mean_v), int(c.basis), c.sel_n, float(a["scale"]))
    kv_dt = np.float16 if kv_type else np.float32  # K^T's (and K_sel's) type

    def rows(x, blocks):  # K or V rows, (st, hkv, cell, d), in the cache's type
        if blocks is not None:
            return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3, 4)).tobytes()
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).astype(kv_dt).tobytes()

    with open(path, "wb") as f:
        f.write(hdr)
        # ggml layouts: q [d, n_rows, n_head, n_stream] -> numpy (st, head, row, d)
        f.write(np.ascontiguousarray(a["q"].transpose(0, 2, 1, 3), dtype=np.float32).tobytes())
        # K, V [d, n_kv, n_head_kv, n_stream] -> numpy (st, hkv, cell, d)
        f.write(rows(a["K"], a["K_blocks"]))
        f.write(rows(a["V"], a["V_blocks"]))
        if a["mask"] is not None:
            f.write(np.ascontiguousarray(a["mask"], dtype=np.float16 if mask_type == 1 else np.float32).tobytes())
        f.write(np.ascontiguousarray(a["v_sum"], dtype=np.float32).tobytes())
        f.write(np.ascontiguousarray(a["v_count"], dtype=np.float32).tobytes())
        if a["win"] is not None:
            f.write(np.ascontiguousarray(a["win"], dtype=np.int32).tobytes())
        if c.basis:
            f.write(np.ascontiguousarray(a["q_sel"].transpose(0, 2, 1, 3), dtype=np.float32).tobytes())
            f.write(np.ascontiguousarray(a["K_sel"].transpose(0, 2, 1, 3), dtype=kv_dt).tobytes())
            f.write(np.ascontiguousarray(a["comp_w"], dtype=np.float32).tobytes())
        if a["h2o"] is not None:
            f.write(np.ascontiguousarray(a["h2o"], dtype=np.float32).tobytes())
        if a["ivf_cent"] is not None:
            f.write(struct.pack("<2i", c.n_list, c.n_probe))
            f.write(np.ascontiguousarray(a["ivf_cent"], dtype=np.float32).tobytes())
            f.write(np.ascontiguousarray(a["ivf_lists"], dtype=np.float32).tobytes())
        if c.coverage:
            f.write(b"COV1" + struct.pack("<fi", c.coverage, c.k_min))
        if c.kt_bits == 8:
            f.write(b"KTE5")
        if c.kt_bits == 4:
            f.write(b"KT41")
        if c.topk_buckets:
            f.write(b"TKB1" + struct.pack("<i", c.topk_buckets))
        if c.softcap or c.max_bias or c.sinks:
            f.write(b"VAR1" + struct.pack("<ffi", c.softcap, c.max_bias, int(c.sinks)))
            if c.sinks:
                f.write(np.ascontiguousarray(a["sinks"], dtype=np.float32).tobytes())
        if c.kq_b:
            f.write(b"KQB1" + np.ascontiguousarray(a["kq_b"].transpose(0, 2, 1, 3), dtype=np.float32).tobytes())
        if c.v_view:
            f.write(b"VVK1")


def run(prog, mode: str, c: Case, a: dict, tmp: Path, *, isa=None, threads=1, prefix=(), env=None):
    """Run sparq-op-test; return out (st, row, head, dv) and sel (st, row, hkv, k) or None; with
    the h2o selector a["h2o_out"] receives the scores after the call (st, hkv, S)."""
    case_path, out_path = tmp / f"case-{c.seed}.bin", tmp / f"out-{c.seed}.bin"
    write(case_path, c, a)
    cmd = [*prefix, str(prog), mode, str(case_path), str(out_path), "--threads", str(threads)]
    if isa:
        cmd += ["--isa", isa]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert res.returncode == 0, f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}"
    raw = out_path.read_bytes()
    n_out = c.n_stream * c.n_rows * c.n_head * c.dv
    out = np.frombuffer(raw[: 4 * n_out], np.float32).reshape(c.n_stream, c.n_rows, c.n_head, c.dv)
    sel = None
    o = 4 * n_out
    if mode == "direct":
        n_sel = c.n_stream * c.n_rows * c.n_head_kv * c.sel_n
        sel = np.frombuffer(raw[o: o + 4 * n_sel], np.int32).reshape(c.n_stream, c.n_rows, c.n_head_kv, c.sel_n)
        o += 4 * n_sel
    if c.selector == "h2o":
        a["h2o_out"] = np.frombuffer(raw[o:], np.float32).reshape(c.n_stream, c.n_head_kv, c.S)
    elif c.selector == "index":
        a["ivf_out"] = np.frombuffer(raw[o:], np.float32).reshape(c.n_stream, c.n_head_kv, c.S)
    else:
        assert len(raw) == o, "unexpected bytes after the output"
    return out, sel


def row_vbar(c: Case, a: dict, st: int) -> np.ndarray:
    """Per query row, the mean of V the op uses: the stream's sums less the cells the row
    may not see that the stream's last row sees (later rows of an all-rows ubatch);
    (n_rows, n_head_kv, dv) float64."""
    vs = a["v_sum"][st].astype(np.float64)
    cnt = abs(float(a["v_count"][st]))
    out = np.empty((c.n_rows, c.n_head_kv, c.dv))
    if a["mask"] is None:
        out[:] = vs / max(cnt, 1.0)
        return out
    valid = np.isfinite(a["mask"][st])
    V = a["V"][st].astype(np.float64)
    for row in range(c.n_rows):
        diff = valid[-1] & ~valid[row]
        n = cnt - diff.sum()
        out[row] = (vs - V[diff].sum(axis=0)) / n if n > 0 else 0.0
    return out


def check(c: Case, a: dict, out: np.ndarray, sel: np.ndarray | None) -> dict:
    """Assert the kernel's results against the reference; return error figures."""
    stats = {"rows": 0, "tie_rows": 0, "err": 0.0, "naive": 0.0}
    r_eff = c.d if c.selector == "oracle" else c.r
    vkw0 = dict(softcap=c.softcap, max_bias=c.max_bias, sinks=None if a["sinks"] is None else a["sinks"].astype(np.float64))
    for st in range(c.n_stream):
        vkw = {**vkw0, "kq_b": None if a["kq_b"] is None else a["kq_b"][st].astype(np.float64)}
        q = a["q"][st].astype(np.float64)
        K = a["K"][st].astype(np.float64)
        V = a["V"][st].astype(np.float64)
        mask = None if a["mask"] is None else a["mask"][st].astype(np.float64)
        if st in c.dense_streams:
            # marked dense: exact attention over every valid cell, nothing selected
            want = ref.dense_attention(q, K, V, mask=mask, scale=float(a["scale"]), **vkw)
            naive = ref.dense_attention(q.astype(np.float32), K.astype(np.float32), V.astype(np.float32),
                                        mask=None if mask is None else mask.astype(np.float32),
                                        scale=float(a["scale"]), dtype=np.float32, **vkw)
            got = out[st].astype(np.float64)
            err = float(np.max(np.abs(got - want)))
            err_naive = float(np.max(np.abs(naive.astype(np.float64) - want)))
            floor = 2e-6 * max(1.0, float(np.max(np.abs(want))))
            assert err <= 2.0 * err_naive + floor, f"{c.id}: dense stream {st}: error {err:.3g} vs naive {err_naive:.3g}"
            if sel is not None:
                assert np.all(sel[st] == -1), f"{c.id}: a dense stream listed a selection"
            if c.selector == "h2o":
                # every valid cell's attention weight is added to its score (the reference's dense rows)
                _, info = ref.sparq_attention(q, K, V, r=1, k=c.S, l=0, mask=mask, scale=float(a["scale"]),
                                              h2o_scores=a["h2o"][st], return_info=True)
                got_h = a["h2o_out"][st].astype(np.float64)
                assert np.allclose(got_h, info["h2o"], rtol=1e-5, atol=1e-5 * c.n_rows), (
                    f"{c.id}: H2O scores of dense stream {st} differ by {np.abs(got_h - info['h2o']).max():.3g}")
            stats["rows"] += c.n_rows
            continue
        vbar = row_vbar(c, a, st)
        scale = float(a["scale"])
        q_sel = None if a["q_sel"] is None else a["q_sel"][st].astype(np.float64)
        K_sel = None if a["K_sel"] is None else a["K_sel"][st].astype(np.float64)
        if K_sel is None and c.kv_type in ref.KV_QUANT_TYPES:
            K_sel = K.astype(np.float16).astype(np.float64)  # K^T: the f16 of the dequantized keys
        comp_w = None if a["comp_w"] is None else a["comp_w"].astype(np.float64)
        window = None if a["win"] is None else [a["win"][st, row] for row in range(c.n_rows)]
        kw = dict(r=c.r, k=c.k, l=c.l, mask=mask, scale=scale, vbar=vbar, per_head=c.per_head, mean_v=c.mean_v,
                  oracle=c.selector == "oracle", comp_w=comp_w, window=window,
                  kt_bits=c.kt_bits, **vkw)  # (K and V are the cache's values already: no kv_quant)
        if c.coverage:
            kw["coverage"] = (c.coverage, c.k_min)
        if c.topk_buckets:
            kw["topk_buckets"] = c.topk_buckets
        if c.baseline:
            kw.update(per_head=c.per_head and c.selector == "index", streaming=c.selector == "streaming",
                      h2o_scores=None if a["h2o"] is None else a["h2o"][st],
                      ivf=None if a["ivf_cent"] is None else (a["ivf_cent"][st], a["ivf_lists"][st], c.n_probe))
        want, info = ref.sparq_attention(q, K, V, return_info=True, q_sel=q_sel, K_sel=K_sel, **kw)
        if c.selector == "h2o":
            # the scores after the call: each row's attention weights added
            got_h, want_h = a["h2o_out"][st].astype(np.float64), info["h2o"]
            assert np.allclose(got_h, want_h, rtol=1e-5, atol=1e-5 * c.n_rows), (
                f"{c.id}: H2O scores differ by {np.abs(got_h - want_h).max():.3g} (stream {st})")
        if c.selector == "index" and st not in c.dense_streams:
            # the cells the op assigned: its nearest centroid, as the reference's (rows with n_valid > k only)
            got_l, want_l = a["ivf_out"][st].astype(np.float64), info["ivf_lists"]
            bad = np.argwhere(got_l != want_l)
            assert bad.size == 0, f"{c.id}: index lists differ at (kv head, cell) {bad[:5].tolist()} (stream {st})"
        forced_i2 = None
        if sel is not None and c.baseline:
            # no approximate scores: the choice is fixed (windows, sinks, scores with ties to the lower index)
            for row in range(c.n_rows):
                for j in range(c.n_head_kv):
                    got_i = np.sort(sel[st][row, j][sel[st][row, j] >= 0])
                    assert np.array_equal(got_i, info["i2"][row][j]), (
                        f"{c.id}: {c.selector} selection differs (stream {st} row {row} kv {j}): "
                        f"missing {sorted(set(info['i2'][row][j].tolist()) - set(got_i.tolist()))[:8]}, "
                        f"extra {sorted(set(got_i.tolist()) - set(info['i2'][row][j].tolist()))[:8]}")
        elif sel is not None:
            got_sel = sel[st]
            K_kt = K if K_sel is None else K_sel
            if c.kt_bits == 8:
                K_kt = ref.round_e5m2(K_kt).astype(np.float64)  # the scores step 3 ranks read K^T in e5m2
            elif c.kt_bits == 4:
                K_kt = ref.round_kt4(K_kt).astype(np.float64)
            scores = ref.combined_scores(q if q_sel is None else q_sel, K_kt, r=r_eff,
                                         mask=mask, scale=scale, comp_w=comp_w, **vkw)
            valid = np.ones((c.n_rows, c.S), bool) if mask is None else np.isfinite(mask)
            need_force = False
            near = []
            if c.coverage:
                # the cut's count may move by one where the summed weights meet the target within rounding:
                # the reference at the target -+ 1e-5 gives the other counts allowed
                for eps in (-1e-5, 1e-5):
                    near.append(ref.sparq_attention(q, K, V, return_info=True, q_sel=q_sel, K_sel=K_sel,
                                                    **{**kw, "coverage": (c.coverage + eps, c.k_min)})[1]["i2"])
            for row in range(c.n_rows):
                for j in range(c.n_head_kv):
                    want_i = info["i2"][row][j]
                    got_i = got_sel[row, j][got_sel[row, j] >= 0]
                    if c.coverage and got_i.size == 0:
                        got_i = np.flatnonzero(valid[row])  # the target out of the cap's reach: every valid cell
                    assert np.all(valid[row][got_i]), f"{c.id}: an invalid cell was selected (row {row}, kv {j})"
                    if info["dense_rows"][row]:
                        assert np.array_equal(np.sort(got_i), want_i), f"{c.id}: dense row {row} selection differs"
                        continue
                    for alt in near:
                        if got_i.size != want_i.size and alt[row][j].size == got_i.size:
                            want_i = alt[row][j]
                            need_force = True
                    if c.per_head and c.g > 1:
                        # the union of the heads' choices (continuous random data: no ties expected)
                        assert np.array_equal(np.sort(got_i), want_i), (
                            f"{c.id}: per-head selection differs (stream {st} row {row} kv {j}): "
                            f"missing {sorted(set(want_i.tolist()) - set(got_i.tolist()))[:8]}, "
                            f"extra {sorted(set(got_i.tolist()) - set(want_i.tolist()))[:8]}")
                        continue
                    cells = np.flatnonzero(valid[row])
                    if window is not None:
                        win = [x for x in window[row][:c.l] if 0 <= x < c.S and valid[row][x]]
                    else:
                        win = cells[cells.size - min(c.l, cells.size):] if c.l else None
                    atol = 1e-5 * float(np.max(scores[row, j])) + 1e-12
                    ok = ref.selection_matches(want_i, got_i, scores[row, j], atol, forced=win)
                    assert ok, (f"{c.id}: selection differs beyond ties (stream {st} row {row} kv {j}): "
                                f"missing {sorted(set(want_i.tolist()) - set(got_i.tolist()))[:8]}, "
                                f"extra {sorted(set(got_i.tolist()) - set(want_i.tolist()))[:8]}")
                    if not np.array_equal(np.sort(got_i), want_i):
                        need_force = True
                        stats["tie_rows"] += 1
            if need_force:
                # ties chose other cells: judge the output on the kernel's own selection
                forced_i2 = [[np.sort(got_sel[row, j]) if not c.coverage or np.any(got_sel[row, j] >= 0)
                              else np.flatnonzero(valid[row]) for j in range(c.n_head_kv)] for row in range(c.n_rows)]
                want = ref.sparq_attention(q, K, V, i2=forced_i2, q_sel=q_sel, K_sel=K_sel, **kw)
        i2_used = forced_i2 if forced_i2 is not None else (None if c.per_head or c.baseline else info["i2"])
        # the naive fp32 implementation, on the same selection
        f32 = lambda x: None if x is None else x.astype(np.float32)  # noqa: E731
        naive = ref.sparq_attention(q.astype(np.float32), K.astype(np.float32), V.astype(np.float32),
                                    dtype=np.float32, i2=i2_used, q_sel=f32(q_sel), K_sel=f32(K_sel),
                                    **{**kw, "mask": f32(mask), "vbar": f32(vbar), "comp_w": f32(comp_w)})
        got = out[st].astype(np.float64)
        assert np.all(np.isfinite(got)), f"{c.id}: non-finite output"
        err = float(np.max(np.abs(got - want)))
        err_naive = float(np.max(np.abs(naive.astype(np.float64) - want)))
        floor = 2e-6 * max(1.0, float(np.max(np.abs(want))))
        assert err <= 2.0 * err_naive + floor, (
            f"{c.id}: max error {err:.3g} vs fp64 exceeds 2x the naive fp32 error {err_naive:.3g} (+{floor:.1g})")
        stats["rows"] += c.n_rows
        stats["err"] = max(stats["err"], err)
        stats["naive"] = max(stats["naive"], err_naive)
    return stats


def grid(quick: bool = False) -> list[Case]:
    """The kernels' test grid: head sizes 64/80/128/256, S 1..~33000, r 1..d, k 1..beyond S,
    l 0 and k/4, group sizes 1/4/8 with 1..8 KV heads, 1 and several query rows,
    masks with holes and padding, f16, f32, q8_0 and the 4- and 5-bit caches."""
    cases = []
    seed = 100
    def add(**kw):
        nonlocal seed
        seed += 1
        cases.append(Case(seed=seed, **kw))
    # head sizes x cache types, decode shape
    for d in (64, 80, 128, 256):
        for kv in ("f16", "f32"):
            add(d=d, S=1000 + d, r=max(1, d // 8), k=64, l=16, n_head=4, n_head_kv=1, kv_type=kv)
    # S sweep, including S <= k (exact) and long contexts
    for S in (1, 2, 7, 64, 128, 129, 300, 4097):
        add(d=128, S=S, r=16, k=128, l=32, n_head=8, n_head_kv=2)
    for S in ((16384,) if quick else (16384, 33000)):
        add(d=128, S=S, r=16, k=128, l=32, n_head=4, n_head_kv=1, mask="pad")
    # r from 1 to d
    for r in (1, 2, 31, 64, 127, 128):
        add(d=128, S=700, r=r, k=32, l=8, n_head=4, n_head_kv=4)
    # k from 1 to beyond S, l = 0 and k/4
    for k, l in ((1, 0), (1, 1), (4, 1), (50, 0), (50, 12), (600, 150), (2000, 500)):
        add(d=64, S=1500, r=8, k=k, l=l, n_head=8, n_head_kv=1)
    # group sizes 1, 4, 8 with 1..8 KV heads
    for g, hkv in ((1, 1), (1, 8), (4, 2), (4, 8), (8, 1), (8, 3), (2, 5)):
        add(d=80, S=900, r=10, k=40, l=10, n_head=g * hkv, n_head_kv=hkv)
    # masks: holes, padding, none, f32 masks, several query rows (causal), streams
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=2, mask="holes")
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=2, mask="pad", mask_type="f32")
    add(d=128, S=2000, r=16, k=100, l=0, n_head=4, n_head_kv=2, mask="none")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=5, n_head=4, n_head_kv=1, mask="causal")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=3, n_head=8, n_head_kv=8, mask="causal", kv_type="f32")
    add(d=128, S=1500, r=16, k=64, l=16, n_stream=3, n_head=4, n_head_kv=1, mask="pad")
    add(d=128, S=1500, r=16, k=64, l=16, n_stream=2, n_rows=2, n_head=8, n_head_kv=2, mask="causal",
        kt_pad=37)
    add(d=256, S=3000, r=32, k=128, l=32, n_head=4, n_head_kv=1, mask="holes", kt_pad=100)
    # the window given explicitly (cells of the most recent positions)
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", win="tail")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=4, n_head=8, n_head_kv=2, mask="causal", win="tail")
    add(d=128, S=1500, r=16, k=64, l=64, n_stream=2, n_head=4, n_head_kv=4, mask="pad", win="tail")
    # window cells that are not the last cells by index (positions out of cell order)
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", win="random")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=4, n_head=8, n_head_kv=2, mask="causal", win="random")
    # selectors and flags (docs/architecture.md, "Selectors")
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", selector="oracle")
    add(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="pad", selector="oracle", per_head=True)
    add(d=128, S=2000, r=16, k=64, l=16, n_head=4, n_head_kv=1, mask="holes", per_head=True)
    add(d=64, S=1200, r=8, k=40, l=0, n_head=8, n_head_kv=1, mask="pad", per_head=True, kv_type="f32")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=3, n_head=4, n_head_kv=1, mask="causal", per_head=True, win="random")
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=2, mask="holes", mean_v=False)
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", basis=True)
    add(d=64, S=1500, r=8, k=64, l=16, n_head=4, n_head_kv=2, mask="pad", basis=True, per_head=True, win="random")
    add(d=80, S=900, r=10, k=40, l=10, n_head=4, n_head_kv=4, mask="none", basis=True, kv_type="f32")
    # the paper's baselines: LM-Infinite (window + sinks) and H2O (window + heavy hitters)
    add(d=128, S=2000, r=16, k=100, l=84, n_head=4, n_head_kv=1, mask="holes", selector="streaming")
    add(d=64, S=1200, r=8, k=64, l=48, n_rows=4, n_head=8, n_head_kv=2, mask="causal", selector="streaming", win="random")
    add(d=128, S=1500, r=16, k=64, l=0, n_stream=2, n_head=4, n_head_kv=4, mask="pad", selector="streaming", win="tail")
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", selector="h2o")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=4, n_head=8, n_head_kv=2, mask="causal", selector="h2o", win="random",
        kv_type="f32")
    add(d=128, S=1500, r=16, k=64, l=16, n_stream=3, n_head=4, n_head_kv=1, mask="pad", selector="h2o", win="tail",
        dense_streams=(1,))
    add(d=64, S=50, r=8, k=64, l=16, n_stream=2, n_head=4, n_head_kv=2, mask="pad", selector="h2o")
    # the calibrated k: the fewest cells reaching a coverage target, between k_min and k
    add(d=128, S=2000, r=16, k=600, l=32, n_head=4, n_head_kv=4, mask="holes", coverage=0.5, k_min=64)
    add(d=64, S=1500, r=16, k=400, l=16, n_head=8, n_head_kv=2, mask="pad", coverage=0.9, k_min=32, win="random")
    add(d=64, S=1500, r=8, k=300, l=16, n_head=6, n_head_kv=2, mask="holes", coverage=0.7, k_min=24, per_head=True)
    add(d=128, S=1200, r=16, k=500, l=16, n_rows=3, n_head=4, n_head_kv=1, mask="causal", coverage=0.99, k_min=64,
        win="tail")
    add(d=64, S=1500, r=8, k=200, l=16, n_head=4, n_head_kv=1, mask="pad", coverage=0.3, k_min=20, selector="oracle")
    add(d=64, S=900, r=8, k=100, l=0, n_head=4, n_head_kv=4, mask="none", coverage=0.05, k_min=1, kv_type="f32")
    # the vector-index selector (IVF): lists probed, cells assigned on the fly
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", selector="index")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=4, n_head=8, n_head_kv=2, mask="causal", selector="index", win="random",
        kv_type="f32", n_list=32, n_probe=8)
    add(d=128, S=1500, r=16, k=64, l=0, n_stream=2, n_head=4, n_head_kv=4, mask="pad", selector="index", n_list=8,
        n_probe=8)
    add(d=64, S=3000, r=8, k=600, l=16, n_head=4, n_head_kv=1, mask="none", selector="index", n_list=64, n_probe=2)
    add(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", selector="index", per_head=True,
        n_list=16, n_probe=3)
    add(d=128, S=1200, r=16, k=40, l=8, n_rows=3, n_head=4, n_head_kv=1, mask="causal", selector="index", per_head=True,
        win="random", kv_type="f32")
    # streams marked dense (prompt rows batched as single rows beside decode steps)
    add(d=128, S=2000, r=16, k=64, l=16, n_stream=3, n_head=4, n_head_kv=1, mask="pad", win="tail", dense_streams=(1,))
    add(d=64, S=1500, r=8, k=64, l=16, n_stream=2, n_head=8, n_head_kv=2, mask="holes", per_head=True,
        dense_streams=(0,), kv_type="f32")
    # group sizes above 64 (e.g. Falcon-7B's 71 query heads on one KV head)
    add(d=64, S=800, r=8, k=64, l=16, n_head=71, n_head_kv=1, mask="holes")
    add(d=64, S=800, r=8, k=32, l=8, n_head=80, n_head_kv=1, mask="pad", per_head=True)
    if quick:
        cases = cases[::3]
    # a q8_0 cache (K and V rows in blocks, K^T f16 of the dequantized keys), in the quick grid too:
    # GQA and head sizes 64 to 256, exact attention (S <= k), several rows, the calibrated k, the
    # selectors that read K rows themselves (index, h2o), a dense stream, a basis
    n = len(cases)
    add(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kv_type="q8_0")
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="pad", kt_pad=37, kv_type="q8_0")
    add(d=256, S=3000, r=64, k=128, l=32, n_head=4, n_head_kv=1, mask="holes", kv_type="q8_0")
    add(d=64, S=100, r=16, k=128, l=32, n_head=9, n_head_kv=3, mask="pad", kv_type="q8_0")
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=3, n_head=4, n_head_kv=1, mask="causal", kv_type="q8_0")
    add(d=64, S=1500, r=16, k=400, l=16, n_head=8, n_head_kv=2, mask="pad", coverage=0.9, k_min=32, win="random",
        kv_type="q8_0")
    add(d=64, S=1200, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", selector="index", n_list=16, n_probe=4,
        kv_type="q8_0")
    add(d=128, S=1500, r=16, k=64, l=16, n_stream=3, n_head=4, n_head_kv=1, mask="pad", selector="h2o", win="tail",
        dense_streams=(1,), kv_type="q8_0")
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", basis=True, kv_type="q8_0")
    add(d=64, S=1500, r=8, k=64, l=16, n_stream=2, n_head=8, n_head_kv=2, mask="holes", per_head=True,
        dense_streams=(0,), kv_type="q8_0")
    quick_q8 = (0, 3, 4, 5, 6, 7)  # GQA, exact, rows, calibrated k, index, h2o with a dense stream
    q8_shapes = cases[n:]
    cases = cases if not quick else cases[:n] + [cases[n + i] for i in quick_q8]
    # the 4- and 5-bit caches (one path in the kernels: their blocks dequantized a few at a time), in
    # the quick grid too: the q8_0 shapes again, two per type, so that together they take every one
    for i, c8 in enumerate(q8_shapes):
        kw = {f: v for f, v in dataclasses.asdict(c8).items() if f != "seed"}
        add(**{**kw, "kv_type": BLOCK_KV_TYPES[i % len(BLOCK_KV_TYPES)]})
    # K^T in 8 bits (e5m2), in the quick grid too: f16, f32 (rounded to f16 first) and q8_0 keys, vector
    # tails and a padded K^T, GQA, several rows, a basis, the oracle, the calibrated k
    for kw in (dict(d=128, S=2000, r=32, k=100, l=25, n_head=4, n_head_kv=1, mask="holes"),
               dict(d=80, S=903, r=10, k=40, l=10, n_head=8, n_head_kv=2, mask="pad", kt_pad=37),
               dict(d=64, S=1500, r=16, k=64, l=16, n_head=8, n_head_kv=2, mask="pad", kv_type="f32"),
               dict(d=64, S=1200, r=8, k=64, l=16, n_rows=3, n_head=4, n_head_kv=1, mask="causal", win="random"),
               dict(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", basis=True),
               dict(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kv_type="q8_0"),
               dict(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kv_type="q4_1"),
               dict(d=64, S=1500, r=8, k=64, l=16, n_head=4, n_head_kv=1, mask="pad", selector="oracle"),
               dict(d=64, S=1500, r=16, k=400, l=16, n_head=8, n_head_kv=2, mask="pad", coverage=0.9, k_min=32),
               dict(d=64, S=33, r=8, k=64, l=16, n_head=4, n_head_kv=2, mask="pad")):
        add(kt_bits=8, **kw)
    # K^T in 4 bits (blocks of 32 cells, S and the padded row multiples of 32), in the quick grid too:
    # f16, f32 (to f16 first) and q8_0 keys, a padded K^T, GQA and MHA (chunk ends inside a block),
    # several rows and streams, per head, a basis, the oracle, the calibrated k
    for kw in (dict(d=128, S=1024, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes"),
               dict(d=64, S=1504, r=24, k=64, l=16, n_head=8, n_head_kv=2, mask="pad", kv_type="f32", kt_pad=32),
               dict(d=64, S=1216, r=8, k=64, l=16, n_rows=3, n_stream=2, n_head=4, n_head_kv=4, mask="causal",
                    win="random"),
               dict(d=64, S=992, r=12, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", per_head=True),
               dict(d=128, S=2016, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", basis=True),
               dict(d=64, S=1504, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kv_type="q8_0"),
               dict(d=64, S=1504, r=8, k=64, l=16, n_head=4, n_head_kv=1, mask="pad", selector="oracle"),
               dict(d=64, S=1504, r=16, k=400, l=16, n_head=8, n_head_kv=2, mask="pad", coverage=0.9, k_min=32)):
        add(kt_bits=4, **kw)
    # the approximate bucketed top-k, in the quick grid too: GQA shared and per head, a given window
    # out of cell order, several rows and streams, the oracle, a bucket per cell (exact), q8_0, e5m2
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=1, mask="holes", topk_buckets=200)
    add(d=64, S=1500, r=8, k=64, l=16, n_stream=2, n_rows=4, n_head=8, n_head_kv=2, mask="causal", win="random",
        topk_buckets=64)
    add(d=64, S=1500, r=8, k=64, l=32, n_rows=4, n_head=4, n_head_kv=1, mask="causal", win="random", per_head=True,
        topk_buckets=80)
    add(d=64, S=1200, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", per_head=True, topk_buckets=128)
    add(d=128, S=1500, r=16, k=64, l=16, n_stream=2, n_rows=2, n_head=4, n_head_kv=1, mask="causal", selector="oracle",
        topk_buckets=96)
    add(d=64, S=900, r=8, k=40, l=0, n_head=4, n_head_kv=4, mask="none", kv_type="f32", topk_buckets=5000)
    add(d=64, S=1500, r=16, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kv_type="q8_0", kt_bits=8,
        topk_buckets=256)
    # the attention variants, in the quick grid too: soft-capping, ALiBi (6 heads: the slopes past the
    # largest power of 2), sinks, all three; GQA and not, per head, the calibrated k, exact rows, a dense
    # stream, q8_0, the oracle and the baselines' step 4
    add(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", softcap=2.0)
    add(d=128, S=2000, r=16, k=100, l=25, n_head=4, n_head_kv=4, mask="pad", kv_type="f32", softcap=3.0)
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=3, n_head=6, n_head_kv=2, mask="alibi", max_bias=8.0)
    add(d=128, S=1500, r=16, k=64, l=16, n_head=4, n_head_kv=4, mask="alibi", max_bias=8.0, win="random")
    add(d=64, S=1500, r=16, k=400, l=16, n_head=8, n_head_kv=2, mask="pad", coverage=0.9, k_min=32, sinks=True)
    add(d=64, S=1500, r=8, k=64, l=16, n_stream=2, n_head=4, n_head_kv=1, mask="holes", dense_streams=(1,), sinks=True)
    add(d=64, S=1200, r=8, k=300, l=16, n_head=6, n_head_kv=2, mask="alibi", coverage=0.7, k_min=24, per_head=True,
        softcap=4.0, max_bias=8.0, sinks=True)
    add(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="alibi", kv_type="q8_0", softcap=2.0, max_bias=4.0,
        sinks=True)
    add(d=64, S=100, r=16, k=128, l=32, n_head=8, n_head_kv=2, mask="alibi", softcap=2.0, max_bias=8.0, sinks=True)
    add(d=64, S=1500, r=8, k=200, l=16, n_head=4, n_head_kv=1, mask="pad", coverage=0.3, k_min=20, selector="oracle",
        softcap=2.0, sinks=True)
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=2, n_head=8, n_head_kv=2, mask="alibi", selector="h2o", max_bias=8.0,
        sinks=True, softcap=3.0)
    # a KQ bias (T5's position bias, per row, query head and cell), in the quick grid too: GQA and not,
    # several rows and streams with a causal mask, per head, the calibrated k, exact rows, a dense stream,
    # with the other variants, q8_0, e5m2, the oracle and a baseline's step 4
    add(d=64, S=1500, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kq_b=True)
    add(d=64, S=1200, r=16, k=64, l=16, n_stream=2, n_rows=3, n_head=4, n_head_kv=4, mask="causal", win="random",
        kq_b=True)
    add(d=64, S=1500, r=8, k=300, l=16, n_head=8, n_head_kv=2, mask="pad", coverage=0.9, k_min=32, per_head=True,
        kq_b=True)
    add(d=64, S=1500, r=16, k=400, l=16, n_stream=2, n_head=8, n_head_kv=2, mask="holes", coverage=0.8, k_min=24,
        dense_streams=(1,), kq_b=True, sinks=True)
    add(d=64, S=1200, r=8, k=64, l=16, n_head=6, n_head_kv=2, mask="alibi", kv_type="q8_0", kt_bits=8, softcap=2.0,
        max_bias=8.0, kq_b=True)
    add(d=64, S=100, r=16, k=128, l=32, n_head=8, n_head_kv=2, mask="causal", kq_b=True)
    add(d=64, S=1500, r=8, k=200, l=16, n_head=4, n_head_kv=1, mask="pad", selector="oracle", kq_b=True)
    add(d=64, S=1200, r=8, k=64, l=16, n_rows=2, n_head=8, n_head_kv=2, mask="holes", selector="h2o", kq_b=True)
    # K and V head sizes that differ, in the quick grid too: DeepSeek's and MiniCPM3's unabsorbed heads
    # (K = a no-position part and a RoPE part), a V wider than K; MLA's absorbed decode (one latent KV
    # head of 576 for every query head, V the first 512 of each K row, read through K's rows) with a
    # fixed k, several rows, the calibrated k, per head, q8_0 and a 4-bit cache, e5m2
    add(d=192, dv=128, S=1500, r=24, k=64, l=16, n_head=8, n_head_kv=8, mask="holes")
    add(d=96, dv=64, S=1200, r=16, k=300, l=16, n_head=4, n_head_kv=4, mask="pad", coverage=0.9, k_min=32)
    add(d=64, dv=128, S=1000, r=8, k=64, l=16, n_head=8, n_head_kv=2, mask="holes", kv_type="f32")
    add(d=576, dv=512, S=1500, r=72, k=128, l=32, n_head=16, n_head_kv=1, mask="holes", v_view=True)
    add(d=576, dv=512, S=1200, r=72, k=64, l=16, n_rows=3, n_head=16, n_head_kv=1, mask="causal", v_view=True,
        win="random")
    add(d=576, dv=512, S=1500, r=160, k=400, l=32, n_head=16, n_head_kv=1, mask="pad", coverage=0.9, k_min=64,
        v_view=True, kt_bits=8)
    add(d=576, dv=512, S=1200, r=72, k=64, l=16, n_head=8, n_head_kv=1, mask="holes", per_head=True, v_view=True,
        kv_type="q8_0")
    add(d=576, dv=512, S=1000, r=72, k=64, l=16, n_head=4, n_head_kv=1, mask="pad", v_view=True, kv_type="q4_0")
    add(d=576, dv=512, S=100, r=72, k=128, l=32, n_head=16, n_head_kv=1, mask="pad", v_view=True)
    return cases
