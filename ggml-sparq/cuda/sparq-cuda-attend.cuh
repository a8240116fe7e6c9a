// llama-sparq: the CUDA kernels of stage 7, shared by every selector (sparq-cuda.cu lists the
// stages): exact attention over the unit's chosen cells (or a dense row's valid cells) and the
// mean-V mix. Either one block per unit (k_sparq_attend), or, when there are few units for the
// GPU (decode at batch 1), each unit's cells split over several blocks whose partial softmax
// sums the last of them to finish combines (k_sparq_attend_part, flash-decoding).
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
    bool sparse;        // the bitmap's cells; else every valid cell (the dense modes, a diffuse unit)
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
    float * smv;        // [SPARQ_NT] the streamed chunk's mask values (stream_dense)
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
    // a SparQ row's unit attends over its chosen cells, unless the calibrated k found it diffuse
    un.sparse = un.ri.mode == 0 && !a.udense[u];
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
                        sm.sp[h * SPARQ_NT + it[x]] = e * a.scale + mval;
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

// the mean of V over the stream's cells, component threadIdx.x (0 past dv)
template <typename TV>
static __device__ __forceinline__ float sparq_attend_vbar(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm) {
    const int tid = threadIdx.x, row = un.row;
    float vs = 0.0f;
    float cnt = fabsf(a.v_count[un.st]);
    if (tid < un.dv) {
        vs = ((const float *) (a.v_sum + (size_t) un.kvh * a.vs_nb1 + (size_t) un.st * a.vs_nb2))[tid];
    }
    if (un.mean_v && un.m && row + 1 < a.n_rows) {
        // several rows (all-rows evaluation): the sums hold the whole ubatch, so leave out the
        // cells this row may not see that the stream's last row sees
        const char * ml = sparq_mask_row(a, un.R + (a.n_rows - 1 - row));
        for (int c0 = 0; c0 < a.n_kv; c0 += SPARQ_NT) {
            const int c = c0 + tid;
            sm.scell[tid] = c < a.n_kv && sparq_valid(a, ml, c) && !sparq_valid(a, un.m, c) ? c : -1;
            __syncthreads();
            for (int ii = 0; ii < SPARQ_NT; ++ii) {
                const int cc = sm.scell[ii];
                if (cc >= 0) {
                    if (tid < un.dv) {
                        vs -= sq_ld<TV>((const TV *) (un.Vb + (size_t) cc * a.V_nb1) + tid);
                    }
                    cnt -= 1.0f;
                }
            }
            __syncthreads();
        }
    }
    return cnt > 0.0f ? vs / cnt : 0.0f;
}

// head h's alpha: the approximate softmax mass of the attended cells (1 where not measured)
static __device__ __forceinline__ float sparq_attend_alpha(const sparq_attend_unit & un, const sparq_attend_smem & sm,
                                                           int h) {
    return un.measure && sm.sZ[h] > 0.0 ? (float) fmin(1.0, sm.smass[h] / sm.sZ[h]) : 1.0f;
}

// The unit's report entry (sparq_cu_args::report) by thread 0, for the stream's last row, as the
// CPU op writes it: the cells attended (n_sel, the bitmap's; a diffuse unit every valid cell; -1 in
// the dense modes), the mean alpha over the group's heads, and the lists' cut (their mean, plus the
// window) and whether each reached the target within the cap.
static __device__ __forceinline__ void sparq_attend_report(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm, int n_sel) {
    if (!a.report || threadIdx.x != 0 || un.row != a.n_rows - 1) {
        return;
    }
    float * rp = a.report + ((size_t) un.st * a.n_head_kv + un.kvh) * 4;
    double alpha = 0.0;
    for (int h = 0; h < un.g; ++h) {
        alpha += (double) sparq_attend_alpha(un, sm, h);
    }
    int reach = -1, reached = 0;
    if (un.ri.mode == 0 && a.cov_p > 0.0f && a.lrep) {
        long sum = 0;
        reached = 1;
        for (int h = 0; h < a.ph && reach != -2; ++h) {
            const int * lr = a.lrep + 2 * ((size_t) un.u * a.ph + h);
            if (lr[0] < 0) {
                reach = -2; // a list not measured: the unit neither
            } else {
                sum += lr[0];
                reached &= lr[1];
            }
        }
        if (reach == -2) {
            reach = -1;
            reached = 0;
        } else {
            reach = un.ri.n_win + (int) ((sum + a.ph / 2) / a.ph);
        }
    }
    rp[0] = un.ri.mode != 0 ? -1.0f : un.sparse ? (float) n_sel : (float) un.ri.n_valid;
    rp[1] = (float) (alpha / un.g);
    rp[2] = (float) reach;
    rp[3] = (float) reached;
}

// the g output rows, component threadIdx.x: the attention, mixed with the mean of V by alpha
template <int GMAX>
static __device__ __forceinline__ void sparq_attend_write(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, const float (&y)[GMAX],
                                                          float vbar) {
    const int tid = threadIdx.x, g = un.g;
    if (tid < un.dv) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
                const float iP = sm.sP[h] > 0.0f ? 1.0f / sm.sP[h] : 0.0f;
                float o;
                if (un.ri.mode == 2) {
                    o = y[h] * iP;
                } else {
                    const float alpha = un.mean_v ? sparq_attend_alpha(un, sm, h) : 1.0f;
                    o = alpha * iP * y[h] + (1.0f - alpha) * vbar;
                }
                float * dst = (float *) (a.out + (size_t) (un.kvh * g + h) * a.o_nb1 + (size_t) un.row * a.o_nb2 +
                                         (size_t) un.st * a.o_nb3);
                dst[tid] = o;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// the all-cells units streamed (stream_dense): a dense row's or a diffuse unit's part is a
// contiguous range of cells, all valid ones attended, so there is no list to build and the K and
// V rows of a chunk are read 16 bytes per load with many rows in flight per warp (the per-cell
// path moved 2 bytes per load, its values 8 positions per thread and round trip)
// ---------------------------------------------------------------------------

// a streamed chunk [c0, min(c0 + SPARQ_NT, hi)): its cells (-1: masked or past hi) and mask values
// into scell and smv; false (uniform over the block) when it holds no valid cell (a short sequence
// in a long cache). The scan's barriers publish both
static __device__ __forceinline__ bool sparq_stream_chunk(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, int c0, int hi) {
    const int c = c0 + (int) threadIdx.x;
    const float mv = c < hi ? sparq_mask_val(a, un.m, c) : -INFINITY;
    const bool ok = c < hi && mv != -INFINITY;
    sm.scell[threadIdx.x] = ok ? c : -1;
    sm.smv[threadIdx.x] = mv;
    int n_ok;
    sparq_block_scan(ok ? 1 : 0, &n_ok, sm.sh);
    return n_ok != 0;
}

// the chunk's exact logits into sp: a row of K by T lanes (the smallest power of two that covers
// its d / VE vectors, at most 32), 32 / T rows per warp at once, UL such rows per lane group loaded
// before any is used; the lanes' partial dot products added by shuffles within the group
template <int GMAX, typename TK, int VE>
static __device__ __forceinline__ void sparq_stream_logits(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm, int n_c) {
    constexpr int UL = GMAX <= 2 ? 4 : GMAX <= 8 ? 2 : 1;
    const int d = un.d, g = un.g, nv = d / VE;
    int T = 1;
    while (T < nv && T < 32) {
        T <<= 1;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int sub = lane / T, sl = lane % T, rows_w = 32 / T, per_round = SPARQ_NW * rows_w;
    for (int i0 = 0; i0 < n_c; i0 += per_round * UL) {
        int it[UL], c[UL];
#pragma unroll
        for (int x = 0; x < UL; ++x) {
            it[x] = i0 + x * per_round + warp * rows_w + sub;
            c[x] = it[x] < SPARQ_NT ? sm.scell[it[x]] : -1;
        }
        float part[UL][GMAX];
#pragma unroll
        for (int x = 0; x < UL; ++x) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                part[x][h] = 0.0f;
            }
        }
        // (rows past the chunk's n_c items are -1, and sp is read only up to n_c; the loop ends there)
        for (int m = sl; m < nv; m += T) {
            float kv[UL][VE];
#pragma unroll
            for (int x = 0; x < UL; ++x) {
                if (c[x] >= 0) {
                    sq_ldv<TK, VE>((const TK *) (un.Kb + (size_t) c[x] * a.K_nb1) + m * VE, kv[x]);
                } else {
#pragma unroll
                    for (int e = 0; e < VE; ++e) {
                        kv[x][e] = 0.0f;
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
#pragma unroll
                    for (int e = 0; e < VE; ++e) {
                        const float qv = sm.sq[h * d + m * VE + e];
#pragma unroll
                        for (int x = 0; x < UL; ++x) {
                            part[x][h] = fmaf(qv, kv[x][e], part[x][h]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int x = 0; x < UL; ++x) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    if (T == 32) {
                        part[x][h] = warp_reduce_sum(part[x][h]);
                    } else {
                        for (int o = T / 2; o >= 1; o >>= 1) {
                            part[x][h] += __shfl_xor_sync(0xffffffff, part[x][h], o);
                        }
                    }
                    if (sl == 0 && it[x] < SPARQ_NT) {
                        sm.sp[h * SPARQ_NT + it[x]] = c[x] >= 0 ? part[x][h] * a.scale + sm.smv[it[x]] : -INFINITY;
                    }
                }
            }
        }
    }
}

// the chunk's weighted values: a row of V by dv / VV threads (VV consecutive components each),
// SPARQ_NT / (dv / VV) groups taking the chunk's positions in turn, UL positions' loads in flight;
// yv[h][e] the group's sum for component (threadIdx.x % (dv / VV)) * VV + e
template <int GMAX, typename TV, int VV>
static __device__ __forceinline__ void sparq_stream_values(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm, int n_c,
                                                           float (&yv)[GMAX][VV]) {
    constexpr int UL = VV >= 8 ? 4 : 8;
    const int g = un.g, tv = un.dv / VV, n_grp = SPARQ_NT / tv, grp = threadIdx.x / tv, j = threadIdx.x % tv;
    if (grp >= n_grp) {
        return;
    }
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        if (h < g) {
#pragma unroll
            for (int e = 0; e < VV; ++e) {
                yv[h][e] *= sm.scorr[h];
            }
        }
    }
    for (int i0 = grp; i0 < n_c; i0 += UL * n_grp) {
        float v[UL][VV];
        int c[UL];
#pragma unroll
        for (int b = 0; b < UL; ++b) {
            const int ii = i0 + b * n_grp;
            c[b] = ii < n_c ? sm.scell[ii] : -1;
            if (c[b] >= 0) {
                sq_ldv<TV, VV>((const TV *) (un.Vb + (size_t) c[b] * a.V_nb1) + j * VV, v[b]);
            } else {
#pragma unroll
                for (int e = 0; e < VV; ++e) {
                    v[b][e] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int b = 0; b < UL; ++b) {
            if (c[b] < 0) {
                continue;
            }
            const int ii = i0 + b * n_grp;
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    const float w = sm.sp[h * SPARQ_NT + ii];
#pragma unroll
                    for (int e = 0; e < VV; ++e) {
                        yv[h][e] = fmaf(w, v[b][e], yv[h][e]);
                    }
                }
            }
        }
    }
}

// the groups' sums of sparq_stream_values added into y of the threads < dv (component threadIdx.x)
// in one pass through sp (the streamed kernels' sp holds GMAX * VV <= 16 rows of SPARQ_NT)
template <int GMAX, int VV>
static __device__ __forceinline__ void sparq_stream_gather(const sparq_attend_unit & un, const sparq_attend_smem & sm,
                                                           const float (&yv)[GMAX][VV], float (&y)[GMAX]) {
    const int tid = threadIdx.x, g = un.g, tv = un.dv / VV, n_grp = SPARQ_NT / tv;
    __syncthreads();
    if (tid < n_grp * tv) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
#pragma unroll
                for (int e = 0; e < VV; ++e) {
                    sm.sp[(h * VV + e) * SPARQ_NT + tid] = yv[h][e];
                }
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        y[h] = 0.0f;
    }
    if (tid < un.dv) {
        const int j = tid / VV, e = tid % VV;
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
                float s = 0.0f;
                for (int p = 0; p < n_grp; ++p) {
                    s += sm.sp[(h * VV + e) * SPARQ_NT + p * tv + j];
                }
                y[h] = s;
            }
        }
    }
    __syncthreads();
}

// the valid cells of [lo, hi) streamed: per chunk the logits, the online softmax and the values;
// then y as sparq_attend_items leaves it (VE: K's elements per load, 1 where rows are not aligned)
template <int GMAX, typename TK, typename TV, int VE>
static __device__ __forceinline__ void sparq_stream_range(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, int lo, int hi,
                                                          float (&y)[GMAX]) {
    // V's width: at most VE (1: rows not aligned), a 16-byte load, and 16 accumulators per thread
    constexpr int VT = (int) (16 / sizeof(TV));
    constexpr int VV0 = VE < VT ? VE : VT;
    constexpr int VV = VV0 < 16 / GMAX ? VV0 : (16 / GMAX);
    float yv[GMAX][VV];
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
#pragma unroll
        for (int e = 0; e < VV; ++e) {
            yv[h][e] = 0.0f;
        }
    }
    for (int c0 = lo; c0 < hi; c0 += SPARQ_NT) {
        if (!sparq_stream_chunk(a, un, sm, c0, hi)) {
            continue; // uniform over the block
        }
        const int n_c = min(SPARQ_NT, hi - c0);
        sparq_stream_logits<GMAX, TK, VE>(a, un, sm, n_c);
        __syncthreads();
        sparq_attend_softmax(a, un, sm, n_c);
        __syncthreads();
        sparq_stream_values<GMAX, TV, VV>(a, un, sm, n_c, yv);
        __syncthreads();
    }
    sparq_stream_gather<GMAX, VV>(un, sm, yv, y);
}

// part p of n_part of the unit's items (sparq_attend_cells), per chunk of SPARQ_NT of them the
// exact logits, the online softmax and the weighted values into y (the barriers between the steps
// are here); then the groups' sums gathered into the threads < dv. Returns the unit's items (all
// parts'; a dense row's: its cells)
template <int GMAX, typename TK, typename TV, bool STREAM>
static __device__ __forceinline__ int sparq_attend_items(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_attend_smem & sm, int p, int n_part,
                                                          float (&y)[GMAX]) {
    sparq_attend_init(a, un, sm);
    if constexpr (STREAM) {
        if (!un.sparse) {
            // part p's share of the cells, contiguous; every valid one attended
            const int per = (a.n_kv + n_part - 1) / n_part;
            const int c_lo = min(a.n_kv, p * per), c_hi = min(a.n_kv, c_lo + per);
            if (a.kv_vec) {
                sparq_stream_range<GMAX, TK, TV, (int) (16 / sizeof(TK))>(a, un, sm, c_lo, c_hi, y);
            } else {
                sparq_stream_range<GMAX, TK, TV, 1>(a, un, sm, c_lo, c_hi, y);
            }
            return a.n_kv;
        }
    }
    int lo, n_items;
    int n_all;
    // a list's chosen cells over at most parts_k parts (a launch sized for streamed units has more)
    sparq_attend_cells(a, un, sm, p, STREAM ? min(n_part, a.parts_k) : n_part, &lo, &n_items, &n_all);
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

// the shared memory of the attend kernels, declared in the kernel (GMAX: its bound on g)
#define SPARQ_ATTEND_SMEM                                                                     \
    __shared__ float sq[GMAX * GGML_CUDA_SPARQ_D_MAX]; /* the g query rows */                \
    __shared__ float sp[(STREAM ? 16 : GMAX) * SPARQ_NT]; /* logits, then weights, of a chunk */ \
    __shared__ int scell[SPARQ_NT];                    /* the chunk's cells (-1: none) */     \
    __shared__ float smv[STREAM ? SPARQ_NT : 1];       /* a streamed chunk's mask values */   \
    __shared__ float sM[GMAX], sP[GMAX], scorr[GMAX], sMs[GMAX];                             \
    __shared__ double sZ[GMAX], smass[GMAX];                                                 \
    __shared__ int sh[SPARQ_NW];                                                             \
    const sparq_attend_smem sm = { sq, sp, scell, smv, sM, sP, scorr, sMs, sZ, smass, sh }

// A programmatic dependent launch's wait for the select (every block, on every path, before any
// scratch is read: the rows, bitmaps and logits); what follows the op may be placed from then on
// (it waits for this kernel's end in turn)
static __device__ __forceinline__ void sparq_attend_wait() {
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();
}

// unit u by one block (its query rows in sm.sq already): all its items, then the output rows and
// the report (k_sparq_attend's body; k_sparq_fused's last block of the unit)
template <int GMAX, typename TK, typename TV, bool STREAM>
static __device__ __forceinline__ void sparq_attend_block(const sparq_cu_args & a, int u, const sparq_attend_smem & sm) {
    const sparq_attend_unit un = sparq_attend_unit_of(a, u);
    float y[GMAX];
    const int n_sel = sparq_attend_items<GMAX, TK, TV, STREAM>(a, un, sm, 0, 1, y);
    const float vbar = sparq_attend_vbar<TV>(a, un, sm);
    sparq_attend_write<GMAX>(a, un, sm, y, vbar);
    sparq_attend_report(a, un, sm, n_sel);
}

// a block per unit: all its items, then the output rows
template <int GMAX, typename TK, typename TV, bool STREAM>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend(const sparq_cu_args a) {
    SPARQ_ATTEND_SMEM;
    sparq_attend_query(a, blockIdx.x, sm);
    sparq_attend_wait();
    sparq_attend_block<GMAX, TK, TV, STREAM>(a, blockIdx.x, sm);
}

// the n_part parts' sums of unit un rescaled to the largest maximum and added (the online softmax
// across blocks), then the output rows as k_sparq_attend writes them
template <int GMAX, typename TV>
static __device__ void sparq_attend_combine(const sparq_cu_args & a, const sparq_attend_unit & un,
                                            const sparq_attend_smem & sm, int n_part, int n_sel) {
    const int tid = threadIdx.x, g = un.g;
    const size_t base = (size_t) un.u * n_part * g;
    if (tid < g) {
        // the loops over the parts unrolled: their loads in flight together, not a round trip each
        float M = -INFINITY;
#pragma unroll 8
        for (int p = 0; p < n_part; ++p) {
            M = fmaxf(M, __ldcg(a.pstat + (base + (size_t) p * g + tid) * 3));
        }
        float P = 0.0f;
        double mass = 0.0;
#pragma unroll 8
        for (int p = 0; p < n_part; ++p) {
            const float * st = a.pstat + (base + (size_t) p * g + tid) * 3;
            const float Mp = __ldcg(st);
            if (Mp != -INFINITY) {
                P += __ldcg(st + 1) * __expf(Mp - M);
            }
            mass += (double) __ldcg(st + 2);
        }
        sm.sM[tid] = M;
        sm.sP[tid] = P;
        sm.smass[tid] = mass;
        sparq_attend_mean_v_stats(a, un, sm, tid);
    }
    __syncthreads();
    float y[GMAX];
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        y[h] = 0.0f;
    }
    if (tid < un.dv) {
#pragma unroll 8
        for (int p = 0; p < n_part; ++p) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    const float Mp = __ldcg(a.pstat + (base + (size_t) p * g + h) * 3);
                    if (Mp != -INFINITY) {
                        y[h] = fmaf(__ldcg(a.py + (base + (size_t) p * g + h) * un.dv + tid), __expf(Mp - sm.sM[h]), y[h]);
                    }
                }
            }
        }
    }
    const float vbar = sparq_attend_vbar<TV>(a, un, sm);
    sparq_attend_write<GMAX>(a, un, sm, y, vbar);
    sparq_attend_report(a, un, sm, n_sel);
}

// part blockIdx.x of unit blockIdx.y (gridDim.x parts): its items' softmax maximum, sum and
// approximate mass per head into pstat[u][p][h][3] and its unnormalised values into py[u][p][h][dv];
// the last part of the unit to finish (a counter the score kernel cleared) combines them
template <int GMAX, typename TK, typename TV, bool STREAM>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend_part(const sparq_cu_args a) {
    SPARQ_ATTEND_SMEM;
    __shared__ int s_last;
    const int p = blockIdx.x, n_part = gridDim.x;
    sparq_attend_query(a, blockIdx.y, sm);
    sparq_attend_wait();
    const sparq_attend_unit un = sparq_attend_unit_of(a, blockIdx.y);
    float y[GMAX];
    const int n_sel = sparq_attend_items<GMAX, TK, TV, STREAM>(a, un, sm, p, n_part, y);
    const size_t base = ((size_t) un.u * n_part + p) * un.g;
    const int tid = threadIdx.x;
    if (tid < un.dv) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < un.g) {
                a.py[(base + h) * un.dv + tid] = y[h];
            }
        }
    }
    if (tid < un.g) {
        float * st = a.pstat + (base + tid) * 3;
        st[0] = sm.sM[tid];
        st[1] = sm.sP[tid];
        st[2] = (float) sm.smass[tid];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        s_last = atomicAdd(&a.udone[un.u], 1u) == (unsigned int) n_part - 1;
    }
    __syncthreads();
    if (!s_last) {
        return;
    }
    __threadfence();
    sparq_attend_combine<GMAX, TV>(a, un, sm, n_part, n_sel);
}
