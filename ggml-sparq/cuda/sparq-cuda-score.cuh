// llama-sparq: the CUDA kernels of stages 1-4 (sparq-cuda.cu lists the stages): the rows' valid
// cells, modes and windows, the chosen query components, the approximate scores from K^T with
// their tile statistics, and the group keys of a shared choice.
#pragma once

#include "sparq-cuda-common.cuh"

// ---------------------------------------------------------------------------
// 1 rows: valid cells, mode, window
// ---------------------------------------------------------------------------

// the cells per block of k_sparq_count (a tile of the mask row)
#define SPARQ_COUNT_TILE (SPARQ_NT * 16)

// 1a: each row's valid cells, counted by tiles of the mask on many blocks (grid: tiles x rows) into
// rows[R].n_valid (zeroed before): one block per row would wait on the mask's loads at long S
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_count(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    const int R = blockIdx.y, tid = threadIdx.x;
    const char * m = sparq_mask_row(a, R);
    const int s0 = blockIdx.x * SPARQ_COUNT_TILE, s1 = min(a.S, s0 + SPARQ_COUNT_TILE);
    int n = 0;
    for (int s = s0 + tid; s < s1; s += SPARQ_NT) {
        n += sparq_valid(a, m, s);
    }
    int tot;
    sparq_block_scan(n, &tot, sh);
    if (tid == 0 && tot) {
        atomicAdd(&a.rows[R].n_valid, tot);
    }
}

// 1b: per row the mode and the window (a block per row; the count is k_sparq_count's)
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_rows(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    __shared__ int s_cnt, s_w0;
    const int R = blockIdx.x, tid = threadIdx.x;
    const int st = R / a.n_rows, row = R % a.n_rows;
    const char * m = sparq_mask_row(a, R);

    const int n_valid = a.rows[R].n_valid;
    __syncthreads(); // every thread has read it before thread 0 writes the row below

    const bool dense_all = a.v_count[st] < 0.0f;
    unsigned int * wb = a.win ? a.wbits + (size_t) R * a.W : nullptr;
    if (wb) {
        for (int i = tid; i < a.W; i += SPARQ_NT) {
            wb[i] = 0u;
        }
    }
    if (tid == 0) {
        s_cnt = 0;
        s_w0 = a.S;
    }
    __syncthreads();

    int n_win = 0;
    if (n_valid > a.k && a.l > 0 && !dense_all) {
        if (wb) {
            // the given cells of the l most recent positions: the valid ones, each once
            const int32_t * src = (const int32_t *) (a.win + (size_t) row * a.win_nb1 + (size_t) st * a.win_nb2);
            const int n_src = min(a.l, a.win_n);
            for (int i = tid; i < n_src; i += SPARQ_NT) {
                const int c = src[i];
                if (c >= 0 && c < a.S && sparq_valid(a, m, c)) {
                    const unsigned int bit = 1u << (c & 31);
                    const unsigned int old = atomicOr(&wb[c >> 5], bit);
                    if (!(old & bit)) {
                        atomicAdd(&s_cnt, 1);
                    }
                }
            }
            __syncthreads();
            n_win = s_cnt;
        } else {
            // the last l valid cells; w0 is the earliest of them (n_valid > k >= l: all l exist)
            int found = 0;
            for (int base = 0; base < a.S && found < a.l; base += SPARQ_NT) {
                const int s = a.S - 1 - (base + tid);
                const int f = s >= 0 && sparq_valid(a, m, s);
                int tot;
                const int incl = sparq_block_scan(f, &tot, sh);
                if (f && found + incl - 1 == a.l - 1) {
                    s_w0 = s;
                }
                found += tot;
            }
            __syncthreads();
            n_win = a.l;
        }
    }
    if (tid == 0) {
        sparq_cu_row ri;
        ri.n_valid = n_valid;
        ri.w0 = s_w0;
        ri.n_win = n_win;
        ri.mode = dense_all ? 2 : (n_valid <= a.k ? 1 : 0);
        a.rows[R] = ri;
    }
}

// ---------------------------------------------------------------------------
// 2 components: i1 and the scaled query components
// ---------------------------------------------------------------------------

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_components(const sparq_cu_args a) {
    __shared__ float aq[GGML_CUDA_SPARQ_D_MAX];
    __shared__ int si1[GGML_CUDA_SPARQ_D_MAX];
    __shared__ int sh[SPARQ_NW];
    __shared__ double shd[SPARQ_NW];
    const int u = blockIdx.x, j = threadIdx.x;
    const int R = u / a.n_hkv, kvh = u % a.n_hkv;
    const int st = R / a.n_rows, row = R % a.n_rows;
    const float * cw = a.cw ? (const float *) (a.cw + (size_t) kvh * a.cw_nb1 + (size_t) st * a.cw_nb2) : nullptr;
    const char * qbase = a.qs + (size_t) row * a.qs_nb1 + (size_t) st * a.qs_nb3;

    float s = 0.0f;
    if (j < a.d) {
        for (int h = 0; h < a.g; ++h) {
            s += fabsf(((const float *) (qbase + (size_t) (kvh * a.g + h) * a.qs_nb2))[j]);
        }
        if (cw) {
            s *= cw[j];
        }
        aq[j] = s;
    }
    __syncthreads();

    // the r largest, ties to the lower index
    int chosen = 0;
    if (j < a.d) {
        int rank = 0;
        for (int i = 0; i < a.d; ++i) {
            const float x = aq[i];
            rank += (x > s) || (x == s && i < j);
        }
        chosen = rank < a.r;
    }
    // (a NaN in q breaks the ranking: every slot gets a component anyway, never one out of range)
    if (j < a.r) {
        si1[j] = j;
    }
    int tot;
    const int pos = sparq_block_scan(chosen, &tot, sh) - 1; // ascending components
    if (chosen && pos < a.r) {
        si1[pos] = j;
    }
    __syncthreads();
    if (j < a.r) {
        a.i1[(size_t) u * a.r + j] = si1[j];
    }

    // 1/tau per head: scale * sqrt(||q||_1 / ||q[i1]||_1) (weighted norms with comp_w)
    for (int h = 0; h < a.g; ++h) {
        const float * q = (const float *) (qbase + (size_t) (kvh * a.g + h) * a.qs_nb2);
        double all = 0.0, part = 0.0;
        if (j < a.d) {
            all = (double) (fabsf(q[j]) * (cw ? cw[j] : 1.0f));
            part = chosen ? all : 0.0;
        }
        all = sparq_block_sum_d(all, shd);
        part = sparq_block_sum_d(part, shd);
        const float f = part > 0.0 ? (float) ((double) a.scale * sqrt(all / part)) : a.scale;
        if (j < a.r) {
            a.qsc[((size_t) u * a.g + h) * a.r + j] = q[si1[j]] * f;
        }
    }
}

// ---------------------------------------------------------------------------
// 3 approx: approximate logits from r rows of K^T, tile statistics
// ---------------------------------------------------------------------------

// CPT cells per thread (consecutive, one vector load per K^T row when CPT > 1)
template <int GMAX, typename TKT, int CPT>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_approx(const sparq_cu_args a) {
    __shared__ float sq[GMAX * GGML_CUDA_SPARQ_D_MAX];
    __shared__ int si1[GGML_CUDA_SPARQ_D_MAX];
    __shared__ float red[SPARQ_NW];
    const int u = blockIdx.y, tid = threadIdx.x;
    const int R = u / a.n_hkv, kvh = u % a.n_hkv, st = R / a.n_rows;
    if (a.rows[R].mode != 0) {
        return; // dense rows need no approximate scores
    }
    const int g = a.g, r = a.r;
    for (int i = tid; i < g * r; i += SPARQ_NT) {
        sq[i] = a.qsc[(size_t) u * g * r + i];
    }
    for (int i = tid; i < r; i += SPARQ_NT) {
        si1[i] = a.i1[(size_t) u * r + i];
    }
    __syncthreads();

    const int s0 = blockIdx.x * (SPARQ_NT * CPT) + tid * CPT;
    // with CPT > 1 the host guarantees S % CPT == 0, so a thread's cells are all in or all out
    const bool in = s0 < a.S;
    float acc[GMAX][CPT];
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            acc[h][c] = 0.0f;
        }
    }
    if (in) {
        const char * kt = a.KT + (size_t) kvh * a.KT_nb2 + (size_t) st * a.KT_nb3;
#pragma unroll 4
        for (int j = 0; j < r; ++j) {
            float v[CPT];
            sq_ldv<TKT, CPT>((const TKT *) (kt + (size_t) si1[j] * a.KT_nb1) + s0, v);
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    const float qv = sq[h * r + j];
#pragma unroll
                    for (int c = 0; c < CPT; ++c) {
                        acc[h][c] = fmaf(qv, v[c], acc[h][c]);
                    }
                }
            }
        }
    }
    const char * m = sparq_mask_row(a, R);
    float mv[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        mv[c] = in ? sparq_mask_val(a, m, s0 + c) : -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        if (h >= g) {
            break; // uniform over the block
        }
        float x[CPT];
        float lm = -INFINITY;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            x[c] = in ? acc[h][c] + mv[c] : -INFINITY;
            lm = fmaxf(lm, x[c]);
        }
        if (in) {
            float * dst = a.logits + ((size_t) u * g + h) * a.S + s0;
#pragma unroll
            for (int c = 0; c < CPT; ++c) {
                dst[c] = x[c];
            }
        }
        const float bm = sparq_block_max(lm, red);
        float ls = 0.0f;
        if (bm != -INFINITY) {
#pragma unroll
            for (int c = 0; c < CPT; ++c) {
                ls += x[c] == -INFINITY ? 0.0f : __expf(x[c] - bm);
            }
        }
        const float bz = sparq_block_sum(ls, red);
        if (tid == 0) {
            a.tstat[((size_t) u * a.nt_a + blockIdx.x) * g + h] = make_float2(bm, bm == -INFINITY ? 0.0f : bz);
        }
    }
}

// ---------------------------------------------------------------------------
// 4 group keys (g > 1, one choice per KV head): sum_h softmax_h(x_h)
// ---------------------------------------------------------------------------

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_group_keys(const sparq_cu_args a) {
    __shared__ float sM[GGML_CUDA_SPARQ_G_MAX], siZ[GGML_CUDA_SPARQ_G_MAX];
    const int u = blockIdx.y, tid = threadIdx.x;
    const int R = u / a.n_hkv;
    if (a.rows[R].mode != 0) {
        return;
    }
    if (tid < a.g) {
        float M;
        double Z;
        sparq_unit_stats(a, u, tid, &M, &Z);
        sM[tid] = M;
        siZ[tid] = Z > 0.0 ? (float) (1.0 / Z) : 0.0f;
    }
    __syncthreads();
    const char * m = sparq_mask_row(a, R);
    const float * lg = a.logits + (size_t) u * a.g * a.S;
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        if (s >= a.S) {
            break;
        }
        float key = -INFINITY; // masked cells are never chosen
        if (sparq_valid(a, m, s)) {
            key = 0.0f;
            for (int h = 0; h < a.g; ++h) {
                if (sM[h] != -INFINITY) {
                    key += siZ[h] * __expf(lg[(size_t) h * a.S + s] - sM[h]);
                }
            }
        }
        a.keys[(size_t) u * a.S + s] = key;
    }
}
