"""``python bench/coverage.py rootcause``: why a way of choosing the cells loses Gemma 3's passkeys,
measured on the model's own captured tensors (the coverage driver's second subcommand)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS, command_line, cpu_model, git_commit, write_json  # noqa: E402
from sparq_lab import reference  # noqa: E402
from sparq_lab.capture import Capture, op_params, stream0  # noqa: E402


ROOTCAUSE_DOC = """Why SparQ loses passkeys on Gemma 3 270M: the selection measured on the model's own tensors.

Runs passkey prompts on Gemma 3 270M with SparQ on, feeds the answer dense attention gives
(teacher forcing, so every variant sees the same steps), and captures the inputs and the
output of every SparQ call (q, K, V, mask, V sums, window: ``sparq_lab.capture``) at the
decode steps that produce the answer. On those tensors, per global layer and query head:

- the share of the exact softmax mass (dense attention's probabilities) that each
  variant's selected cells hold: SparQ as in the paper (group-shared), SparQ with per-head
  selection, the oracle top-k (exact scores; shared and per head), SparQ in a PCA basis of
  the keys (components chosen by |q'| or by |q'| times the keys' spread);
- the relative error of the attention output against dense, with and without mean-V;
- the fork's op output against the NumPy reference on the same tensors (a bug shows here).

    python bench/coverage.py rootcause [--lengths 110,220] [--steps 6] [--tag rootcause_gemma3]

Writes bench/results/<tag>.{json,md}.
"""


KEYS = ((0.3, 24402), (0.5, 25005), (0.7, 65997))


def passkey_tokens(llm, n_filler, depth, key):
    from llama_sparq.eval import passkey_text

    return llm.tokenize(passkey_text(key, n_filler, depth).encode())


def greedy(llm, toks, n):
    """The first n tokens of the greedy continuation of toks."""
    llm.reset()
    out = []
    for t in llm.generate(toks, temp=0.0):
        out.append(t)
        if len(out) >= n:
            break
    return out


def softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    return e / np.maximum(e.sum(-1, keepdims=True), 1e-300)


def topk_idx(score, k, exclude):
    s = score.copy()
    s[exclude] = -np.inf
    return np.argsort(-s, kind="stable")[:k]


def analyse_call(c, r, k, l):
    """Metrics of one captured call (one KV head; g query heads)."""
    x = stream0(c)
    q, K, V, mask, vbar = x["q"], x["K"], x["V"], x["mask"], x["vbar"]
    p = op_params(c)
    scale = p["scale"]
    n_head, d = q.shape[1], q.shape[2]
    hkv = K.shape[1]
    g = n_head // hkv
    valid = np.isfinite(mask[0]) if mask is not None else np.ones(K.shape[0], bool)
    cells = np.flatnonzero(valid)
    # the window: the cells the graph gave (most recent positions)
    win = np.array(x["win"], dtype=np.int64) if x["win"] else cells[-l:]
    win = win[:l]
    res = {"layer": c["layer"], "S": int(valid.sum()), "g": g, "d": d}

    # the op against the reference on the same tensors (same window: pass it as forced i2 check)
    ref_out, info = reference.sparq_attention(q, K, V, r=r, k=k, l=l, mask=mask, scale=scale, vbar=vbar,
                                              return_info=True)
    op_out = x["out"]
    res["op_vs_ref_max_rel"] = float(np.abs(op_out - ref_out).max() / max(np.abs(ref_out).max(), 1e-30))
    dense = reference.dense_attention(q, K, V, mask=mask, scale=scale)
    nrm = np.linalg.norm(dense[0], axis=-1)

    out = {}
    for j in range(hkv):
        qh = q[0, j * g:(j + 1) * g]                       # (g, d)
        Kj, Vj = K[:, j], V[:, j]
        logit = qh @ Kj.T * scale
        logit[:, ~valid] = -np.inf
        P = softmax(logit)                                 # exact probabilities (g, S)
        excl = ~valid.copy()
        excl[win] = True
        kk = k - len(win)

        def cov(sel):  # per head exact mass on a cell set
            return P[:, np.asarray(sorted(set(sel.tolist())), dtype=np.int64)].sum(-1)

        def approx_probs(qb, Kb, i1, w=None):
            qs = qb[:, i1]
            wq = np.abs(qb) if w is None else np.abs(qb) * w
            f = scale * np.sqrt(wq.sum(-1) / np.maximum(wq[:, i1].sum(-1), 1e-30))
            a = (qs @ Kb[:, i1].T) * f[:, None]
            a[:, ~valid] = -np.inf
            return softmax(a)

        def pick(shat, per_head, kh=kk):
            if per_head:
                sel = np.concatenate([topk_idx(shat[h], kh, excl) for h in range(g)])
            else:
                sel = topk_idx(shat.sum(0), kh, excl)
            return np.unique(np.concatenate([sel, win]))

        def output(sel, shat, mean_v=True):
            sel = np.asarray(sel)
            lg = logit[:, sel]
            y = softmax(lg) @ Vj[sel]
            if not mean_v:
                return y
            alpha = shat[:, sel].sum(-1)[:, None]
            return alpha * y + (1 - alpha) * vbar[j][None]

        def err(y):
            return np.linalg.norm(y - dense[0, j * g:(j + 1) * g], axis=-1) / nrm[j * g:(j + 1) * g]

        i1 = np.sort(np.argsort(-np.abs(qh).sum(0), kind="stable")[:r])
        shat = approx_probs(qh, Kj, i1)
        variants = {}
        sel = pick(shat, False)
        variants["sparq_shared"] = (sel, shat)
        variants["sparq_per_head"] = (pick(shat, True), shat)
        variants["sparq_per_head_k/g"] = (pick(shat, True, max(1, kk // g)), shat)
        variants["oracle_shared"] = (pick(P, False), P)
        variants["oracle_per_head"] = (pick(P, True), P)
        variants["oracle_per_head_k/g"] = (pick(P, True, max(1, kk // g)), P)
        # a PCA basis of this layer's keys (second moment over the valid cells)
        M = Kj[valid].T @ Kj[valid] / valid.sum()
        ev, U = np.linalg.eigh(M)
        U = U[:, ::-1]
        sig = np.sqrt(np.maximum(ev[::-1], 0))
        qr_, Kr = qh @ U, Kj @ U
        i1p = np.sort(np.argsort(-np.abs(qr_).sum(0), kind="stable")[:r])
        shp = approx_probs(qr_, Kr, i1p)
        variants["pca_sparq_shared"] = (pick(shp, False), shp)
        variants["pca_sparq_per_head"] = (pick(shp, True), shp)
        i1w = np.sort(np.argsort(-(np.abs(qr_) * sig).sum(0), kind="stable")[:r])
        shw = approx_probs(qr_, Kr, i1w, sig)
        variants["pca_weighted_shared"] = (pick(shw, False), shw)
        variants["pca_weighted_per_head"] = (pick(shw, True), shw)
        # the same weighting in the model's own basis (key spread per component)
        sig0 = np.sqrt(np.maximum(np.diag(M), 0))
        i1s = np.sort(np.argsort(-(np.abs(qh) * sig0).sum(0), kind="stable")[:r])
        shs = approx_probs(qh, Kj, i1s, sig0)
        variants["weighted_shared"] = (pick(shs, False), shs)
        for name, (s, sh) in variants.items():
            o = out.setdefault(name, {"coverage": [], "err_meanv": [], "err_no_meanv": [], "n_sel": []})
            o["coverage"].append(cov(s).tolist())
            o["err_meanv"].append(err(output(s, sh, True)).tolist())
            o["err_no_meanv"].append(err(output(s, sh, False)).tolist())
            o["n_sel"].append(int(len(s)))
        # top-r share of |q| mass and of the score's spread
        aq = np.abs(qh).sum(0)
        res.setdefault("q_top_r_l1_share", []).append(float(np.sort(aq)[::-1][:r].sum() / aq.sum()))
        aqp = (np.abs(qr_) * sig).sum(0)
        res.setdefault("pca_top_r_weighted_share", []).append(float(np.sort(aqp)[::-1][:r].sum() / aqp.sum()))
        # how concentrated exact attention is: mass of the best k cells per head
        res.setdefault("exact_topk_mass", []).append(np.sort(P, axis=-1)[:, ::-1][:, :k].sum(-1).tolist())
    res["variants"] = out
    return res


def rootcause_main(argv=None):
    ap = argparse.ArgumentParser(description=ROOTCAUSE_DOC.split("\n")[0])
    ap.add_argument("--lengths", default="110,220", help="filler repetitions per prompt (110 ~ 2.7K tokens)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--r", type=int, default=64)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--l", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="rootcause_gemma3")
    ap.add_argument("--out-dir", default=str(RESULTS))
    a = ap.parse_args(argv)

    from llama_sparq import Llama
    from llama_sparq.models import default_model_path

    model = str(default_model_path())
    lengths = [int(x) for x in a.lengths.split(",")]
    n_ctx = 256 * 30 * max(lengths) // 110 + 1024
    kw = dict(n_ctx=n_ctx, n_threads=a.threads, n_batch=512, verbose=False, logits_all=False)
    dense = Llama(model, flash_attn=True, **kw)
    # the paper's step 1 (the library's default is now the scaled basis)
    sp = Llama(model, sparq_r=a.r, sparq_k=a.k, sparq_l=a.l, sparq_min_kv=0, sparq_basis="model", **kw)
    t0 = time.time()
    calls, prompts = [], []
    for n in lengths:
        for depth, key in KEYS:
            toks = passkey_tokens(dense, n, depth, key)
            out = greedy(dense, toks, a.steps)
            ans_dense = dense.detokenize(out).decode(errors="replace")
            ans_sparq = sp.detokenize(greedy(sp, toks, a.steps)).decode(errors="replace")
            # teacher-forced capture on the dense answer
            # one token per eval: a decode step (several tokens would be a prompt batch, dense)
            sp.reset()
            sp.eval(toks)
            with Capture(sp) as cap:
                for t in out[:-1]:
                    sp.eval([t])
            for c in cap.calls:
                r = analyse_call(c, a.r, a.k, a.l)
                r.update(prompt_len=len(toks), depth=depth, key=key)
                calls.append(r)
            prompts.append(dict(n_tokens=len(toks), depth=depth, key=key, dense=ans_dense, sparq=ans_sparq,
                                found_dense=str(key) in ans_dense, found_sparq=str(key) in ans_sparq))
            print(f"S={len(toks)} depth={depth}: dense {ans_dense!r} sparq {ans_sparq!r} ({len(cap.calls)} calls)",
                  flush=True)
    elapsed = time.time() - t0

    # aggregate per layer and variant
    layers = sorted({c["layer"] for c in calls})
    names = list(calls[0]["variants"].keys())
    agg = {}
    for L in layers:
        cl = [c for c in calls if c["layer"] == L]
        for nme in names:
            cov = np.array([c["variants"][nme]["coverage"] for c in cl]).reshape(len(cl), -1)  # (calls, g)
            e1 = np.array([c["variants"][nme]["err_meanv"] for c in cl]).reshape(len(cl), -1)
            e0 = np.array([c["variants"][nme]["err_no_meanv"] for c in cl]).reshape(len(cl), -1)
            ns = np.array([c["variants"][nme]["n_sel"] for c in cl])
            agg.setdefault(str(L), {})[nme] = {
                "coverage_per_head": cov.mean(0).round(4).tolist(),
                "coverage_mean": float(cov.mean()), "coverage_min": float(cov.min()),
                "err_meanv": float(e1.mean()), "err_no_meanv": float(e0.mean()), "n_sel_mean": float(ns.mean()),
            }
        agg[str(L)]["_q_top_r_l1_share"] = float(np.mean([np.mean(c["q_top_r_l1_share"]) for c in cl]))
        agg[str(L)]["_pca_top_r_weighted_share"] = float(np.mean([np.mean(c["pca_top_r_weighted_share"]) for c in cl]))
        agg[str(L)]["_exact_topk_mass"] = float(np.mean([np.mean(c["exact_topk_mass"]) for c in cl]))
    op_err = max(c["op_vs_ref_max_rel"] for c in calls)

    meta = dict(command=command_line(),
                commit=git_commit(), machine=f"{cpu_model()}, {os.cpu_count()} cores, {a.threads} threads", model="Gemma 3 270M Q4_K_M (F16 cache)",
                r=a.r, k=a.k, l=a.l, steps=a.steps, elapsed_s=round(elapsed, 1),
                n_calls=len(calls), op_vs_reference_max_rel_err=op_err)
    res = dict(meta=meta, prompts=prompts, per_layer=agg)
    outd = Path(a.out_dir)
    outd.mkdir(parents=True, exist_ok=True)
    write_json(outd / f"{a.tag}.json", res)
    lines = [f"# Root cause: SparQ selection on Gemma 3 270M's own tensors ({a.tag})", "",
             f"Command `{meta['command']}`, commit `{meta['commit']}`, machine: {meta['machine']}.",
             f"SparQ r = {a.r}, k = {a.k}, l = {a.l} (d = 256: r/2d = {a.r / 512:.3f}); {len(calls)} SparQ calls "
             f"captured at the {a.steps - 1} teacher-forced decode steps after each prompt; "
             f"fork's op against the NumPy reference on the same tensors: max relative error {op_err:.2e}.", "",
             "| prompt tokens | depth | dense answer | SparQ answer |", "|---|---|---|---|"]
    for p in prompts:
        lines.append(f"| {p['n_tokens']} | {p['depth']} | {p['dense']!r} | {p['sparq']!r} |")
    for L in layers:
        A = agg[str(L)]
        lines += ["", f"## layer {L}: top-r share of sum|q| {A['_q_top_r_l1_share']:.3f}, "
                      f"PCA weighted top-r share {A['_pca_top_r_weighted_share']:.3f}, "
                      f"exact mass of the best k cells {A['_exact_topk_mass']:.3f}", "",
                  "| variant | exact mass held (mean over heads) | per head | min | cells read | out err, mean-V | out err, no mean-V |",
                  "|---|---|---|---|---|---|---|"]
        for nme in names:
            v = A[nme]
            lines.append(f"| {nme} | {v['coverage_mean']:.3f} | {v['coverage_per_head']} | {v['coverage_min']:.3f} | "
                         f"{v['n_sel_mean']:.0f} | {v['err_meanv']:.3f} | {v['err_no_meanv']:.3f} |")
    (outd / f"{a.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


