// llama-sparq: GGML_OP_SPARQ_ATTN on ggml's CUDA backend.
//
// The same semantics as the CPU driver (sparq-cpu.cpp) and the NumPy reference
// (dev/sparq_lab/reference.py); docs/algorithm.md is the contract. Names: S cells (n_kv) per
// stream, a "row" R is one query row of one stream (R = stream * n_rows + row), a
// "unit" u is one (row, KV head) (u = R * n_head_kv + kvh), g = n_head / n_head_kv
// query heads share a unit, a "list" is one top-k selection (one per unit, or one per
// query head of the unit with the per-head flag: li = u * ph + h).
//
// Three kernels, all on the op's stream, sized from the shapes only: no host synchronisation and
// the same launches for every decode step of a shape, so CUDA graphs capture them. Each kernel
// clears what a later one accumulates into, so there is no memset between them. The experimental
// build (SPARQ_CUDA_EXPERIMENTAL, experimental/) adds the variants no GPU has timed yet behind their
// LLAMA_SPARQ_CUDA_* switches, among them one launch per layer for short contexts
// (LLAMA_SPARQ_CUDA_FUSED=1), which counts in the layer's persistent tickets.
//
//   1 k_sparq_score   per (score tile, unit): the components (i1 = the r largest of sum_h
//                     |q_sel_h| times comp_w, ties to the lower index; the query's r components
//                     times 1/tau_h), the tile's valid cells, the approximate logits of the g
//                     heads from r rows of K^T (coalesced, vector loads when aligned) + mask, and
//                     each tile's softmax maximum and sum
//   2 k_sparq_select  per (selection tile, list): the group keys of a shared choice (sum_h of the
//                     softmaxes), the given window's cells, and a histogram of the eligible keys'
//                     top 12 bits (with their estimated mass for the calibrated k). The last tile
//                     of a list to finish chooses for the list: the row's mode and tail window
//                     (the last l valid cells) from the score tiles' counts; the calibrated k's
//                     cut at the coverage target; the bin of the kk-th largest key, then one pass
//                     that sets the cells above it in the unit's bitmap and ranks that bin's cells
//                     in shared memory (exact ties to the lower cell, as on the CPU); radix passes
//                     over the list where the bin holds too many cells. With topk_buckets the tiles
//                     offer each eligible cell to its bucket (cell mod B) by a 64-bit atomic maximum
//                     of key and cell instead, and the last tile takes the best offers (radix passes)
//   3 k_sparq_attend  per unit, or split over parts (k_sparq_attend_part) while the units are few
//                     (batch 1): the bitmap -> ascending cell list; exact softmax attention of the
//                     g query heads over the cells (online, 256 cells at a time); mean-V mix with
//                     alpha = the approximate softmax mass of the cells; rows in the dense modes
//                     attend over all their valid cells without mean-V. The last part of a unit to finish combines the parts'
//                     partial softmax sums (flash-decoding).
//
// A new selector writes the unit's bitmap (and, for the mean-V mix, the approximate logits and
// tile statistics) and reuses kernel 3.

#include "sparq-cuda.cuh"
#include "ggml-sparq.h"
#include "sparq-cuda-support.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

typedef cudaStream_t sparq_stream_t;
#define SPARQ_LAUNCH(kernel, grid, block, stream, ...) kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
// upstream's launch: programmatic dependent on sm_90 code (unless GGML_CUDA_PDL=0), else ordinary
// (the experimental build's LLAMA_SPARQ_CUDA_PDL)
#define SPARQ_LAUNCH_PDL(kernel, grid, block, stream, ...) \
    ggml_cuda_kernel_launch(kernel, ggml_cuda_kernel_launch_params(dim3(grid), dim3(block), 0, (stream)), __VA_ARGS__)

#include "sparq-cuda-kernels.cuh"

// ---------------------------------------------------------------------------
// dispatch: the nodes the kernels cover (sparq-cuda-support.h), the op's parameters
// ---------------------------------------------------------------------------

bool ggml_cuda_sparq_attn_supported(int device, const ggml_tensor * op) {
    GGML_UNUSED(device);
    const char * why = sparq_cuda_why_not(op);
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

#ifdef SPARQ_CUDA_EXPERIMENTAL
// The one launch's tickets (the experimental build's own state: the op's contract has no buffer for
// them): GGML_CUDA_SPARQ_TICKETS unsigned ints per (device, K^T view), the same address at every step
// so that a captured CUDA graph replays them, allocated on first use and kept for the process's life
// (16 KB a layer), cleared on the op's stream when made; the launch leaves them zero. NULL: none.
static unsigned int * sparq_cuda_tickets(ggml_backend_cuda_context & ctx, const void * kt) {
    static std::mutex mtx;
    static std::map<std::pair<int, const void *>, unsigned int *> made;
    std::lock_guard<std::mutex> lock(mtx);
    unsigned int *& t = made[{ ctx.device, kt }];
    if (!t) {
        if (cudaMalloc((void **) &t, GGML_CUDA_SPARQ_TICKETS * sizeof(unsigned int)) != cudaSuccess) {
            (void) cudaGetLastError();
            made.erase({ ctx.device, kt });
            return nullptr;
        }
        CUDA_CHECK(cudaMemsetAsync(t, 0, GGML_CUDA_SPARQ_TICKETS * sizeof(unsigned int), ctx.stream()));
    }
    return t;
}
#endif

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
static bool sparq_cuda_args_of(ggml_tensor * dst, sparq_cu_args & a, int * cpt) {
    ggml_sparq_attn_view w;
    GGML_ASSERT(ggml_sparq_attn_view_of(dst, &w));
    const ggml_tensor * q = w.q, * k = w.k, * kt = w.kt, * v = w.v, * vs = w.v_sum, * vc = w.v_count, * mk = w.mask;
    const ggml_tensor * win = w.win, * qsel = w.q_sel, * cw = w.comp_w;
    GGML_ASSERT(ggml_is_contiguous(vc) && vs->nb[0] == sizeof(float));
    GGML_ASSERT(q->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float));

    a.d = w.d;
    a.dv = w.dv;
    a.n_kv = w.n_kv;
    a.n_rows = w.n_rows;
    a.n_head = w.n_head;
    a.n_head_kv = w.n_head_kv;
    a.n_stream = w.n_stream;
    a.g = a.n_head / a.n_head_kv;
    const ggml_sparq_attn_params & P = w.p;
    a.ph = (P.flags & GGML_SPARQ_FLAG_PER_HEAD) && a.g > 1 ? a.g : 1;
    a.no_mean_v = (P.flags & GGML_SPARQ_FLAG_NO_MEAN_V) != 0;
    a.r = P.r;
    a.k = P.k;
    a.l = P.l;
    a.scale = P.scale;
    a.softcap = P.softcap;
    a.max_bias = P.max_bias;
    a.sinks = w.sinks ? (const float *) w.sinks->data : nullptr;
    if (const ggml_tensor * b = w.kq_b) {
        a.kq_b = (const char *) b->data; a.kb_nb1 = b->nb[1]; a.kb_nb2 = b->nb[2]; a.kb_nb3 = b->nb[3];
        a.kb_ne3 = (int) b->ne[3];
    }
    if (P.cov_p > 0.0f && P.cov_apply) {
        // the calibrated k (a coverage only measured is refused: sparq-cuda-support.h)
        a.cov_p = P.cov_p;
        a.k_min = P.k_min;
        a.k_frac = P.k_frac;
    }
    if (w.selector->every_component) {
        a.r = a.d; // exact scores: the ranking with every component
    }
    // (the op's check keeps it to a fixed k; cells below S fall in min(B, S) buckets alike)
    a.buckets = P.topk_buckets > 0 ? std::max(1, std::min((int) P.topk_buckets, (int) k->ne[1])) : 0;
    GGML_ASSERT(a.r >= 1 && a.r <= a.d && a.k >= 1 && a.l >= 0 && a.l <= a.k);

    a.R = a.n_stream * a.n_rows;
    a.U = a.R * a.n_head_kv;
    a.L = a.U * a.ph;
    if (a.U == 0 || a.dv == 0) {
        return false;
    }
    // at least one tile and one bitmap word: an empty cache (S = 0) gives dense rows with no cell
    a.W = std::max(1, (a.n_kv + 31) / 32);
    const int gmax = sparq_gmax(a.g);
    *cpt = sparq_cuda_cpt(kt, gmax);
    a.tl_a = SPARQ_NT * *cpt;
    a.nt_a = std::max(1, (a.n_kv + a.tl_a - 1) / a.tl_a);
    a.nt_s = std::max(1, (a.n_kv + SPARQ_TS - 1) / SPARQ_TS);
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

// row idx[i] (or i) of dst = e5m2 of row i of src: one thread per value
template <typename TS>
static __global__ void k_sparq_kt_append(const char * src, size_t s_nb1, const int64_t * idx, char * dst,
                                         size_t d_nb1, int64_t ne0, int64_t n) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * ne0) {
        return;
    }
    const int64_t row = i / ne0, j = i % ne0;
    const TS x = ((const TS *) (src + (size_t) row * s_nb1))[j];
    unsigned short h;
    if constexpr (std::is_same_v<TS, half>) {
        h = __half_as_ushort(x);
    } else {
        h = __half_as_ushort(__float2half_rn(x)); // f32: to f16 first, as the CPU does
    }
    dst[(size_t) (idx ? idx[row] : row) * d_nb1 + j] = (char) ggml_sparq_f16_to_e5m2(h);
}

static void sparq_cuda_kt_append(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src = dst->src[1];
    const ggml_tensor * idx = dst->src[2];
    const int64_t ne0 = src->ne[0], n = src->ne[1];
    if (n * ne0 == 0) {
        return;
    }
    const int nt = 256;
    const dim3 grid((unsigned int) ((n * ne0 + nt - 1) / nt));
    const int64_t * ip = idx ? (const int64_t *) idx->data : nullptr;
    if (src->type == GGML_TYPE_F16) {
        k_sparq_kt_append<half><<<grid, nt, 0, ctx.stream()>>>((const char *) src->data, src->nb[1], ip,
                                                                (char *) dst->data, dst->nb[1], ne0, n);
    } else {
        k_sparq_kt_append<float><<<grid, nt, 0, ctx.stream()>>>((const char *) src->data, src->nb[1], ip,
                                                                 (char *) dst->data, dst->nb[1], ne0, n);
    }
}

// the windows' pushes of a cell scatter (ggml_sparq_cell_scatter_set_window), by one block, token by
// token in order as on the CPU (a stream may come twice): each row shifted by one, from its end down
// a block's width at a time (all of a step's reads before its writes), then the token's cell in front
static __device__ void sparq_cell_scatter_window(const int64_t * idx, int64_t n, int64_t kv_size, char * win,
                                                 size_t w_nb1, int w) {
    for (int64_t t = 0; t < n; ++t) {
        int * row = (int *) (win + (size_t) (idx[t] / kv_size) * w_nb1);
        for (int hi = w - 1; hi >= 1; hi -= (int) blockDim.x) {
            const int j = hi - (int) threadIdx.x;
            const int x = j >= 1 ? row[j - 1] : 0;
            __syncthreads();
            if (j >= 1) {
                row[j] = x;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            row[0] = (int) (idx[t] % kv_size);
        }
        __syncthreads();
    }
}

// a ubatch's per-cell values at its cells (ggml_sparq_cell_scatter): one thread per value; the cell
// and stream from upstream's K row index (stream * kv_size + cell); with a window, one block more
// (the last) pushes the cells into it, in the same launch
template <typename TS, typename TD>
static __global__ void k_sparq_cell_scatter(const char * src, size_t s_nb1, const int64_t * idx, TD * dst,
                                            int64_t E, int64_t n, int64_t kv_size, char * win, size_t w_nb1, int w) {
    if (win && blockIdx.x == gridDim.x - 1) {
        sparq_cell_scatter_window(idx, n, kv_size, win, w_nb1, w);
        return;
    }
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * E) {
        return;
    }
    const int64_t t = i / E, j = i % E;
    const int64_t strm = idx[t] / kv_size, c = idx[t] % kv_size;
    const TS x = ((const TS *) (src + (size_t) t * s_nb1))[j];
    TD * d = dst + ((size_t) strm * E + j) * kv_size + c;
    if constexpr (std::is_same_v<TD, float>) {
        *d = (float) x;
    } else {
        half h;
        if constexpr (std::is_same_v<TS, half>) {
            h = x;
        } else {
            h = __float2half_rn(x); // as set_rows (and, for e5m2, the CPU) rounds
        }
        if constexpr (std::is_same_v<TD, half>) {
            *d = h;
        } else {
            *d = (char) ggml_sparq_f16_to_e5m2(__half_as_ushort(h));
        }
    }
}

// a ubatch's keys into a 4-bit K^T: one thread per K^T row (of E), its cells written token by token
// in order (a block of cells has one writer: ggml_sparq_kt4_put); with a window the last block pushes
template <typename TS>
static __global__ void k_sparq_cell_scatter_kt4(const char * src, size_t s_nb1, const int64_t * idx, uint8_t * dst,
                                                int64_t E, int64_t n, int64_t kv_size, char * win, size_t w_nb1, int w) {
    if (win && blockIdx.x == gridDim.x - 1) {
        sparq_cell_scatter_window(idx, n, kv_size, win, w_nb1, w);
        return;
    }
    const int64_t j = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= E) {
        return;
    }
    const size_t rb = (size_t) (kv_size / GGML_SPARQ_KT4_CELLS) * GGML_SPARQ_KT4_BYTES;
    for (int64_t t = 0; t < n; ++t) {
        const int64_t strm = idx[t] / kv_size, c = idx[t] % kv_size;
        const TS x = ((const TS *) (src + (size_t) t * s_nb1))[j];
        unsigned short h;
        if constexpr (std::is_same_v<TS, half>) {
            h = __half_as_ushort(x);
        } else {
            h = __half_as_ushort(__float2half_rn(x)); // as the CPU rounds
        }
        ggml_sparq_kt4_put(dst + ((size_t) strm * E + j) * rb, c, h);
    }
}

template <typename TS>
static void sparq_cuda_cell_scatter_src(ggml_backend_cuda_context & ctx, const ggml_tensor * src, const int64_t * ip,
                                        ggml_tensor * dst, dim3 grid, int nt, int64_t E, int64_t n) {
    const char * s = (const char *) src->data;
    const int64_t kv = dst->ne[0];
    const ggml_tensor * win = dst->src[3];
    char * wp = win ? (char *) win->data : nullptr;
    const size_t w_nb1 = win ? win->nb[1] : 0;
    const int w = win ? (int) win->ne[0] : 0;
    if (win) {
        grid.x += 1; // the windows' block
    }
    switch (dst->type) {
        case GGML_TYPE_Q4_1:
            grid.x = (unsigned int) ((E + nt - 1) / nt) + (win ? 1 : 0);
            k_sparq_cell_scatter_kt4<TS><<<grid, nt, 0, ctx.stream()>>>(s, src->nb[1], ip, (uint8_t *) dst->data, E, n,
                                                                         kv, wp, w_nb1, w);
            break;
        case GGML_TYPE_F32:
            k_sparq_cell_scatter<TS, float><<<grid, nt, 0, ctx.stream()>>>(s, src->nb[1], ip, (float *) dst->data, E, n, kv,
                                                                            wp, w_nb1, w);
            break;
        case GGML_TYPE_F16:
            k_sparq_cell_scatter<TS, half><<<grid, nt, 0, ctx.stream()>>>(s, src->nb[1], ip, (half *) dst->data, E, n, kv,
                                                                           wp, w_nb1, w);
            break;
        default:
            k_sparq_cell_scatter<TS, char><<<grid, nt, 0, ctx.stream()>>>(s, src->nb[1], ip, (char *) dst->data, E, n, kv,
                                                                           wp, w_nb1, w);
            break;
    }
}

static void sparq_cuda_cell_scatter(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src = dst->src[1];
    const int64_t * ip = (const int64_t *) dst->src[2]->data;
    const int64_t E = src->ne[0], n = src->ne[1];
    if (n * E == 0) {
        return;
    }
    const int nt = 256;
    const dim3 grid((unsigned int) ((n * E + nt - 1) / nt));
    if (src->type == GGML_TYPE_F16) {
        sparq_cuda_cell_scatter_src<half>(ctx, src, ip, dst, grid, nt, E, n);
    } else {
        sparq_cuda_cell_scatter_src<float>(ctx, src, ip, dst, grid, nt, E, n);
    }
}

// a sum's append (ggml_sparq_sum_append): one thread per element; every product and sum rounded on
// its own (no fused multiply-add), as the CPU's
static __global__ void k_sparq_sum_append(char * sum, size_t s_nb1, char * comp, size_t c_nb1, const float * xn,
                                          float * cnt, int64_t ne0, int64_t n, bool f16, bool squares) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const int64_t s = i / ne0, j = i % ne0;
    if (cnt && j == 0) {
        cnt[s] += 1.0f; // one new cell per stream
    }
    float * sp = (float *) (sum + (size_t) s * s_nb1) + j;
    float x = f16 ? __half2float(__float2half_rn(xn[i])) : xn[i];
    if (squares) {
        x = __fmul_rn(x, x);
    }
    if (comp) {
        float * cp = (float *) (comp + (size_t) s * c_nb1) + j;
        const float y = __fsub_rn(x, *cp);
        const float t = __fadd_rn(*sp, y);
        *cp = __fsub_rn(__fsub_rn(t, *sp), y);
        *sp = t;
    } else {
        *sp = __fadd_rn(*sp, x);
    }
}

static void sparq_cuda_sum_append(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_sparq_sum_params prm = ggml_sparq_params_get(dst).sum;
    const ggml_tensor * sum = dst->src[0];
    const ggml_tensor * comp = dst->src[2];
    const int64_t ne0 = sum->ne[0], n = ne0 * sum->ne[1];
    if (n == 0) {
        return;
    }
    const int nt = 256;
    const dim3 grid((unsigned int) ((n + nt - 1) / nt));
    k_sparq_sum_append<<<grid, nt, 0, ctx.stream()>>>((char *) sum->data, sum->nb[1], comp ? (char *) comp->data : nullptr,
                                                      comp ? comp->nb[1] : 0, (const float *) dst->src[1]->data,
                                                      dst->src[3] ? (float *) dst->src[3]->data : nullptr, ne0, n,
                                                      prm.type == GGML_TYPE_F16, prm.squares);
}

void ggml_cuda_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const char * why = sparq_cuda_why_not(dst);
    if (why) {
        GGML_ABORT("sparq_attn: the CUDA kernels do not cover %s: %s", dst->name, why);
    }
    switch (ggml_sparq_params_get(dst).mode) {
        case GGML_SPARQ_MODE_SUM_APPEND: sparq_cuda_sum_append(ctx, dst); return;
        case GGML_SPARQ_MODE_KT_APPEND:  sparq_cuda_kt_append(ctx, dst); return;
        case GGML_SPARQ_MODE_CELL_SCATTER: sparq_cuda_cell_scatter(ctx, dst); return;
        default: break;
    }
    sparq_cu_args a = {};
    int cpt = 1;
    if (!sparq_cuda_args_of(dst, a, &cpt)) {
        return; // nothing to compute (and no empty grid to launch)
    }

    const ggml_type ktt = dst->src[2]->type;
    const int kt = ktt == GGML_TYPE_F16 ? SPARQ_CU_KT_F16 : ktt == GGML_TYPE_I8 ? SPARQ_CU_KT_E5M2
                 : ktt == GGML_TYPE_Q4_1 ? SPARQ_CU_KT_KT4 : SPARQ_CU_KT_F32;
    const bool k_f16 = dst->src[1]->type == GGML_TYPE_F16;
    const bool v_f16 = dst->src[3]->type == GGML_TYPE_F16;
#ifdef SPARQ_CUDA_EXPERIMENTAL
    // the one launch per layer where it applies: its tickets (persistent, zero between launches)
    if (sparq_fused_on()) {
        a.tickets = sparq_cuda_tickets(ctx, dst->src[2]->data);
        if (a.tickets && !sparq_fused_applies(a, kt, k_f16, v_f16)) {
            a.tickets = nullptr;
        }
        static std::atomic<bool> said{false};
        if (a.tickets && !said.exchange(true)) {
            GGML_LOG_INFO("sparq_attn: one launch per layer (LLAMA_SPARQ_CUDA_FUSED=1) from %s on\n", dst->name);
        }
    }
#endif

    // scratch: sizes from the shapes only (the same for every decode step of a shape)
    ggml_cuda_pool & pool = ctx.pool();
    const sparq_cu_scratch z = sparq_cu_scratch_sizes(a);
    ggml_cuda_pool_alloc<sparq_cu_row> rows(pool, z.rows);
    ggml_cuda_pool_alloc<unsigned int> wbits(pool, z.wbits);
    ggml_cuda_pool_alloc<float>        logits(pool, z.logits);
    ggml_cuda_pool_alloc<float2>       tstat(pool, z.tstat);
    ggml_cuda_pool_alloc<int>          tcnt(pool, z.tcnt);
    ggml_cuda_pool_alloc<float>        keys(pool, z.keys);
    ggml_cuda_pool_alloc<unsigned int> hist(pool, z.hist);
    ggml_cuda_pool_alloc<double>       hmass(pool, z.hmass);
    ggml_cuda_pool_alloc<unsigned int> ldone(pool, z.ldone);
    ggml_cuda_pool_alloc<uint2>        cand(pool, z.cand);
    ggml_cuda_pool_alloc<unsigned int> ncand(pool, z.ncand);
    ggml_cuda_pool_alloc<unsigned long long> bk(pool, z.bk);
    ggml_cuda_pool_alloc<unsigned int> udone(pool, z.udone);
    ggml_cuda_pool_alloc<unsigned int> selbits(pool, z.selbits);
    ggml_cuda_pool_alloc<int>          sel(pool, z.sel);
    ggml_cuda_pool_alloc<float>        pstat(pool, z.pstat);
    ggml_cuda_pool_alloc<float>        py(pool, z.py);
    a.rows = rows.get(); a.wbits = wbits.get(); a.logits = logits.get(); a.tstat = tstat.get(); a.tcnt = tcnt.get();
    a.keys = keys.get(); a.hist = hist.get(); a.hmass = hmass.get(); a.ldone = ldone.get(); a.udone = udone.get();
    a.cand = cand.get(); a.ncand = ncand.get(); a.bk = bk.get();
    a.selbits = selbits.get(); a.sel = sel.get(); a.pstat = pstat.get(); a.py = py.get();
    // the report: the node's report tensor, on this device, written by the kernels (the host reads it
    // after the step: libllama queues its copy once the graph has run)
    ggml_cuda_pool_alloc<int> lrep(pool);
    if (const ggml_tensor * rep = dst->src[10]) { // (ggml_sparq_attn_view::report)
        a.report = (float *) rep->data;
        a.lrep = a.cov_p > 0.0f ? lrep.alloc(z.lrep) : nullptr;
    }

    sparq_cu_run(a, cpt, kt, k_f16, v_f16, ctx.stream());
}
