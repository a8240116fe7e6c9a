// llama-sparq: GGML_OP_SPARQ_ATTN on ggml's CUDA backend.
//
// The same semantics as the CPU driver (sparq-cpu.cpp) and the NumPy reference
// (py/llama_sparq/reference.py); docs/algorithm.md is the contract. Names: S cells (n_kv) per
// stream, a "row" R is one query row of one stream (R = stream * n_rows + row), a
// "unit" u is one (row, KV head) (u = R * n_head_kv + kvh), g = n_head / n_head_kv
// query heads share a unit, a "list" is one top-k selection (one per unit, or one per
// query head of the unit with the per-head flag: li = u * ph + h).
//
// Stages (one kernel each, all on the op's stream, sizes from the shapes only: no host
// synchronisation, every launch the same for a given shape, so CUDA graphs capture it):
//
//   selection seam -- a selector turns the inputs into a cell bitmap per unit:
//   1 rows        per row: valid cells, mode (sparse / dense / dense stream), local window
//                 (the last l valid cells, or the given window list as a bitmap)
//   2 components  per unit: i1 = the r largest of sum_h |q_sel_h| (times comp_w), ties to
//                 the lower index, ascending; the query's r components times 1/tau_h
//   3 approx      per (cell tile, unit): approximate logits of the g heads from r rows of
//                 K^T (each row read coalesced, vector loads when aligned), + mask; stored,
//                 with each tile's softmax maximum and sum
//   4 group keys  (g > 1, shared choice) per (cell tile, unit): sum_h softmax_h per cell
//   5 radix select, 4 passes of 8 bits (hist + pick): the kk-th largest key of each list
//                 among its eligible cells (valid, before the window, not a window cell);
//                 exact ties at the bound go to the lower cell index (the CPU's order)
//   6 collect     per (cell tile, list): set the chosen cells and the window in the bitmap
//                 (the per-head lists of a unit OR into one bitmap: their union)
//
//   shared stage -- every selector ends here:
//   7 attend      per unit: the bitmap -> ascending cell list; exact softmax attention of
//                 the g query heads over the cells (online, 256 cells at a time); mean-V
//                 mix with alpha = the approximate softmax mass of the cells; rows in the
//                 dense modes attend over all their valid cells without mean-V. With few
//                 units (batch 1) each unit's list is split over several blocks (parts of
//                 at least 32 cells) and a combine kernel adds their partial softmax sums.
//
// A new selector (the accuracy issues add some) writes the unit's bitmap (and, for the
// mean-V mix, the approximate logits and tile statistics) and reuses stage 7.

#include "sparq-cuda.cuh"
#include "ggml-sparq.h"

#include <algorithm>
#include <atomic>

typedef cudaStream_t sparq_stream_t;
#define SPARQ_LAUNCH(kernel, grid, block, stream, ...) kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#define SPARQ_MEMSET(ptr, bytes, stream) CUDA_CHECK(cudaMemsetAsync((ptr), 0, (bytes), (stream)))

#include "sparq-cuda-kernels.cuh"

// ---------------------------------------------------------------------------
// dispatch: the nodes the kernels cover, the op's parameters
// ---------------------------------------------------------------------------

static bool sparq_cu_type_ok(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_F32;
}

// NULL when the CUDA kernels cover the node, else why not
static const char * sparq_cuda_unsupported(const ggml_tensor * op) {
    const ggml_tensor * q = op->src[0];
    const ggml_tensor * k = op->src[1];
    const ggml_tensor * kt = op->src[2];
    const ggml_tensor * v = op->src[3];
    const ggml_tensor * mk = op->src[6];
    if (q->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32) {
        return "q and the result must be f32";
    }
    if (!sparq_cu_type_ok(k) || !sparq_cu_type_ok(kt) || !sparq_cu_type_ok(v)) {
        return "K, K^T and V must be f16 or f32";
    }
    if (mk && mk->type != GGML_TYPE_F16 && mk->type != GGML_TYPE_F32) {
        return "the mask must be f16 or f32";
    }
    if (q->ne[0] > GGML_CUDA_SPARQ_D_MAX || v->ne[0] > GGML_CUDA_SPARQ_D_MAX) {
        return "head sizes above 256";
    }
    const int64_t g = q->ne[2] / k->ne[2];
    if (g > GGML_CUDA_SPARQ_G_MAX) {
        return "more than 16 query heads per KV head";
    }
    const int32_t sel = ggml_get_op_params_i32(op, 4);
    if (sel != GGML_SPARQ_SEL_SPARQ && sel != GGML_SPARQ_SEL_ORACLE) {
        return "the streaming, h2o and index selectors (CPU only)";
    }
    const int32_t top_k = ggml_get_op_params_i32(op, 1);
    const int32_t flags = ggml_get_op_params_i32(op, 5);
    if (top_k > GGML_CUDA_SPARQ_K_MAX) {
        return "k above 16384";
    }
    if (ggml_get_op_params_f32(op, 8) > 0.0f && ggml_get_op_params_i32(op, 11)) {
        return "a coverage target (calibrated k: CPU only so far)";
    }
    const int64_t ph = (flags & GGML_SPARQ_FLAG_PER_HEAD) && g > 1 ? g : 1;
    const int64_t U = q->ne[1] * q->ne[3] * k->ne[2];
    if (U > 65535 || U * ph > 65535) {
        return "more than 65535 (query row, KV head) pairs";
    }
    if (k->ne[1] >= (int64_t) 1 << 30) {
        return "2^30 or more KV cells";
    }
    const ggml_tensor * qs = op->src[8];
    const ggml_tensor * cw = op->src[9];
    if ((qs && qs->type != GGML_TYPE_F32) || (cw && cw->type != GGML_TYPE_F32)) {
        return "q_sel and comp_w must be f32";
    }
    const ggml_tensor * win = op->src[7];
    if (win && win->type != GGML_TYPE_I32) {
        return "the window must be i32";
    }
    return nullptr;
}

bool ggml_cuda_sparq_attn_supported(int device, const ggml_tensor * op) {
    GGML_UNUSED(device);
    const char * why = sparq_cuda_unsupported(op);
    if (why) {
        // the scheduler then runs the op on the CPU: say so once
        static std::atomic<bool> said{false};
        if (!said.exchange(true)) {
            GGML_LOG_WARN("sparq_attn: the CUDA kernels do not cover %s (%s); the op runs on the CPU\n", op->name, why);
        }
        return false;
    }
    return true;
}

// the widest consecutive-cell load every K^T row allows: 1, or CPT (S % CPT == 0, rows aligned)
static int sparq_cuda_cpt(const ggml_tensor * kt, int gmax) {
    const int want = sparq_vec_cpt(gmax);
    const size_t esz = ggml_type_size(kt->type);
    const size_t al = std::min<size_t>(16, want * esz);
    const bool ok = kt->ne[0] % want == 0 && (uintptr_t) kt->data % al == 0 && kt->nb[1] % al == 0 &&
                    kt->nb[2] % al == 0 && kt->nb[3] % al == 0;
    return ok ? want : 1;
}

// a from the node's parameters, shapes and tensors, all but the scratch; *cpt the K^T load width.
// false: nothing to compute (and no empty grid to launch)
static bool sparq_cuda_args_of(const ggml_tensor * dst, sparq_cu_args & a, int * cpt) {
    const ggml_tensor * q  = dst->src[0];
    const ggml_tensor * k  = dst->src[1];
    const ggml_tensor * kt = dst->src[2];
    const ggml_tensor * v  = dst->src[3];
    const ggml_tensor * vs = dst->src[4];
    const ggml_tensor * vc = dst->src[5];
    const ggml_tensor * mk = dst->src[6];
    const ggml_tensor * win = dst->src[7];
    const ggml_tensor * qsel = dst->src[8];
    const ggml_tensor * cw = dst->src[9];
    GGML_ASSERT(ggml_is_contiguous(vc) && vs->nb[0] == sizeof(float));
    GGML_ASSERT(q->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float));

    a.d = (int) q->ne[0];
    a.dv = (int) v->ne[0];
    a.S = (int) k->ne[1];
    a.n_rows = (int) q->ne[1];
    a.n_head = (int) q->ne[2];
    a.n_hkv = (int) k->ne[2];
    a.n_stream = (int) q->ne[3];
    a.g = a.n_head / a.n_hkv;
    const int32_t flags = ggml_get_op_params_i32(dst, 5);
    a.ph = (flags & GGML_SPARQ_FLAG_PER_HEAD) && a.g > 1 ? a.g : 1;
    a.no_mean_v = (flags & GGML_SPARQ_FLAG_NO_MEAN_V) != 0;
    a.r = ggml_get_op_params_i32(dst, 0);
    a.k = ggml_get_op_params_i32(dst, 1);
    a.l = ggml_get_op_params_i32(dst, 2);
    a.scale = ggml_get_op_params_f32(dst, 3);
    if (ggml_get_op_params_i32(dst, 4) == GGML_SPARQ_SEL_ORACLE) {
        a.r = a.d; // the oracle: SparQ with every component
    }
    GGML_ASSERT(a.r >= 1 && a.r <= a.d && a.k >= 1 && a.l >= 0 && a.l <= a.k);

    a.R = a.n_stream * a.n_rows;
    a.U = a.R * a.n_hkv;
    a.L = a.U * a.ph;
    if (a.U == 0 || a.dv == 0) {
        return false;
    }
    // at least one tile and one bitmap word: an empty cache (S = 0) gives dense rows with no cell
    a.W = std::max(1, (a.S + 31) / 32);
    const int gmax = sparq_gmax(a.g);
    *cpt = sparq_cuda_cpt(kt, gmax);
    a.nt_a = std::max(1, (a.S + SPARQ_NT * *cpt - 1) / (SPARQ_NT * *cpt));
    a.nt_s = std::max(1, (a.S + SPARQ_TS - 1) / SPARQ_TS);
    a.sel_max = a.ph * a.k;

    a.q = (const char *) q->data; a.q_nb1 = q->nb[1]; a.q_nb2 = q->nb[2]; a.q_nb3 = q->nb[3];
    const ggml_tensor * qq = qsel ? qsel : q;
    a.qs = (const char *) qq->data; a.qs_nb1 = qq->nb[1]; a.qs_nb2 = qq->nb[2]; a.qs_nb3 = qq->nb[3];
    if (cw) {
        a.cw = (const char *) cw->data; a.cw_nb1 = cw->nb[1]; a.cw_nb2 = cw->ne[2] > 1 ? cw->nb[2] : 0;
    }
    a.K = (const char *) k->data;   a.K_nb1 = k->nb[1];   a.K_nb2 = k->nb[2];   a.K_nb3 = k->nb[3];
    a.KT = (const char *) kt->data; a.KT_nb1 = kt->nb[1]; a.KT_nb2 = kt->nb[2]; a.KT_nb3 = kt->nb[3];
    a.V = (const char *) v->data;   a.V_nb1 = v->nb[1];   a.V_nb2 = v->nb[2];   a.V_nb3 = v->nb[3];
    a.v_sum = (const char *) vs->data; a.vs_nb1 = vs->nb[1]; a.vs_nb2 = vs->nb[2];
    a.v_count = (const float *) vc->data;
    if (mk) {
        a.mask = (const char *) mk->data; a.mask_f16 = mk->type == GGML_TYPE_F16;
        a.m_nb1 = mk->nb[1]; a.m_nb3 = mk->nb[3]; a.m_ne3 = (int) mk->ne[3];
    }
    if (win) {
        a.win = (const char *) win->data; a.win_nb1 = win->nb[1]; a.win_nb2 = win->nb[2]; a.win_n = (int) win->ne[0];
    }
    a.out = (char *) dst->data; a.o_nb1 = dst->nb[1]; a.o_nb2 = dst->nb[2]; a.o_nb3 = dst->nb[3];
    return true;
}

// ---------------------------------------------------------------------------
// launch: scratch from ctx's pool, the kernels on ctx's stream
// ---------------------------------------------------------------------------

void ggml_cuda_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const char * why = sparq_cuda_unsupported(dst);
    if (why) {
        GGML_ABORT("sparq_attn: the CUDA kernels do not cover %s: %s", dst->name, why);
    }
    sparq_cu_args a = {};
    int cpt = 1;
    if (!sparq_cuda_args_of(dst, a, &cpt)) {
        return; // nothing to compute (and no empty grid to launch)
    }

    // scratch: sizes from the shapes only (the same for every decode step of a shape)
    ggml_cuda_pool & pool = ctx.pool();
    const sparq_cu_scratch z = sparq_cu_scratch_sizes(a);
    ggml_cuda_pool_alloc<sparq_cu_row>  rows(pool, z.rows);
    ggml_cuda_pool_alloc<unsigned int>  wbits(pool, z.wbits);
    ggml_cuda_pool_alloc<int>           i1(pool, z.i1);
    ggml_cuda_pool_alloc<float>         qsc(pool, z.qsc);
    ggml_cuda_pool_alloc<float>         logits(pool, z.logits);
    ggml_cuda_pool_alloc<float2>        tstat(pool, z.tstat);
    ggml_cuda_pool_alloc<float>         keys(pool, z.keys);
    ggml_cuda_pool_alloc<unsigned int>  hist(pool, z.hist);
    ggml_cuda_pool_alloc<sparq_cu_pick> pick(pool, z.pick);
    ggml_cuda_pool_alloc<int>           eqcnt(pool, z.eqcnt);
    ggml_cuda_pool_alloc<unsigned int>  selbits(pool, z.selbits);
    ggml_cuda_pool_alloc<int>           sel(pool, z.sel);
    ggml_cuda_pool_alloc<float>         pstat(pool, z.pstat);
    ggml_cuda_pool_alloc<float>         py(pool, z.py);
    a.rows = rows.get(); a.wbits = wbits.get(); a.i1 = i1.get(); a.qsc = qsc.get(); a.logits = logits.get();
    a.tstat = tstat.get(); a.keys = keys.get(); a.hist = hist.get(); a.pick = pick.get(); a.eqcnt = eqcnt.get();
    a.selbits = selbits.get(); a.sel = sel.get(); a.pstat = pstat.get(); a.py = py.get();

    const bool kt_f16 = dst->src[2]->type == GGML_TYPE_F16;
    const bool k_f16 = dst->src[1]->type == GGML_TYPE_F16;
    const bool v_f16 = dst->src[3]->type == GGML_TYPE_F16;
    sparq_cu_run(a, cpt, kt_f16, k_f16, v_f16, ctx.stream());
}
