#!/usr/bin/env python3
"""How many cells attention needs, per layer, and why a way of choosing them loses the
answer, on a real model's own captured tensors:

    python bench/coverage.py [options]               k for 90/95/99 % of the mass and SparQ's recall (the default)
    python bench/coverage.py rootcause ...           the mass each way of choosing cells keeps, on Gemma 3

`python bench/coverage.py coverage -h` and `rootcause -h` list the options.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (RESULTS, dispatch, loadavg, md_bullets, md_table, out_stem, pyplot, run_meta,  # noqa: E402
                      write_csv, write_json)
from coverage_rootcause import rootcause_main  # noqa: E402


# ============================================================================================= coverage

COVERAGE_DOC = """How large must SparQ's budget k be? The exact attention mass the top-k cells hold, per layer
and KV head, on a real model's own decode steps, and how well SparQ's steps 1-2 find those cells.

    python bench/coverage.py --model smollm2|gemma3|PATH [--lengths 1024,2048,4096,6144]
        [--ks 16,32,...,2048] [--fracs 0.01,0.02,0.05,0.1,0.2] [--rs 4,8,16,32,d/8,d/4,d/2]
        [--recall-ks 128,512] [--samples 3] [--steps 4] [--task TASK] [--basis scaled|model]
        [--op-k N] [--kt-formats e5m2,e4m3,int8,int8cell] [--buckets 2,4,8,16]
        [--tag coverage_<model>] [--out-dir bench/results]

The model runs with SparQ forced on (``sparq_min_kv=0``) but with ``k`` at the context size and no
local window, so every decode step runs the op and the op attends over every cell (exact attention):
the captured steps are the dense model's, whatever the budget being measured (``--op-k N`` runs a
real budget instead, and measures on the trajectory SparQ at that k produces).
For each length, ``--samples`` prompts from ``llama_sparq.eval.make_sample`` (``--task``; default
for SmolLM2 ``chat_multikey``, four magic numbers in story filler and a question on one, formatted
by the GGUF's chat template as ``create_chat_completion`` sends it; for Gemma 3 and a path
``passkey``, the completion prompt; depths 0.5, 0.25, 0.75) are prefilled, and ``--steps`` greedy
decode steps (the first one is the prompt's last token: the step that produces the answer's first
token) run under ``sparq_lab.capture.Capture``. On every ``sparq_attn-<layer>`` call
(``capture.stream_view``), per KV head:

- **coverage**: the exact softmax over the valid cells per query head
  (``reference.combined_scores`` with r = d, per head), and the share of that mass held by the
  top-k cells, for every k: each head's own top-k (``head``), and the group's shared choice,
  the top-k by the group's summed probabilities as SparQ's shared choice picks (``group``: mean
  over the heads; ``covmin_group``: the worst head). Read at ``--ks`` and at ``--fracs`` of S.
- **k90 / k95 / k99**: the smallest k whose cells hold 90 / 95 / 99 % of the mass (mean over the
  group's heads; ``groupall``: of every head of the group).
- **recall** of SparQ's steps 1-2 at r in ``--rs`` and k in ``--recall-ks``: the approximate
  scores (``reference.combined_scores`` at r, with the component weights of ``--basis``: the op's
  captured ones for ``scaled``), their top-k against the exact group top-k: ``overlap`` = |both| / k,
  ``massratio`` = the exact mass the approximate top-k holds / the exact top-k's; ``sparqmass``: the
  same ratio for SparQ's whole choice (steps 1-3 with the window l = k/4,
  ``reference.sparq_attention``'s i2).
- ``--kt-formats``: the same recall with steps 1-3 reading K^T stored in 8 or 4 bits instead of f16
  (fields ``<metric><format>_...``): ``e5m2`` (f16's upper byte, rounded to nearest even: the
  reference's ``round_e5m2``, what ``sparq_kt_bits=8`` stores), ``e4m3``
  (3 mantissa bits, no scale, saturating at 448), ``int8`` (per component and block of 32 cells, an
  absmax scale), ``int8cell`` (per cell and KV head, the key's absmax over its components); in 4
  bits ``kt4`` (``reference.round_kt4``, what ``sparq_kt_bits=4`` stores: blocks of 32 cells, a
  power-of-two scale each, floor bins read at their midpoints), ``int4`` (blocks of 32 cells, an
  absmax scale, round to nearest) and ``e5m2nib`` (e5m2's top nibble: sign and 3 exponent bits). Exact
  scores and the component weights stay those of the f16 keys: what a narrower K^T would change is
  only which cells steps 1-3 choose.
- ``--buckets``: the same recall with step 3's exact top-k replaced by the approximate bucketed
  top-k (``reference.sparq_attention``'s ``topk_buckets``: the best cell of each of B = m x k
  buckets of the cells by index modulo B, then the k best of those) for each multiple m given
  (fields ``<metric>b<m>_...``), on the same approximate scores.

Writes ``<out-dir>/<tag>.csv`` (one row per prompt, step, layer and KV head), ``<tag>.json``
(metadata, per length x layer and per length x layer x KV head means with the spread over the
prompts, the coverage curves), ``<tag>.md`` (tables) and ``<tag>.png`` (coverage against k, one
line per layer, one panel per length; recall against r; k90 and k99 per layer).
"""


MODELS = {  # the defaults of each named model
    "smollm2": dict(lengths="1024,2048,4096,6144", task="chat_multikey",
                    name="SmolLM2-135M-Instruct Q4_1"),
    "gemma3": dict(lengths="4096,8192,16384", task="passkey", name="Gemma 3 270M Q4_K_M"),
}
DEPTHS = (0.5, 0.25, 0.75)
LEVELS = (90, 95, 99)
PLOT_KS = np.unique(np.round(2.0 ** np.arange(0, 15.01, 0.25)).astype(int))  # 1 .. 32768


# ----------------------------------------------------------------------------- model and prompts

def model_path(name) -> str:
    """The GGUF of a named model (gemma3, smollm2: ``models.resolve_model``) or the path given."""
    from llama_sparq.models import resolve_model

    path = resolve_model(name)
    if not path.is_file():
        raise SystemExit(f"--model: {name!r} is neither smollm2, gemma3 nor a GGUF file")
    return str(path)


def parse_rs(text, d) -> list[int]:
    """--rs: integers or d/N, kept in 1..d, sorted, without repeats."""
    out = set()
    for tok in text.split(","):
        tok = tok.strip()
        v = d // int(tok[2:]) if tok.startswith("d/") else (d if tok == "d" else int(tok))
        if 1 <= v <= d:
            out.add(v)
    return sorted(out)


def prompt_tokens(llm, task, n_tokens, depth, seed, n_ctx, steps) -> list[int]:
    """The tokens of eval.make_sample's prompt of about n_tokens tokens: for a chat task the user
    message in the model's chat template with the assistant's turn opened (``eval.chat_tokenizer``,
    what create_chat_completion sends), else the completion prompt."""
    from llama_sparq.eval import CHAT_TASKS, chat_tokenizer, make_sample

    if task in CHAT_TASKS:
        if not llm.metadata.get("tokenizer.chat_template"):
            raise SystemExit(f"--task {task}: the model has no chat template (tokenizer.chat_template)")
        tokenize = chat_tokenizer(llm)
    else:
        tokenize = lambda s: llm.tokenize(s.encode())  # noqa: E731
    text, _, _ = make_sample(task, n_tokens, depth, seed, tokenize)
    return tokenize(text)[-(n_ctx - steps - 2):]


# ----------------------------------------------------------------------------- the core computation

def k_reaching(cum, level) -> np.ndarray:
    """The smallest k whose cells hold `level` of the mass, per curve (cum: (..., S), non-decreasing
    cumulative mass of the cells in order); S where no k reaches it (rounding)."""
    reached = cum >= level - 1e-12
    return np.where(reached.any(-1), reached.argmax(-1) + 1, cum.shape[-1])


def curves(P, valid):
    """Cumulative exact mass (hkv, g, Sv) of each head's own best cells (``head``) and of the group's
    shared choice (``group``: cells ranked by the group's summed probabilities), and that order."""
    Pv = P[..., valid]                                         # (hkv, g, Sv)
    head = np.cumsum(-np.sort(-Pv, axis=-1), axis=-1)
    order = np.argsort(-Pv.sum(1), axis=-1, kind="stable")     # (hkv, Sv), indices into the valid cells
    group = np.cumsum(np.take_along_axis(Pv, order[:, None, :], axis=-1), axis=-1)
    return head, group, order


def hadamard(n) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of size n (a power of 2) that upstream's KV cache rotates q
    and k with for a quantized K cache (Sylvester's construction, symmetric: H H = I)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def hadamard_size(d) -> int:
    """The rotation's size upstream uses for head size d (llama_kv_cache::build_input_k_rot): the largest
    power of 2 (>= 64) dividing d; 0 where it does not rotate (d % 64 != 0)."""
    if d % 64:
        return 0
    n = 64
    while d % (2 * n) == 0:
        n *= 2
    return n


def rotate_back(x, n):
    """x (..., d) with each block of n components multiplied by H (its own inverse)."""
    shape = x.shape
    return (x.reshape(*shape[:-1], shape[-1] // n, n) @ hadamard(n)).reshape(shape)


def fp8_round(x, mant_bits, min_exp, max_val):
    """x rounded to a float format with mant_bits mantissa bits, normals down to 2^min_exp (then
    subnormals), saturating at +-max_val (round half to even, as a hardware conversion)."""
    x = np.asarray(x, np.float64)
    _, e = np.frexp(x)                                    # |x| = m 2^e, m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(e - 1, min_exp) - mant_bits)
    return np.clip(np.round(x / quantum) * quantum, -max_val, max_val)


def int8_blocks(K, block=32):
    """K (S, hkv, d) as int8 per KV head, component and block of `block` cells with an absmax scale."""
    S = K.shape[0]
    pad = (-S) % block
    Kp = np.concatenate([K, np.zeros((pad,) + K.shape[1:], K.dtype)]) if pad else K
    B = Kp.reshape(-1, block, *K.shape[1:]).astype(np.float64)
    return int8_absmax(B, axis=1).reshape(Kp.shape)[:S]


def int8_cells(K):
    """K (S, hkv, d) as int8 per cell and KV head (the key's own absmax over its d components): an
    append would quantize one key alone, with no block to redo."""
    return int8_absmax(K.astype(np.float64), axis=-1)


def int8_absmax(x, axis):
    """x as int8 values times a scale per slice along ``axis`` (its absmax / 127, the scale itself
    stored in f16)."""
    scale = fp8_round(np.abs(x).max(axis=axis, keepdims=True) / 127.0, 10, -14, 65504.0)
    q = np.where(scale > 0, np.round(x / np.where(scale > 0, scale, 1.0)), 0.0)
    return q * scale


def _e5m2(K):
    from sparq_lab.reference import round_e5m2  # the fork's own rounding (sparq_kt_bits=8)

    return round_e5m2(K).astype(np.float64)


def int4_blocks(K, block=32):
    """K (S, hkv, d) as int4 (-7..7) per KV head, component and block of ``block`` cells, an absmax
    scale in f16, round to nearest: the best a 4-bit block can do, but a block's scale would move
    with every append that raises its absmax (its other cells rounded twice)."""
    S = K.shape[0]
    pad = (-S) % block
    Kp = np.concatenate([K, np.zeros((pad,) + K.shape[1:], K.dtype)]) if pad else K
    B = Kp.reshape(-1, block, *K.shape[1:]).astype(np.float64)
    scale = fp8_round(np.abs(B).max(axis=1, keepdims=True) / 7.0, 10, -14, 65504.0)
    q = np.where(scale > 0, np.clip(np.round(B / np.where(scale > 0, scale, 1.0)), -7, 7), 0.0)
    return (q * scale).reshape(Kp.shape)[:S]


def e5m2_nibble(K):
    """K as the top nibble of its e5m2 byte (sign and the 3 upper exponent bits: powers of 16 apart,
    no scale), rounded to nearest on the f16 bits."""
    h = np.asarray(K, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    b = np.minimum(((h & 0x7FFF) + 0x7FF + ((h >> 12) & 1)) >> 12, 0x7) | ((h >> 12) & 0x8)
    return (b.astype(np.uint16) << 12).view(np.float16).astype(np.float64)


def _kt4(K):
    from sparq_lab.reference import round_kt4  # the fork's own 4-bit K^T (sparq_kt_bits=4)

    return round_kt4(K).astype(np.float64)


BUCKET_MULTS = range(1, 65)  # --buckets' allowed multiples of k

KT_FORMATS = {  # an 8- or 4-bit K^T, as the values steps 1-3 would read (from the f16 keys)
    "e5m2": _e5m2,
    "e4m3": lambda K: fp8_round(K.astype(np.float16), 3, -6, 448.0),
    "int8": lambda K: int8_blocks(K.astype(np.float16)),
    "int8cell": lambda K: int8_cells(K.astype(np.float16)),
    # 4 bits: the fork's kt_bits=4, int4 with an absmax scale, e5m2's top nibble
    "kt4": _kt4,
    "int4": lambda K: int4_blocks(K.astype(np.float16)),
    "e5m2nib": e5m2_nibble,
}


def call_metrics(x, scale, *, ks, fracs, rs, recall_ks, basis="scaled", unrotate=0, kt_formats=(), buckets=()):
    """The metrics of one captured SparQ call (``capture.stream_view``'s dict), one dict per KV head.
    unrotate n > 0: the call's q and K are in upstream's Hadamard-rotated basis (size n); the recall is
    also measured with them rotated back (fields ``<metric>hb_...``), same steps, same exact scores."""
    from sparq_lab import reference

    q, K, V, mask = x["q"], x["K"], x["V"], x["mask"]
    d = q.shape[-1]
    valid = np.isfinite(mask[0]) if mask is not None else np.ones(K.shape[0], bool)
    cells = np.flatnonzero(valid)
    Sv = cells.size
    P = reference.combined_scores(q, K, r=d, mask=mask, scale=scale, per_head=True)[0]  # exact, (hkv, g, S)
    head, group, order = curves(P, valid)
    hkv = P.shape[0]
    out = [{"S": int(Sv)} for _ in range(hkv)]
    at = lambda c, k: c[..., min(k, Sv) - 1]  # noqa: E731  (mass of the best k cells)
    for j, rec in enumerate(out):
        hm, gm = head[j].mean(0), group[j].mean(0)             # mean over the group's heads, (Sv,)
        for k in ks:
            rec[f"cov_head_k{k}"] = float(at(hm, k))
            rec[f"cov_group_k{k}"] = float(at(gm, k))
            rec[f"covmin_group_k{k}"] = float(at(group[j], k).min())
        for f in fracs:
            rec[f"cov_group_f{f:g}"] = float(at(gm, max(1, int(round(f * Sv)))))
        for lv in LEVELS:
            rec[f"k{lv}_head"] = int(k_reaching(hm, lv / 100))
            rec[f"k{lv}_group"] = int(k_reaching(gm, lv / 100))
            rec[f"k{lv}_groupall"] = int(k_reaching(group[j], lv / 100).max())
        rec["curve_head"] = [float(hm[min(k, Sv) - 1]) for k in PLOT_KS]
        rec["curve_group"] = [float(gm[min(k, Sv) - 1]) for k in PLOT_KS]
    bases = [("", q, K, comp_weights(x, K, valid, basis))]
    if unrotate:
        qb, Kb = rotate_back(q, unrotate), rotate_back(K, unrotate)
        bases.append(("hb", qb, Kb, None if basis == "model" else np.sqrt((Kb[valid] ** 2).mean(axis=0))))
    for fmt in kt_formats:
        bases.append((fmt, q, KT_FORMATS[fmt](K), bases[0][3]))
    for tag, qx, Kx, w in bases:
        for r in rs:
            approx = reference.combined_scores(qx, Kx, r=r, mask=mask, scale=scale, comp_w=w)[0][:, valid]  # (hkv, Sv)
            for k in recall_ks:
                sel = None
                if k < Sv:
                    _, info = reference.sparq_attention(qx, Kx, V, r=r, k=k, l=k // 4, mask=mask, scale=scale,
                                                        comp_w=w, return_info=True)
                    sel = info["i2"][0]                             # SparQ's choice (steps 1-3), cell indices
                for j, rec in enumerate(out):
                    recall_metrics(rec, P[j][:, valid], approx[j], order[j], group[j], k, r,
                                   None if sel is None else np.searchsorted(cells, sel[j]), tag)
                if tag:
                    continue
                for m in buckets:  # the bucketed top-k on the same scores: buckets by cell index
                    full = np.full((approx.shape[0], K.shape[0]), -np.inf)
                    full[:, valid] = approx
                    won = reference.bucket_winners(full, m * k)[:, valid]
                    sel = None
                    if k < Sv:
                        _, info = reference.sparq_attention(qx, Kx, V, r=r, k=k, l=k // 4, mask=mask, scale=scale,
                                                            comp_w=w, return_info=True, topk_buckets=m * k)
                        sel = info["i2"][0]
                    for j, rec in enumerate(out):
                        recall_metrics(rec, P[j][:, valid], won[j], order[j], group[j], k, r,
                                       None if sel is None else np.searchsorted(cells, sel[j]), f"b{m}")
    return out


def comp_weights(x, K, valid, basis):
    """Step 1's component weights (hkv, d): none for the model basis; for the scaled basis the op's
    (captured), or the keys' RMS per component computed here where the call passed none or passed
    them for another basis than K's (with a rotated query: a quantized cache's keys rotated back)."""
    if basis == "model":
        return None
    if x["comp_w"] is not None and x["q_sel"] is None:
        return x["comp_w"]
    return np.sqrt((K[valid] ** 2).mean(axis=0))


def recall_metrics(rec, Pj, approx, order, cum_group, k, r, sparq_sel, tag=""):
    """Recall of one KV head at budget k and r components: overlap and held mass of the approximate
    top-k (and of SparQ's own choice with its window) against the exact group top-k (tag: the basis)."""
    sfx = f"{tag}_k{k}_r{r}"
    Sv = approx.size
    if k >= Sv:  # the op would run dense: nothing to recover
        for name in ("overlap", "massratio", "sparqmass"):
            rec[name + sfx] = float("nan")
        return
    top = np.argsort(-approx, kind="stable")[:k]
    top = top[np.isfinite(approx[top])]  # a bucketed top-k may hold fewer than k
    exact_mass = cum_group[:, k - 1].mean()
    rec["overlap" + sfx] = float(np.intersect1d(top, order[:k]).size / k)
    rec["massratio" + sfx] = float(Pj[:, top].sum(-1).mean() / exact_mass)
    rec["sparqmass" + sfx] = float(Pj[:, sparq_sel].sum(-1).mean() / exact_mass)


# ----------------------------------------------------------------------------- running the model

def run_prompt(llm, toks, steps, opts):
    """Prefill toks[:-1], then `steps` greedy decode steps under Capture: the records of every call."""
    from sparq_lab.capture import Capture, op_params, stream_view

    llm.reset()
    llm.eval(toks[:-1])
    recs, tok = [], toks[-1]
    for step in range(steps):
        with Capture(llm) as cap:
            llm.eval([tok])
        if not cap.calls:
            raise RuntimeError(f"decode step {step} ran no SparQ call: does the model have a layer SparQ runs in?")
        for call in cap.calls:
            x = stream_view(call)
            for j, rec in enumerate(call_metrics(x, op_params(call)["scale"], **opts)):
                recs.append({"step": step, "layer": call["layer"], "kv_head": j, **rec})
        del cap
        tok = int(np.argmax(llm.last_logits()))
        if tok == llm.token_eos():
            break
    return recs


def model_shape(llm) -> dict:
    """The attention shape from the model's metadata: head size d, heads, KV heads, layers."""
    from llama_sparq.models import attention_shape

    return attention_shape(llm.metadata)


def run(a, model, opts):
    """Every length and sample: (records, prompts, counters, the model's shape). opts["rs"] is
    --rs's text and becomes the list of r values once the head size is known."""
    from llama_sparq import Llama

    lengths = [int(x) for x in a.lengths.split(",")]
    n_ctx = max(lengths) + 256 + a.steps
    op_k = a.op_k or n_ctx
    from sparq_lab.cost import cache_type_id

    ct = cache_type_id(a.cache_type)
    llm = Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=a.threads, verbose=False, flash_attn=True,
                logits_all=False, sparq=True, sparq_min_kv=0, sparq_k=op_k, sparq_l=0 if not a.op_k else -1,
                sparq_basis=a.basis, sparq_kt_bits=16, type_k=ct, type_v=ct)  # the f16 K^T is the baseline
    llm.reset_sparq_stats()
    shape = model_shape(llm)
    opts["rs"] = parse_rs(opts["rs"], shape["d"])
    if a.unrotate:
        if a.cache_type == "f16" or not hadamard_size(shape["d"]):
            raise SystemExit(f"--unrotate: upstream rotates q and k only for a quantized K cache with head size % 64 "
                             f"== 0 (here --cache-type {a.cache_type}, head size {shape['d']})")
        opts["unrotate"] = hadamard_size(shape["d"])
    records, prompts = [], []
    for n in lengths:
        for i in range(a.samples):
            t0 = time.time()
            depth = DEPTHS[i % len(DEPTHS)]
            seed = (zlib.crc32(a.task.encode()) % 1000) * 100003 + n * 7 + i
            toks = prompt_tokens(llm, a.task, n, depth, seed, n_ctx, a.steps)
            recs = run_prompt(llm, toks, a.steps, opts)
            for rec in recs:
                rec.update(length=n, sample=i, depth=depth, prompt_tokens=len(toks))
            records += recs
            prompts.append(dict(length=n, sample=i, depth=depth, tokens=len(toks), calls=len(recs),
                                seconds=round(time.time() - t0, 1)))
            print(f"length {n} sample {i}: {len(toks)} tokens, {len(recs)} records, {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    st = llm.sparq_stats()
    if st["n_sparq"] == 0:
        raise RuntimeError(f"SparQ made no call (counters {st}): nothing was measured")
    llm.close()
    return records, prompts, st, shape


# ----------------------------------------------------------------------------- summaries

ID_FIELDS = ("length", "sample", "depth", "prompt_tokens", "step", "layer", "kv_head")
CURVES = ("curve_head", "curve_group")


def metric_fields(records) -> list[str]:
    return [f for f in records[0] if f not in ID_FIELDS and f not in CURVES]


def _spread(rs, f):
    """(lowest, highest) mean of field f over the prompts (samples) of rs."""
    per = [np.nanmean([r[f] for r in rs if r["sample"] == s]) for s in sorted({r["sample"] for r in rs})]
    return float(np.min(per)), float(np.max(per))


def summarise(records, fields):
    """Means per length x layer (with the spread over the prompts, the worst step's k, the mean
    curves) and per length x layer x KV head."""
    spread = [f for f in fields if f.startswith("k") and f[1:3].isdigit() or f.startswith("cov_group_k")]
    out = {"by_layer": [], "by_kv_head": []}
    for keys, name in ((("length", "layer"), "by_layer"), (("length", "layer", "kv_head"), "by_kv_head")):
        groups: dict[tuple, list] = {}
        for r in records:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r)
        for key, rs in sorted(groups.items()):
            row = dict(zip(keys, key), n=len(rs), S=float(np.mean([r["S"] for r in rs])))
            keep = fields if name == "by_layer" else [f for f in fields if f in spread or f.startswith("overlap")]
            with np.errstate(all="ignore"):
                for f in keep:
                    if f != "S":
                        row[f] = round(float(np.nanmean([r[f] for r in rs])), 5)
            if name == "by_layer":
                for f in spread:
                    row[f + "_lo"], row[f + "_hi"] = (round(v, 5) for v in _spread(rs, f))
                    if not f.startswith("cov"):
                        row[f + "_max"] = int(max(r[f] for r in rs))
                for c in CURVES:
                    row[c] = np.mean([r[c] for r in rs], axis=0).round(5).tolist()
            out[name].append(row)
    return out


def headline(by_layer, lengths, rs, recall_ks, ks, fracs):
    """Per length: k90/k95/k99 in the median and the worst layer (shared and per-head choice), the
    coverage at each k in the median and worst layer, recall per r and recall k (mean and worst layer)."""
    out = []
    for n in lengths:
        rows = [r for r in by_layer if r["length"] == n]
        h = dict(length=n, S=float(np.mean([r["S"] for r in rows])), layers=len(rows))
        for choice in ("group", "head"):
            for lv in LEVELS:
                v = np.array([r[f"k{lv}_{choice}"] for r in rows])
                h[f"k{lv}_{choice}_median"] = float(np.median(v))
                h[f"k{lv}_{choice}_worst"] = float(v.max())
                h[f"k{lv}_{choice}_worst_layer"] = int(rows[int(v.argmax())]["layer"])
                h[f"k{lv}_{choice}_worst3"] = [[int(rows[i]["layer"]), float(v[i])] for i in np.argsort(-v)[:3]]
        for k in ks:
            v = np.array([r[f"cov_group_k{k}"] for r in rows])
            h[f"cov_group_k{k}_median"], h[f"cov_group_k{k}_worst"] = float(np.median(v)), float(v.min())
        for f in fracs:
            v = np.array([r[f"cov_group_f{f:g}"] for r in rows])
            h[f"cov_group_f{f:g}_median"], h[f"cov_group_f{f:g}_worst"] = float(np.median(v)), float(v.min())
        for k in recall_ks:
            for r in rs:
                for m in ("overlap", "massratio", "sparqmass"):
                    for tag in ("", "hb", *KT_FORMATS, *(f"b{m}" for m in BUCKET_MULTS)):
                        if f"{m}{tag}_k{k}_r{r}" not in rows[0]:
                            continue
                        v = np.array([row[f"{m}{tag}_k{k}_r{r}"] for row in rows])
                        h[f"{m}{tag}_k{k}_r{r}_mean"] = float(np.mean(v))
                        h[f"{m}{tag}_k{k}_r{r}_worst"] = float(np.min(v))
        out.append(h)
    return out


# ----------------------------------------------------------------------------- result files

def write_results(stem, meta, records, summary, heads, a):
    fields = metric_fields(records)
    cols = list(ID_FIELDS) + fields
    comments = [f"{k}: {v}" for k, v in meta.items() if not isinstance(v, (list, dict))]
    write_csv(stem.with_suffix(".csv"), comments, cols,
              [[_cell(r[c]) for c in cols] for r in records])
    write_json(stem.with_suffix(".json"), dict(meta=meta, plot_ks=PLOT_KS.tolist(), headline=heads, **summary),
               newline=True)
    stem.with_suffix(".md").write_text("\n".join(markdown(meta, summary, heads, a)) + "\n")


def _cell(v):
    return f"{v:.5g}" if isinstance(v, float) else v


def markdown(meta, summary, heads, a):
    lines = [f"# Attention coverage of the top-k cells: {meta['model']} ({a.tag})", ""]
    lines += md_bullets((k, v) for k, v in meta.items() if not isinstance(v, (list, dict))) + [""]
    lines += ["## The k that holds 90 / 95 / 99 % of the exact attention mass", "",
              "Group-shared choice (SparQ's: one set of cells per KV head), mean over the group's heads, "
              "a decode step's k averaged over steps, KV heads and prompts; median layer / worst layer (its "
              "index). Per-head: each query head's own best cells.", ""]
    cols = ["length", "S"] + [f"k{lv} shared: median / worst" for lv in LEVELS] + \
        [f"k{lv} per head: median / worst" for lv in (90, 99)] + ["mass at k=128: median / worst",
                                                                  "k90 shared: the 3 worst layers"]
    rows = []
    for h in heads:
        c = [str(h["length"]), f"{h['S']:.0f}"]
        for lv in LEVELS:
            c.append(f"{h[f'k{lv}_group_median']:.0f} / {h[f'k{lv}_group_worst']:.0f} "
                     f"(L{h[f'k{lv}_group_worst_layer']})")
        for lv in (90, 99):
            c.append(f"{h[f'k{lv}_head_median']:.0f} / {h[f'k{lv}_head_worst']:.0f} (L{h[f'k{lv}_head_worst_layer']})")
        c.append(f"{h['cov_group_k128_median']:.3f} / {h['cov_group_k128_worst']:.3f}"
                 if "cov_group_k128_median" in h else "")
        c.append(", ".join(f"L{L}: {v:.0f}" for L, v in h["k90_group_worst3"]))
        rows.append(c)
    lines += md_table(cols, rows) + [""]
    lines += ["Mass held at k = a share of S (shared choice): median layer / worst layer.", ""]
    frac = lambda h, f: f"{h[f'cov_group_f{f:g}_median']:.3f} / {h[f'cov_group_f{f:g}_worst']:.3f}"  # noqa: E731
    lines += md_table(["length", "S"] + [f"k = {f:g} S" for f in meta["fracs"]],
                      [[str(h["length"]), f"{h['S']:.0f}"] + [frac(h, f) for f in meta["fracs"]] for h in heads]) + [""]
    lines += recall_table(meta, heads, a) + [""]
    lines += layer_tables(summary["by_layer"], a) + [""]
    return lines


def recall_table(meta, heads, a):
    from sparq_lab import cost

    lines = ["## Recall of SparQ's steps 1-2 (approximate top-k against the exact top-k)", "",
             f"Basis `{a.basis}`; group-shared choice; mean over layers (worst layer). overlap = |approx "
             "top-k ∩ exact top-k| / k; mass = exact mass of the approximate top-k / of the exact top-k; "
             "SparQ = the same for SparQ's whole choice (steps 1-3, window l = k/4). Compression: the cost "
             "model's M_sparq / M_dense at that S.", ""]
    tags = ([""] + (["hb"] if meta.get("unrotate") else []) + list(meta.get("kt_formats") or [])
            + [f"b{m}" for m in meta.get("buckets") or []])
    if meta.get("unrotate"):
        lines += [f"`hb`: q and K rotated back from upstream's Hadamard rotation (size {meta['unrotate']}, applied "
                  "to q and k for a quantized K cache) before steps 1-3, on the same captured steps; the component "
                  "weights of `scaled` then the keys' RMS in that basis.", ""]
    if meta.get("kt_formats"):
        lines += [f"{', '.join(f'`{f}`' for f in meta['kt_formats'])}: steps 1-3 read K^T stored in that "
                  "format (the exact scores and component weights stay the f16 keys'); the compression column is the "
                  "f16 K^T's: step 1 reads 1 byte an element in 8 bits, 20/32 in 4 (`kt4`, `int4`), where f16 "
                  "reads 2.", ""]
    if meta.get("buckets"):
        lines += [f"{', '.join(f'`b{m}`' for m in meta['buckets'])}: step 3 takes the approximate bucketed "
                  "top-k (`topk_buckets` = m x k buckets by cell index modulo that, each bucket's best cell, "
                  "then the k best of those; SparQ mass: the k - l best with the window) on the same "
                  "approximate scores; the same compression as the exact row.", ""]
    cols = ["length", "k", "r", "compression"] + [f"{m}{' ' + t if t else ''}" for t in tags
                                                  for m in ("overlap", "mass", "SparQ mass")]
    rows = []
    for h in heads:
        for k in meta["recall_ks"]:
            for r in meta["rs"]:
                if np.isnan(h[f"overlap_k{k}_r{r}_mean"]):
                    continue
                comp = cost.compression(h["S"], meta["d"], r, k, kv_type=meta.get("cache_type", "f16"))
                rows.append([str(h["length"]), str(k), str(r), f"{comp:.3f}"] +
                            [f"{h[f'{m}{t}_k{k}_r{r}_mean']:.3f} ({h[f'{m}{t}_k{k}_r{r}_worst']:.3f})"
                             for t in tags for m in ("overlap", "massratio", "sparqmass")])
    return lines + md_table(cols, rows)


def layer_tables(by_layer, a):
    lines = ["## Per layer", "",
             "Shared choice, mean over steps, KV heads and prompts [lowest - highest prompt mean]; "
             "k max: the worst step.", ""]
    ks = [int(x) for x in a.ks.split(",")]
    cols = ["length", "layer", "S"] + [f"k{lv} [spread] (max)" for lv in LEVELS] + [f"mass k={k}" for k in ks]
    rows = []
    for r in by_layer:
        c = [str(r["length"]), str(r["layer"]), f"{r['S']:.0f}"]
        for lv in LEVELS:
            f = f"k{lv}_group"
            c.append(f"{r[f]:.0f} [{r[f + '_lo']:.0f}-{r[f + '_hi']:.0f}] ({r[f + '_max']})")
        c += [f"{r[f'cov_group_k{k}']:.3f}" for k in ks]
        rows.append(c)
    return lines + md_table(cols, rows)


def plot(path, summary, heads, meta):
    """Top row: coverage against k per length (one line per layer). Bottom row: recall against r
    (overlap, SparQ's mass), and k90 / k99 per layer (which layers break first)."""
    plt = pyplot()
    n = max(len(heads), 3)
    fig, ax = plt.subplots(2, n, figsize=(4.2 * n, 8), squeeze=False, constrained_layout=True)
    layers = sorted({r["layer"] for r in summary["by_layer"]})
    cmap = plt.get_cmap("viridis")
    for i, h in enumerate(heads):
        a = ax[0, i]
        for r in summary["by_layer"]:
            if r["length"] == h["length"]:
                m = PLOT_KS <= r["S"]
                a.plot(PLOT_KS[m], np.array(r["curve_group"])[m], lw=1, label=f"L{r['layer']}",
                       color=cmap(layers.index(r["layer"]) / max(1, len(layers) - 1)))
        for lv in LEVELS:
            a.axhline(lv / 100, color="grey", lw=0.5, ls=":")
        a.set_xscale("log", base=2)
        a.set_title(f"S ~ {h['S']:.0f}")
        a.set_xlabel("k (cells)")
        if len(layers) <= 8:
            a.legend(fontsize=7)
    ax[0, 0].set_ylabel("exact attention mass held (shared choice)")
    for i in range(len(heads), n):
        ax[0, i].axis("off")
    colors = plt.get_cmap("tab10")
    for col, m in enumerate(("overlap", "sparqmass")):
        a = ax[1, col]
        for i, h in enumerate(heads):
            for k, ls in zip(meta["recall_ks"], ("-", "--", ":", "-.")):
                ys = [h.get(f"{m}_k{k}_r{r}_mean", np.nan) for r in meta["rs"]]
                a.plot(meta["rs"], ys, ls=ls, marker="o", ms=3, color=colors(i), label=f"S~{h['S']:.0f}, k={k}")
        a.set_xscale("log", base=2)
        a.set_xticks(meta["rs"], [str(r) for r in meta["rs"]])
        a.set_xlabel(f"r (components of d = {meta['d']})")
        a.set_title("|approx top-k ∩ exact top-k| / k" if m == "overlap" else
                    "exact mass of SparQ's choice / exact top-k's", fontsize=9)
        a.legend(fontsize=6)
    a = ax[1, 2]
    for i, h in enumerate(heads):
        rows = [r for r in summary["by_layer"] if r["length"] == h["length"]]
        for lv, ls in ((90, "-"), (99, "--")):
            a.plot([r["layer"] for r in rows], [r[f"k{lv}_group"] for r in rows], ls=ls, marker=".", color=colors(i),
                   label=f"k{lv}, S~{h['S']:.0f}")
    a.set_yscale("log", base=2)
    a.set_xlabel("layer")
    a.set_title("k holding 90 % (solid) / 99 % (dashed) of the mass", fontsize=9)
    a.legend(fontsize=6)
    for i in range(3, n):
        ax[1, i].axis("off")
    if len(layers) > 8:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(min(layers), max(layers)))
        fig.colorbar(sm, ax=ax[0, :].tolist(), label="layer")
    fig.suptitle(f"{meta['model']}: exact attention mass of the top-k cells, and SparQ's recall")
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- coverage_main

def coverage_main(argv=None):
    ap = argparse.ArgumentParser(description=COVERAGE_DOC.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a GGUF path")
    ap.add_argument("--lengths", default=None, help="prompt lengths in tokens (default per model)")
    ap.add_argument("--ks", default="16,32,64,128,256,512,1024,2048")
    ap.add_argument("--fracs", default="0.01,0.02,0.05,0.1,0.2", help="k as shares of S")
    ap.add_argument("--rs", default="4,8,16,32,d/8,d/4,d/2", help="r values for the recall (d/N allowed)")
    ap.add_argument("--recall-ks", default="128,512")
    ap.add_argument("--samples", type=int, default=3, help="prompts per length (depths 0.5, 0.25, 0.75)")
    ap.add_argument("--steps", type=int, default=4, help="decode steps captured per prompt")
    ap.add_argument("--basis", default="scaled", choices=("scaled", "model"))
    ap.add_argument("--task", default=None, help="an eval task (llama_sparq.eval.TASKS; chat_* in the chat "
                    "template): default chat_multikey for smollm2, passkey otherwise")
    ap.add_argument("--op-k", type=int, default=0, help="the op's k while capturing (0: the context, exact)")
    ap.add_argument("--cache-type", default="f16", choices=("f16", "q8_0"), help="the K and V cache's type")
    ap.add_argument("--unrotate", action="store_true", help="with a quantized cache: also measure the recall with "
                    "q and K rotated back from upstream's Hadamard rotation")
    ap.add_argument("--kt-formats", default="", help="also the recall with K^T in these 8- or 4-bit formats "
                    f"(comma-separated: {', '.join(KT_FORMATS)})")
    ap.add_argument("--buckets", default="", help="also the recall of the approximate bucketed top-k with these "
                    "multiples m of k as buckets (comma-separated integers >= 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default=None, help="file stem (default coverage_<model>)")
    ap.add_argument("--out-dir", default=str(RESULTS))
    a = ap.parse_args(argv)
    preset = MODELS.get(a.model, dict(lengths="512,1024", task="passkey", name=Path(a.model).name))
    a.lengths = a.lengths or preset["lengths"]
    a.task = a.task or preset["task"]
    a.tag = a.tag or f"coverage_{a.model if a.model in MODELS else Path(a.model).stem}"
    load0 = loadavg()
    t0 = time.time()

    model = model_path(a.model)
    ks = [int(x) for x in a.ks.split(",")]
    opts = dict(ks=ks, fracs=[float(x) for x in a.fracs.split(",")], rs=a.rs,
                recall_ks=[int(x) for x in a.recall_ks.split(",")], basis=a.basis,
                kt_formats=[f for f in a.kt_formats.split(",") if f])
    try:
        opts["buckets"] = sorted({int(x) for x in a.buckets.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--buckets: '{a.buckets}' is not a list of integers") from None
    if any(m not in BUCKET_MULTS for m in opts["buckets"]):
        raise SystemExit(f"--buckets: multiples of k from 1 to {max(BUCKET_MULTS)}, got '{a.buckets}'")
    for f in opts["kt_formats"]:
        if f not in KT_FORMATS:
            raise SystemExit(f"--kt-formats: unknown format '{f}' (allowed: {', '.join(KT_FORMATS)})")
    records, prompts, st, shape = run(a, model, opts)
    fields = metric_fields(records)
    summary = summarise(records, fields)
    lengths = [int(x) for x in a.lengths.split(",")]
    heads = headline(summary["by_layer"], lengths, opts["rs"], opts["recall_ks"], ks, opts["fracs"])
    meta = run_meta(a.threads, load0)
    meta.update(model=preset["name"], model_file=model, **shape, task=a.task,
                sparq=(f"capture run: SparQ on, min_kv=0, k={a.op_k or 'n_ctx'} "
                       f"(l={'0' if not a.op_k else 'k/4'}), basis {a.basis}: "
                       + ("every step attends over every cell (exact)" if not a.op_k else "a real budget")),
                counters=(f"n_sparq={st['n_sparq']}, compression={st['compression']:.3f}, "
                          f"dense calls by reason {dict((k, v) for k, v in st['n_dense'].items() if v)}"),
                sparq_layers=sorted({r["layer"] for r in records}), rs=opts["rs"], recall_ks=opts["recall_ks"],
                ks=ks, fracs=opts["fracs"], samples=a.samples, steps=a.steps, prompts=prompts,
                cache_type=a.cache_type, unrotate=opts.get("unrotate", 0), kt_formats=opts["kt_formats"],
                buckets=opts["buckets"],
                records=len(records), elapsed_s=round(time.time() - t0, 1))
    stem = out_stem(a.out_dir, a.tag)
    write_results(stem, meta, records, summary, heads, a)
    plot(stem.with_suffix(".png"), summary, heads, meta)
    print(stem.with_suffix(".md").read_text())
    return 0

# ============================================================================================= the subcommands

SUBCOMMANDS = {"coverage": coverage_main, "rootcause": rootcause_main}


def main(argv=None) -> int:
    return dispatch(__doc__, SUBCOMMANDS, argv, default="coverage")


if __name__ == "__main__":
    sys.exit(main())
