// llama-sparq: stage 7 (sparq-cuda.cu lists the stages), shared by every selector: a unit's exact
// attention over its items, the bitmap's chosen cells as an ascending list (or a dense row's valid
// cells), split into parts: per chunk of SPARQ_NT items the exact logits of the g query heads, the
// online softmax and the weighted values. The kernels, the mean-V mix and the output are
// sparq-cuda-attend.cuh's.
#pragma once

#include "sparq-cuda-common.cuh"

// ---------------------------------------------------------------------------
// 7 attend: exact attention over the chosen cells, mean-V mix (every selector)
// ---------------------------------------------------------------------------

// k_sparq_attend's fixed state for one unit (registers once the helpers below inline)
struct sparq_attend_unit {
    int u, R, kvh, st, row;
    int g, d, dv;
    sparq_cu_row ri;
    bool sparse;        // the bitmap's cells; else every valid cell (the dense modes)
    bool mean_v;        // the mean-V mix applies
    bool measure;       // the approximate mass of the cells is summed (the mix, or the report's coverage)
    const char * m;     // the row's mask (NULL: none)
    int * list;         // the unit's cells, ascending (SparQ rows)
    const char * Kb;    // the unit's K and V
    const char * Vb;
    const float * lg;   // the unit's approximate logits
};

// k_sparq_attend's shared memory (GMAX: the kernel's bound on g)
struct sparq_attend_smem {
    float * sq;         // [GMAX][d] the g query rows
    float * sp;         // [GMAX][SPARQ_NT] logits, then weights, of a chunk
    int * scell;        // [SPARQ_NT] the chunk's cells (-1: none)
    float * sM;         // [GMAX] the running softmax maximum
    float * sP;         // [GMAX] the running softmax sum
    float * scorr;      // [GMAX] the chunk's rescale of the running sums
    float * sMs;        // [GMAX] the approximate logits' maximum (mean-V)
    double * sZ;        // [GMAX] the approximate softmax sum over all cells (mean-V)
    double * smass;     // [GMAX] the approximate softmax mass of the attended cells (mean-V)
    int * sh;           // [SPARQ_NW] scan scratch
};

static __device__ __forceinline__ sparq_attend_unit sparq_attend_unit_of(const sparq_cu_args & a, int u) {
    sparq_attend_unit un;
    un.u = u;
    un.R = u / a.n_head_kv;
    un.kvh = u % a.n_head_kv;
    un.st = un.R / a.n_rows;
    un.row = un.R % a.n_rows;
    un.g = a.g;
    un.d = a.d;
    un.dv = a.dv;
    un.ri = a.rows[un.R];
    // a SparQ row's unit attends over its chosen cells
    un.sparse = un.ri.mode == 0;
    un.mean_v = un.sparse && !a.no_mean_v;
    un.measure = un.sparse && (!a.no_mean_v || a.report);
    un.m = sparq_mask_row(a, un.R);
    un.list = a.sel + (size_t) u * a.sel_max;
    un.Kb = a.K + (size_t) un.kvh * a.K_nb2 + (size_t) un.st * a.K_nb3;
    un.Vb = a.V + (size_t) un.kvh * a.V_nb2 + (size_t) un.st * a.V_nb3;
    un.lg = a.logits + (size_t) u * a.g * a.n_kv;
    return un;
}

// head h's softmax maximum and sum of the approximate logits over all the unit's cells (the
// mean-V mix's denominator; -inf and 0 where the mass is not measured)
static __device__ __forceinline__ void sparq_attend_mean_v_stats(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                                 const sparq_attend_smem & sm, int h) {
    sm.sMs[h] = -INFINITY;
    sm.sZ[h] = 0.0;
    if (un.measure) {
        float M;
        double Z;
        sparq_unit_stats(a, un.u, h, &M, &Z);
        sm.sMs[h] = M;
        sm.sZ[h] = Z;
    }
}

// unit u's g query rows into shared memory (published by the barriers before the first chunk's
// logits). Only the op's input: a programmatic dependent launch reads them before its wait
static __device__ __forceinline__ void sparq_attend_query(const sparq_cu_args & a, int u, const sparq_attend_smem & sm) {
    const int R = u / a.n_head_kv, kvh = u % a.n_head_kv, st = R / a.n_rows, row = R % a.n_rows;
    const int g = a.g, d = a.d;
    for (int i = threadIdx.x; i < g * d; i += SPARQ_NT) {
        const int h = i / d, j = i % d;
        sm.sq[h * d + j] = ((const float *) (a.q + (size_t) row * a.q_nb1 + (size_t) (kvh * g + h) * a.q_nb2 +
                                             (size_t) st * a.q_nb3))[j];
    }
}

// the running and approximate softmax statistics
static __device__ __forceinline__ void sparq_attend_init(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                         const sparq_attend_smem & sm) {
    const int tid = threadIdx.x, g = un.g;
    if (tid < g) {
        sm.sM[tid] = -INFINITY;
        sm.sP[tid] = 0.0f;
        sm.smass[tid] = 0.0;
        sparq_attend_mean_v_stats(a, un, sm, tid);
    }
}

// The cells of part p of n_part of the unit: its share [*lo, *hi) of the items, which are the
// bitmap's cells as an ascending list (the unit's chosen cells, counted first so that the parts get
// equal shares of what was chosen, not of the bound; only the share's list positions are written)
// or every cell, masked (the dense modes). The same on every thread. Each thread takes a contiguous
// run of the bitmap's words: counted, one block scan for every run's first list position, then its
// cells written (a scan per 256 words, as before, cost the last parts of a 64K context eight).
static __device__ __forceinline__ void sparq_attend_cells(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, int p, int n_part, int * lo,
                                                          int * hi, int * n_all) {
    const int tid = threadIdx.x;
    const unsigned int * sb = a.selbits + (size_t) un.u * a.W;
    const int per_t = (a.W + SPARQ_NT - 1) / SPARQ_NT;
    const int w_lo = min(a.W, tid * per_t), w_hi = min(a.W, w_lo + per_t);
    int n = a.n_kv, cnt = 0, pos = 0;
    if (un.sparse) {
#pragma unroll 8
        for (int wi = w_lo; wi < w_hi; ++wi) {
            cnt += __popc(sb[wi]);
        }
        pos = sparq_block_scan(cnt, &n, sm.sh) - cnt;
        n = min(n, a.sel_max);
    }
    *n_all = n;
    const int per = (n + n_part - 1) / n_part;
    *lo = min(n, p * per);
    *hi = min(n, *lo + per);
    if (!un.sparse) {
        return;
    }
    if (cnt > 0 && pos < *hi && pos + cnt > *lo) {
        for (int wi = w_lo; wi < w_hi && pos < *hi; ++wi) {
            unsigned int word = sb[wi];
            while (word) {
                const int b = __ffs(word) - 1;
                if (pos >= *lo && pos < *hi) {
                    un.list[pos] = wi * 32 + b;
                }
                ++pos;
                word &= word - 1u;
            }
        }
    }
    __syncthreads();
}

// the chunk's cells from item c0 into scell (published by the barrier); false (uniform over the
// block) when a dense row's chunk has no valid cell
static __device__ __forceinline__ bool sparq_attend_chunk(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, int c0, int n_items) {
    const int tid = threadIdx.x;
    const int t = c0 + tid;
    int cell = -1;
    if (t < n_items) {
        cell = un.sparse ? un.list[t] : (sparq_valid(a, un.m, t) ? t : -1);
    }
    sm.scell[tid] = cell;
    if (!un.sparse) {
        // dense rows walk every cell: skip the chunks without a valid one (a short sequence
        // in a long cache); the scan's barriers also publish scell
        int n_valid_chunk;
        sparq_block_scan(cell >= 0 ? 1 : 0, &n_valid_chunk, sm.sh);
        return n_valid_chunk != 0;
    }
    __syncthreads();
    return true;
}

// cells whose K rows a warp reads at once in sparq_attend_logits (loads in flight per warp)
#define SPARQ_ATTEND_CU (GMAX <= 4 ? 4 : GMAX <= 8 ? 2 : 1)

// exact logits of the chunk into sp: a warp per cell, lanes over the head size, all g heads per K
// row; the chunk's positions dealt round-robin to the warps (a short list keeps every warp busy),
// SPARQ_ATTEND_CU cells per warp at a time (their loads overlap)
template <int GMAX, typename TK>
static __device__ __forceinline__ void sparq_attend_logits(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm) {
    constexpr int CU = SPARQ_ATTEND_CU;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = un.g, d = un.d;
    for (int i0 = 0; i0 < 32; i0 += CU) {
        int it[CU], c[CU];
        bool any = false;
#pragma unroll
        for (int x = 0; x < CU; ++x) {
            it[x] = (i0 + x) * SPARQ_NW + warp;
            c[x] = sm.scell[it[x]];
            any |= c[x] >= 0;
            if (c[x] < 0 && lane < g) {
                sm.sp[lane * SPARQ_NT + it[x]] = -INFINITY;
            }
        }
        if (!any) {
            continue; // uniform over the warp
        }
        float part[CU][GMAX];
#pragma unroll
        for (int x = 0; x < CU; ++x) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                part[x][h] = 0.0f;
            }
        }
        // JN components of each of the CU rows loaded before any is used: one memory round trip
        // per CU cells up to d = 128, where a load per component waited for each (four at 128)
        constexpr int JN = 4;
        for (int j0 = 0; j0 < d; j0 += 32 * JN) {
            float kv[JN][CU];
#pragma unroll
            for (int jj = 0; jj < JN; ++jj) {
                const int j = j0 + lane + 32 * jj;
#pragma unroll
                for (int x = 0; x < CU; ++x) {
                    kv[jj][x] = c[x] >= 0 && j < d ? sq_ld<TK>((const TK *) (un.Kb + (size_t) c[x] * a.K_nb1) + j) : 0.0f;
                }
            }
#pragma unroll
            for (int jj = 0; jj < JN; ++jj) {
                const int j = j0 + lane + 32 * jj;
                if (j >= d) {
                    break; // uniform over the warp
                }
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    if (h < g) {
                        const float qv = sm.sq[h * d + j];
#pragma unroll
                        for (int x = 0; x < CU; ++x) {
                            part[x][h] = fmaf(qv, kv[jj][x], part[x][h]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int x = 0; x < CU; ++x) {
            if (c[x] < 0) {
                continue; // uniform over the warp
            }
            const float mval = sparq_mask_val(a, un.m, c[x]);
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    const float e = warp_reduce_sum(part[x][h]);
                    if (lane == 0) {
                        sm.sp[h * SPARQ_NT + it[x]] =
                            sparq_variant_logit(a, e * a.scale, sparq_alibi_slope(a, un.kvh * g + h), mval,
                                                sparq_bias_term(a, un.R, un.kvh * g + h, c[x]));
                    }
                }
            }
        }
    }
}

// online softmax per head over the chunk's first n positions (a warp per head): sp's logits become
// weights; the running maximum and sum, the rescale of the earlier chunks and the approximate mass
// advance
static __device__ __forceinline__ void sparq_attend_softmax(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                            const sparq_attend_smem & sm, int n = SPARQ_NT) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int h = warp; h < un.g; h += SPARQ_NW) {
        float cm = -INFINITY;
        for (int ii = lane; ii < n; ii += 32) {
            cm = fmaxf(cm, sm.sp[h * SPARQ_NT + ii]);
        }
        cm = warp_reduce_max(cm);
        const float Mold = sm.sM[h];
        const float Mnew = fmaxf(Mold, cm);
        const float corr = Mnew == -INFINITY ? 1.0f : __expf(Mold - Mnew);
        float ps = 0.0f, ms = 0.0f;
        for (int ii = lane; ii < n; ii += 32) {
            const float e = sm.sp[h * SPARQ_NT + ii];
            const float p = e == -INFINITY ? 0.0f : __expf(e - Mnew);
            sm.sp[h * SPARQ_NT + ii] = p;
            ps += p;
            const int c = sm.scell[ii];
            if (un.measure && c >= 0) {
                ms += __expf(un.lg[(size_t) h * a.n_kv + c] - sm.sMs[h]);
            }
        }
        ps = warp_reduce_sum(ps);
        ms = warp_reduce_sum(ms);
        if (lane == 0) {
            sm.sM[h] = Mnew;
            sm.sP[h] = sm.sP[h] * corr + ps;
            sm.scorr[h] = corr;
            sm.smass[h] += (double) ms;
        }
    }
}

// the chunk's weighted values into y: a thread per component, in SPARQ_NT / dv groups that take
// the chunk's positions in turn (their partial sums are added by sparq_attend_gather)
template <int GMAX, typename TV>
static __device__ __forceinline__ void sparq_attend_values(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm, int c0, int n_items,
                                                           float (&y)[GMAX]) {
    const int g = un.g, n_grp = SPARQ_NT / un.dv, grp = threadIdx.x / un.dv, tid = threadIdx.x % un.dv;
    if (grp < n_grp) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
                y[h] *= sm.scorr[h];
            }
        }
        const int n_c = min(SPARQ_NT, n_items - c0);
        // VB positions' V loads in flight before any is used (a cell without a value has weight 0)
        constexpr int VB = 8;
        for (int i0 = grp; i0 < n_c; i0 += VB * n_grp) {
            float v[VB];
#pragma unroll
            for (int b = 0; b < VB; ++b) {
                const int ii = i0 + b * n_grp;
                const int c = ii < n_c ? sm.scell[ii] : -1;
                v[b] = c >= 0 ? sq_ld<TV>((const TV *) (un.Vb + (size_t) c * a.V_nb1) + tid) : 0.0f;
            }
#pragma unroll
            for (int b = 0; b < VB; ++b) {
                const int ii = i0 + b * n_grp;
                if (ii >= n_c || sm.scell[ii] < 0) {
                    continue;
                }
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    if (h < g) {
                        y[h] = fmaf(sm.sp[h * SPARQ_NT + ii], v[b], y[h]);
                    }
                }
            }
        }
    }
}

// the groups' partial sums of sparq_attend_values added into the first group's y (threads < dv);
// sp is free once the chunks are done
template <int GMAX>
static __device__ __forceinline__ void sparq_attend_gather(const sparq_attend_unit & un, const sparq_attend_smem & sm,
                                                           float (&y)[GMAX]) {
    const int n_grp = SPARQ_NT / un.dv;
    if (n_grp < 2) {
        return;
    }
    const int tid = threadIdx.x, g = un.g;
    __syncthreads();
    if (tid < n_grp * un.dv) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
                sm.sp[h * SPARQ_NT + tid] = y[h];
            }
        }
    }
    __syncthreads();
    if (tid < un.dv) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
                float s = 0.0f;
                for (int p = 0; p < n_grp; ++p) {
                    s += sm.sp[h * SPARQ_NT + p * un.dv + tid];
                }
                y[h] = s;
            }
        }
    }
    __syncthreads();
}

// part p of n_part of the unit's items (sparq_attend_cells; a part past n_part has none), per chunk
// of SPARQ_NT of them the exact logits, the online softmax and the weighted values into y (the
// barriers between the steps are here); then the groups' sums gathered into the threads < dv.
// Returns the unit's items (all parts'; a dense row's: its cells)
template <int GMAX, typename TK, typename TV>
static __device__ __forceinline__ int sparq_attend_items(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, int p, int n_part,
                                                          float (&y)[GMAX]) {
    sparq_attend_init(a, un, sm);
    int lo, n_items;
    int n_all;
    sparq_attend_cells(a, un, sm, p, n_part, &lo, &n_items, &n_all);
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        y[h] = 0.0f;
    }
    for (int c0 = lo; c0 < n_items; c0 += SPARQ_NT) {
        if (!sparq_attend_chunk(a, un, sm, c0, n_items)) {
            continue; // uniform over the block
        }
        sparq_attend_logits<GMAX, TK>(a, un, sm);
        __syncthreads();
        sparq_attend_softmax(a, un, sm);
        __syncthreads();
        sparq_attend_values<GMAX, TV>(a, un, sm, c0, n_items, y);
        __syncthreads();
    }
    sparq_attend_gather<GMAX>(un, sm, y);
    return n_all;
}
