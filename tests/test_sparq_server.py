"""llama-server with SparQ: its default slots decode with SparQ (one KV stream per slot instead of
the unified stream where SparQ runs dense), the counters in /metrics and /props, a load test
with every concurrent response equal to the same request run alone; and SparQ's need for the
flash-attention layout in every common tool (-fa auto becomes on, never "SparQ on" with no layer).

The server helpers (start on a free loopback port, prompts, load, comparison) are those of
bench/server_load.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparq import tool_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from server_load import Server, build_prompts, run_load  # noqa: E402


def run(args, timeout=300):
    return subprocess.run([str(a) for a in args], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)


def check_load(res, n_requests):
    assert not res["incomplete"], res["incomplete"]
    assert not res["mismatches"], res["mismatches"][:3]
    assert len(res["texts"]) == n_requests and all(res["texts"])
    # decode steps ran SparQ while the slots decoded together, none dense for a shared stream
    assert res["sparq_calls_concurrent"] > 0, res
    assert res["sparq_dense_concurrent"].get("shared_stream", 0) == 0, res
    assert res["busy_slots_per_decode"] > 1, res


def test_server_default_slots_sparq_tiny(tiny_model, tmp_path):
    """The server's defaults (-np auto: 4 slots) with --sparq: one KV stream per slot, SparQ
    calls while 8 requests share the slots, each response equal to the request run alone.
    Before: one unified stream, every decode step dense (shared_stream), SparQ calls 0."""
    with Server(tiny_model, ["-c", 4096, "--sparq", "--sparq-k", 8, "--sparq-r", 4, "--sparq-min-kv", 0],
                log_path=tmp_path / "server.log", start_timeout=120) as srv:
        props = srv.get("/props")
        assert props["total_slots"] == 4
        assert props["default_generation_settings"]["n_ctx"] == 1024  # n_ctx / slots: its own stream
        sp = props["sparq"]
        assert sp["enabled"] and sp["n_layers"] == 2 and (sp["k"], sp["r"], sp["min_kv"]) == (8, 4, 0)
        # every setting, by the C API's names
        assert (sp["selector"], sp["gqa"], sp["basis"], sp["mean_v"]) == ("sparq", "shared", "scaled", True), sp
        prompts = build_prompts(srv, 8, 60, 200, seed=1)
        res = run_load(srv, prompts, n_predict=12, request_timeout=120)
        check_load(res, 8)
        m = srv.metrics()
        assert m["sparq_enabled"] == 1 and m["sparq_layers"] == 2
        assert m["sparq_calls_total"] == res["sparq_calls_concurrent"] + res["sparq_calls_alone"]
        assert 0 < m["sparq_compression"] < 1
        assert m['sparq_dense_calls_total{reason="prefill"}'] > 0
        props = srv.get("/props")["sparq"]
        assert props["n_sparq"] == m["sparq_calls_total"] and props["n_dense"]["shared_stream"] == 0
        assert srv.error_lines() == []
        assert "one KV stream each" in srv.log()


def test_server_without_sparq_reports_it_off(tiny_model, tmp_path):
    with Server(tiny_model, ["-c", 2048], log_path=tmp_path / "server.log", start_timeout=120) as srv:
        assert srv.get("/props")["sparq"]["enabled"] is False
        m = srv.metrics()
        assert m["sparq_enabled"] == 0 and m["sparq_calls_total"] == 0


def test_server_refuses_sparq_with_unified_kv(tiny_model):
    res = run([tool_path("llama-server"), "-m", tiny_model, "--port", "0", "--sparq", "--kv-unified", "-np", "4"],
              timeout=120)
    assert res.returncode != 0
    assert "--sparq with --kv-unified and several slots" in res.stdout + res.stderr, res.stderr[-1500:]


def test_sparq_forces_flash_attention_layout(tiny_model):
    """-fa auto (the default) with --sparq becomes -fa on: the context is made with it."""
    res = run([tool_path("llama-completion"), "-m", tiny_model, "-p", "hello", "-n", "4", "-no-cnv", "-t", "1",
               "--sparq", "--sparq-min-kv", "0", "-lv", "4"])  # verbosity 4 logs the context's parameters
    assert res.returncode == 0, res.stderr[-2000:]
    assert "flash_attn            = enabled" in res.stderr, res.stderr[-3000:]
    assert "SparQ on: " in res.stderr and "; 2 layers" in res.stderr


def test_sparq_refused_when_no_layer_can_run_it(tmp_path):
    """A K/V cache of a type SparQ does not read (bf16) leaves SparQ no layer: refused, naming the
    types, never "SparQ on" with 0 layers. Before: "SparQ on: ...; 0 layers" and a run with every step dense."""
    from sparq_lab.models import make_tiny_llama

    model = make_tiny_llama(tmp_path / "tiny-d32.gguf", n_layer=2, n_embd=64, n_head=2)
    res = run([tool_path("llama-completion"), "-m", model, "-p", "hello", "-n", "4", "-no-cnv", "-t", "1",
               "--sparq", "-ctk", "bf16", "-ctv", "bf16"])
    assert res.returncode != 0
    assert "no KV-cache layer of this context can run SparQ" in res.stderr, res.stderr[-2000:]
    assert "here K bf16, V bf16" in res.stderr, res.stderr[-2000:]
    assert "SparQ on: " not in res.stderr


@pytest.fixture(scope="module")
def gemma_load(gemma_model, tmp_path_factory):
    """A concurrent load, run once: llama-server on loopback with its default slots (4) and
    --sparq, 6 concurrent greedy completions of 1.1K-1.4K-token prompts (more than the slots, so that
    requests queue; above the default dense threshold of 1024 cells), then each alone (2K-6K:
    bench/server_load.py, which takes too long for the suite on 2 cores)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with Server(gemma_model, ["-c", 32768, "--sparq"], log_path=log, start_timeout=300) as srv:
        props = srv.get("/props")
        prompts = build_prompts(srv, 6, 1100, 1400, seed=0)
        res = run_load(srv, prompts, n_predict=8, request_timeout=1200)
        res["props"], res["error_lines"] = props, srv.error_lines()
    print("gemma load:", {k: v for k, v in res.items() if k not in ("texts", "props")})  # pytest -s shows it
    return res


@pytest.mark.real_model
def test_server_load_gemma(gemma_load):
    """Every response complete, SparQ calls while the 4 slots decode together (none dense for a
    shared stream), no error line in the server log."""
    res = gemma_load
    assert res["props"]["total_slots"] == 4 and res["props"]["sparq"]["n_layers"] > 0
    assert not res["incomplete"], res["incomplete"]
    assert len(res["texts"]) == 6 and all(res["texts"])
    assert res["sparq_calls_concurrent"] > 0 and res["sparq_calls_alone"] > 0, res
    assert res["sparq_dense_concurrent"].get("shared_stream", 0) == 0, res
    assert res["busy_slots_per_decode"] > 1, res
    assert res["error_lines"] == []


@pytest.mark.real_model
def test_server_load_gemma_equal_to_alone(gemma_load):
    """Each concurrent response equals the same request run alone (greedy).

    Upstream's computation is not batch-invariant: the same sequence's logits move by up to ~0.5
    between a decode step alone and beside other slots' rows (dense too; Q4_K matrix products of
    1-row and many-row ubatches round differently). Dense's top-2 margins here are large, so no
    token flips. The paper's basis on Gemma 3 chose cells from near-equal approximate scores and
    turned such rounding into different selections (margins down to 0.2, tokens flipped in 6 to 9
    of 16 responses at 2K-3K tokens); the scaled basis (the default) selects stably, and every response equals
    its alone run. test_server_schedule_every_stream_equals_reference checks the op row by row
    under the same schedule."""
    assert not gemma_load["mismatches"], gemma_load["mismatches"]


def test_prompt_rows_beside_a_decode_row_equal_the_prompt_alone(tiny_gqa_model):
    """What llama-server does with several slots: one slot decodes while another's prompt is
    processed in the same batch, and the equal split gives both one row per stream. The
    prompt's result must not depend on that (dense: bit-identical). With SparQ the ubatch
    holding both rows runs SparQ for the decode row and upstream's dense attention for the
    prompt row (picked per row), so the prompt's logits are bit-identical to the prompt
    processed alone, and the decode row's to that decode step alone."""
    import numpy as np
    from sparq_ctx import Ctx, Model

    m = Model(tiny_gqa_model)
    rng = np.random.default_rng(0)
    p0, p1 = ([int(x) for x in rng.integers(3, m.n_vocab, n)] for n in (300, 260))

    def new_ctx(enabled):
        c = Ctx(m, n_ctx=4096, n_seq=2, n_threads=1)
        c.sparq(enabled=enabled, r=4, k=8, l=2, min_kv=0, all_rows=False)
        return c

    def decode(c, items):
        """items: (token, pos, seq, wants logits); the logits asked for"""
        rc, out = c.decode([it[:3] for it in items], logits=[it[3] for it in items])
        assert rc == 0, rc
        return out

    def run(enabled, beside_decode):
        """the prompt's last logits, seq 0's decode logits (alone when not beside), SparQ calls"""
        ctx = new_ctx(enabled)
        decode(ctx, [(t, i, 0, False) for i, t in enumerate(p0)])
        decode(ctx, [(t, i, 1, False) for i, t in enumerate(p1[:200])])
        # both decode a token: a SparQ-only graph of the shape the mixed ubatch has next (which
        # must not reuse it)
        decode(ctx, [(9, len(p0), 0, True), (p1[200], 200, 1, False)])
        rest = [(t, i, 1, i == len(p1) - 1) for i, t in enumerate(p1) if i > 200]
        step = [(5, len(p0) + 1, 0, True)]
        if beside_decode:
            dec, out = decode(ctx, step + rest)
        else:
            (out,) = decode(ctx, rest)
            (dec,) = decode(ctx, step)
        n_sparq = ctx.stats()["n_sparq"]
        if enabled:
            # then both decode, one row each: the ubatch has the mixed one's shape, but its graph
            # (SparQ only) must not be the mixed one reused
            decode(ctx, [(6, len(p0) + 2, 0, True), (7, len(p1), 1, True)])
            assert ctx.stats()["n_sparq"] == n_sparq + 2
        ctx.free()
        return out, dec, n_sparq

    # dense: the prompt's rows are batch-invariant (a decode row is not: alone, upstream's flash
    # attention splits a single row's KV range over the threads)
    assert np.array_equal(run(False, True)[0], run(False, False)[0])
    (out_b, dec_b, n_b), (out_a, dec_a, n_a) = run(True, True), run(True, False)
    assert np.array_equal(out_b, out_a)  # the prompt row ran upstream's dense attention, as alone
    # the decode row ran SparQ, as alone (equal to rounding: the projections of a 2-row and a
    # 1-row ubatch round differently, upstream's behaviour, dense too)
    assert np.abs(dec_b - dec_a).max() <= 1e-5 * np.abs(dec_a).max()
    assert n_b == n_a == 2 * 2, (n_b, n_a)  # both layers, the both-decode step and seq 0's step


def _two_streams(model_path, prompt_lens, seed, n_ctx, **sparq):
    """A factory of 2-stream contexts with these SparQ settings, and random prompts"""
    import numpy as np
    from sparq_ctx import Ctx, Model

    m = Model(model_path)
    rng = np.random.default_rng(seed)
    prompts = [[int(x) for x in rng.integers(3, m.n_vocab, n)] for n in prompt_lens]

    def new_ctx():
        c = Ctx(m, n_ctx=n_ctx, n_seq=2, n_threads=1)
        c.sparq(enabled=True, min_kv=0, all_rows=False, **sparq)
        return c

    return new_ctx, prompts


def _prefill(c, seq, p):
    """the prompt in ubatches of 512; the last token's logits"""
    for i0 in range(0, len(p), 512):
        part = list(range(i0, min(len(p), i0 + 512)))
        rc, out = c.decode([(p[i], i, seq) for i in part], logits=[i == len(p) - 1 for i in part])
        assert rc == 0
    return out[0]


def _counts(c):
    st = c.stats()
    return st["n_sparq"], st["n_dense"]["short"]


def _decode_alone(new_ctx, p, seq, n):
    """a sequence alone: its greedy tokens, their logits, each step's change of the counters"""
    import numpy as np

    c = new_ctx()
    lg, toks, lgs, deltas = _prefill(c, seq, p), [], [], []
    for j in range(n):
        toks.append(int(np.argmax(lg)))
        before = _counts(c)
        rc, (lg,) = c.decode([(toks[-1], len(p) + j, seq)])
        assert rc == 0
        lgs.append(lg)
        deltas.append(tuple(x - y for x, y in zip(_counts(c), before)))
    c.free()
    return toks, np.array(lgs), deltas


def _decode_together(c, prompts, start, last, n):
    """both sequences decode together from positions len(prompt) + start[s], one row each: tokens,
    logits, each step's change of the counters"""
    import numpy as np

    toks, got, deltas = [[int(np.argmax(x))] for x in last], [[], []], []
    for j in range(n):
        before = _counts(c)
        rc, out = c.decode([(toks[s][-1], len(prompts[s]) + start[s] + j, s) for s in (0, 1)], logits=[True, True])
        assert rc == 0
        deltas.append(tuple(x - y for x, y in zip(_counts(c), before)))
        for s in (0, 1):
            got[s].append(out[s])
            toks[s].append(int(np.argmax(out[s])))
    return [t[:n] for t in toks], [np.array(g) for g in got], deltas


def _assert_as_alone(toks, got, refs):
    """tokens equal, logits equal to the rounding of a 2-row ubatch"""
    import numpy as np

    for s in (0, 1):
        ref_toks, ref_lg = refs[s]
        assert toks[s] == ref_toks, s
        assert np.abs(got[s] - ref_lg).max() <= 1e-4 * np.abs(ref_lg).max(), (s, np.abs(got[s] - ref_lg).max())


def test_calibrated_cap_is_the_streams_own(tiny_gqa_model):
    """The calibrated k's cap (at most k_frac of the cells) is each row's own, from its stream's
    valid cells, not from the ubatch's KV view (the longest stream's): a short sequence decoded
    beside a long one picks the cells it picks alone. On the tiny random model every head is
    diffuse, so alone the short sequence's rows need more than its cap and attend over the cap's
    cells; with the long stream's cap they would attend over the target's share instead. Both
    sequences' tokens and logits equal their alone runs (to the rounding of a 2-row ubatch)."""
    # a coverage target of 0.3 of near-uniform attention: about 330 of the short stream's 1100
    # cells, over its own cap (275) and under the long stream's (about 1000)
    new_ctx, prompts = _two_streams(tiny_gqa_model, (1100, 3600), 7, 2 * 4096, k=0, k_min=16, coverage=0.3)
    n = 6
    refs = [_decode_alone(new_ctx, prompts[s], s, n)[:2] for s in (0, 1)]
    c = new_ctx()
    toks, got, joint = _decode_together(c, prompts, (0, 0), [_prefill(c, 0, prompts[0]), _prefill(c, 1, prompts[1])], n)
    c.free()
    assert sum(x[0] for x in joint) > 0
    _assert_as_alone(toks, got, refs)


def test_short_stream_beside_a_long_one_runs_dense_as_alone(tiny_gqa_model):
    """The dense threshold (min_kv) is each stream's own: a sequence under it decoded beside a
    longer one runs upstream's dense attention, as it does alone (both attentions run and each
    row is picked), and the longer one runs SparQ (the calls count as SparQ). Tokens and logits
    equal the alone runs (to the rounding of a 2-row ubatch)."""
    new_ctx, prompts = _two_streams(tiny_gqa_model, (600, 1500), 9, 2 * 2048, r=4, k=16, l=4)
    n = 4

    def with_threshold():
        c = new_ctx()
        c.sparq(min_kv=1024)
        return c

    alone = [_decode_alone(with_threshold, prompts[s], s, n) for s in (0, 1)]
    # alone, the short one runs dense (`short`), the long one SparQ
    assert [sum(x[0] for x in a[2]) for a in alone] == [0, 2 * n] and sum(x[1] for x in alone[0][2]) == 2 * n
    c = with_threshold()
    toks, got, joint = _decode_together(c, prompts, (0, 0), [_prefill(c, 0, prompts[0]), _prefill(c, 1, prompts[1])], n)
    c.free()
    assert sum(x[0] for x in joint) == 2 * n and sum(x[1] for x in joint) == 0, joint
    _assert_as_alone(toks, got, [a[:2] for a in alone])


def test_server_schedule_every_stream_equals_reference(tiny_gqa_model):
    """The server's schedule on the low-level API: three sequences, each step the generating
    sequences' decode rows plus one chunk of the next prompt (so decode rows share ubatches with
    a prompt's first row, and ubatches hold streams 0..2 in every combination). Every SparQ call
    is captured; in every stream of every call the op's output equals the reference on the
    call's tensors, the V sums and the scaled basis's weights equal a recomputation from the
    stream's cells, and the valid-cell count is the stream's own."""
    import numpy as np
    from sparq_ctx import Ctx, Model

    from sparq_lab import reference
    from sparq_lab.capture import Capture, op_params, reference_kt, stream_view

    m = Model(tiny_gqa_model)
    rng = np.random.default_rng(1)
    prompts = [[int(x) for x in rng.integers(3, m.n_vocab, n)] for n in (150, 130, 110)]
    n_pred, chunk, k = 10, 64, 16
    c = Ctx(m, n_ctx=3 * 512, n_seq=3, n_threads=1)
    c.sparq(enabled=True, r=8, k=k, l=4, min_kv=0, all_rows=False, basis="scaled")

    out = {s: [] for s in range(3)}
    fed = {s: 0 for s in range(3)}
    n_checked = n_sparse = n_multi = 0
    while any(len(out[s]) < n_pred for s in range(3)):
        items = [(out[s][-1], len(prompts[s]) + len(out[s]) - 1, s, True) for s in range(3)
                 if fed[s] == len(prompts[s]) and 0 < len(out[s]) < n_pred]
        for s in range(3):
            if fed[s] < len(prompts[s]):
                p0, n = fed[s], min(chunk, len(prompts[s]) - fed[s])
                items += [(t, p0 + j, s, p0 + j == len(prompts[s]) - 1) for j, t in enumerate(prompts[s][p0:p0 + n])]
                fed[s] += n
                break
        with Capture(c.ctx) as cap:
            rc, logits = c.decode([it[:3] for it in items], logits=[it[3] for it in items])
        assert rc == 0, rc
        for (tok, pos, seq, want), lg in zip([it for it in items if it[3]], logits):
            out[seq].append(int(np.argmax(lg)))

        for call in cap.calls:
            prm = op_params(call)
            n_streams, n_rows = call["q"].shape[0], call["q"].shape[2]
            n_multi += n_streams > 1
            for s in range(n_streams):
                for row in range(n_rows):
                    x = stream_view(call, s, row)
                    valid = np.isfinite(x["mask"][0])
                    used = int(np.isfinite(stream_view(call, s, n_rows - 1)["mask"][0]).sum())  # the stream's cells
                    assert x["count"] == used, (x["count"], used)
                    assert np.allclose(x["vsum"], x["V"][:used].sum(axis=0), rtol=1e-4, atol=1e-4)
                    assert np.allclose(x["comp_w"], np.sqrt((x["K"][:used] ** 2).sum(axis=0)), rtol=1e-4, atol=1e-5)
                    want = reference.sparq_attention(x["q"], x["K"], x["V"], r=prm["r"], k=prm["k"], l=prm["l"],
                                                     mask=x["mask"], scale=prm["scale"], vbar=x["vbar"],
                                                     window=[x["win"]], comp_w=x["comp_w"], **reference_kt(call, s))
                    assert np.abs(x["out"] - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (call["layer"], s, row)
                    n_checked += 1
                    n_sparse += int(valid.sum()) > k
    st = c.stats()
    c.free()
    assert st["n_sparq"] > 0 and n_sparse > 20 and n_multi > 4, (st, n_sparse, n_multi)
    assert n_checked >= 30, n_checked


def test_load_sweep_tiny_writes_the_table(tiny_model, tmp_path):
    """bench/server_load.py --sweep on the tiny model: a row per variant and (requests, slots), no
    SparQ mismatch and no error, SparQ calls in the SparQ rows only, throughput and latencies
    written (the Gemma sweep takes an hour: its record is bench/results/server_load_sweep.md)."""
    from server_load import main as load_main

    rc = load_main(["--model", str(tiny_model), "--sweep", "4x2,6x3", "--min-tokens", "150", "--max-tokens", "300",
                    "--server-args", "--sparq --sparq-k 16 --sparq-r 4 --sparq-min-kv 0", "--ctx-per-slot", "1024",
                    "--n-predict", "8", "--tag", "sweep", "--out-dir", str(tmp_path)])
    doc = __import__("json").loads((tmp_path / "sweep.json").read_text())
    rows = doc["result"]["rows"]
    assert [(r["variant"], r["requests"], r["slots"]) for r in rows] == [
        ("sparq", 4, 2), ("sparq", 6, 3), ("dense", 4, 2), ("dense", 6, 3)]
    for r in rows:
        assert not r["errors"] and not r["incomplete"] and not r["error_lines"] and not r["alone_recheck_differs"], r
        assert r["throughput_gen_tok_s"] > 0 and 0 < r["latency_p50_s"] <= r["latency_p95_s"]
        assert (r["sparq_calls"] > 0) == (r["variant"] == "sparq")
        if r["variant"] == "sparq":
            assert not r["mismatches"], r["mismatches"]
    assert rc == 0
    assert "| sparq | 6 | 3 |" in (tmp_path / "sweep.md").read_text()


def _resp(tokens, tops):
    """A /completion response with its tokens and, per token, the top candidates {id: logprob}."""
    return {"tokens": tokens, "completion_probabilities": [
        {"top_logprobs": [{"id": t, "logprob": lp} for t, lp in sorted(top.items(), key=lambda x: -x[1])]}
        for top in tops]}


def test_margin_changes_follow_the_alone_runs_top_two():
    """server_load.margin_changes: per token of the common prefix (the first differing token
    included), the alone top-2 margin and how far the concurrent response moved it, measured on
    the alone run's two tokens (a flip is a change larger than the margin)."""
    from server_load import margin_changes

    alone = _resp([5, 7, 9], [{5: -0.1, 6: -2.6}, {7: -0.5, 8: -0.7}, {9: -0.2, 1: -3.0}])
    conc = _resp([5, 8, 3], [{5: -0.2, 6: -2.4}, {8: -0.55, 7: -0.65}, {3: -0.1, 9: -4.0}])
    got = margin_changes(conc, alone)
    assert got == [(0, 2.5, 0.3), (1, 0.2, 0.3)]  # stops at the first differing token (index 1)
    # a token whose alone top 2 is not among the concurrent candidates is left out
    assert margin_changes(_resp([5], [{5: -0.1, 4: -0.2}]), _resp([5], [{5: -0.1, 6: -2.6}])) == []


def _row(variant, mism, p95, mx, calls=10):
    return {"variant": variant, "requests": 16, "slots": 4, "errors": [], "incomplete": [], "error_lines": [],
            "alone_recheck_differs": [], "sparq_calls": calls if variant == "sparq" else 0,
            "mismatches": [{"request": 0, "top2_logprob_margin_alone": m} for m in mism],
            "margin_change": {"p95": p95, "max": mx}}


def test_judge_sweep_allows_only_upstreams_own_flips():
    """server_load.judge_sweep: SparQ passes with no mismatch; a mismatch only where dense's own
    logits moved more than its margin in the same load and SparQ's moved no more than dense's;
    never without a dense row to compare with, never with an error."""
    from server_load import judge_sweep

    dense = _row("dense", [], 0.05, 0.6)
    assert judge_sweep({"rows": [_row("sparq", [], 0.05, 0.5), dense]}) == []
    assert judge_sweep({"rows": [_row("sparq", [0.25], 0.05, 0.5), dense]}) == []
    assert "does not reach" in judge_sweep({"rows": [_row("sparq", [0.9], 0.05, 1.0), dense]})[0]
    assert "moved more than dense" in judge_sweep({"rows": [_row("sparq", [], 0.2, 0.5), dense]})[0]
    assert "no dense row" in judge_sweep({"rows": [_row("sparq", [0.25], 0.05, 0.5)]})[0]
    assert "no SparQ call" in judge_sweep({"rows": [_row("sparq", [], 0.05, 0.5, calls=0), dense]})[0]
    bad = dict(dense, errors=[{"request": 3, "error": "HTTPError"}])
    assert "errors" in judge_sweep({"rows": [_row("sparq", [], 0.05, 0.5), bad]})[0]
