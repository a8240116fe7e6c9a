// llama-sparq: the CUDA kernels of stage 7, shared by every selector (sparq-cuda.cu lists the
// stages): exact attention over the unit's chosen cells (or a dense row's valid cells,
// sparq-cuda-attend-items.cuh) and the mean-V mix. Either one block per unit (k_sparq_attend), or,
// when there are few units for the GPU (decode at batch 1), each unit's cells split over several
// blocks whose partial softmax sums the last of them to finish combines (k_sparq_attend_part,
// flash-decoding).
#pragma once

#include "sparq-cuda-attend-items.cuh"

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

// head h's alpha: the approximate softmax mass of the attended cells and of the head's sink, always
// attended (1 where not measured)
static __device__ __forceinline__ float sparq_attend_alpha(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm, int h) {
    if (!un.measure || sm.sZ[h] <= 0.0) {
        return 1.0f;
    }
    const double sink = a.sinks ? exp((double) a.sinks[un.kvh * un.g + h] - (double) sm.sMs[h]) : 0.0;
    return (float) fmin(1.0, (sm.smass[h] + sink) / sm.sZ[h]);
}

// The unit's report entry (sparq_cu_args::report) by thread 0, for the stream's last row, as the
// CPU op writes it: the cells attended (n_sel, the bitmap's; -1 in the dense modes), the mean alpha
// over the group's heads, and the lists' cut (their mean, plus the window) and whether each reached
// the target within the cap.
static __device__ __forceinline__ void sparq_attend_report(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                           const sparq_attend_smem & sm, int n_sel) {
    if (!a.report || threadIdx.x != 0 || un.row != a.n_rows - 1) {
        return;
    }
    float * rp = a.report + ((size_t) un.st * a.n_head_kv + un.kvh) * 4;
    double alpha = 0.0;
    for (int h = 0; h < un.g; ++h) {
        alpha += (double) sparq_attend_alpha(a, un, sm, h);
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
    rp[0] = un.sparse ? (float) n_sel : -1.0f;
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
                // the head's sink joins the sum (its value row is zero: y only rescaled)
                float f = 1.0f, P = sm.sP[h];
                const float sk = sparq_sink(a, un.kvh * g + h);
                if (sk != -INFINITY) {
                    const float M = fmaxf(sm.sM[h], sk);
                    f = sm.sM[h] == -INFINITY ? 0.0f : expf(sm.sM[h] - M);
                    P = P * f + expf(sk - M);
                }
                const float iP = P > 0.0f ? f / P : 0.0f;
                float o;
                if (un.ri.mode == 2) {
                    o = y[h] * iP;
                } else {
                    const float alpha = un.mean_v ? sparq_attend_alpha(a, un, sm, h) : 1.0f;
                    o = alpha * iP * y[h] + (1.0f - alpha) * vbar;
                }
                float * dst = (float *) (a.out + (size_t) (un.kvh * g + h) * a.o_nb1 + (size_t) un.row * a.o_nb2 +
                                         (size_t) un.st * a.o_nb3);
                dst[tid] = o;
            }
        }
    }
}

// the shared memory of the attend kernels, declared in the kernel (GMAX: its bound on g; SP_ROWS:
// sp's rows of SPARQ_NT, at least GMAX)
#define SPARQ_ATTEND_SMEM(SP_ROWS)                                                            \
    __shared__ float sq[GMAX * GGML_CUDA_SPARQ_D_MAX]; /* the g query rows */                \
    __shared__ float sp[(SP_ROWS) * SPARQ_NT];         /* logits, then weights, of a chunk */ \
    __shared__ int scell[SPARQ_NT];                    /* the chunk's cells (-1: none) */     \
    __shared__ float sM[GMAX], sP[GMAX], scorr[GMAX], sMs[GMAX];                             \
    __shared__ double sZ[GMAX], smass[GMAX];                                                 \
    __shared__ int sh[SPARQ_NW];                                                             \
    const sparq_attend_smem sm = { sq, sp, scell, sM, sP, scorr, sMs, sZ, smass, sh }

// A programmatic dependent launch's wait for the select (every block, on every path, before any
// scratch is read: the rows, bitmaps and logits); what follows the op may be placed from then on
// (it waits for this kernel's end in turn)
static __device__ __forceinline__ void sparq_attend_wait() {
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();
}

// a unit's output rows from its attention y over n_sel items (one block's), and the report
template <int GMAX, typename TV>
static __device__ __forceinline__ void sparq_attend_out(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                        const sparq_attend_smem & sm, const float (&y)[GMAX], int n_sel) {
    const float vbar = sparq_attend_vbar<TV>(a, un, sm);
    sparq_attend_write<GMAX>(a, un, sm, y, vbar);
    sparq_attend_report(a, un, sm, n_sel);
}

// unit u by one block (its query rows in sm.sq already): items(un, p, n_part, y), as
// sparq_attend_items, attends over all its items (part 0 of 1), then the output rows and the report
template <int GMAX, typename TV, typename F>
static __device__ __forceinline__ void sparq_attend_block(const sparq_cu_args & a, int u, const sparq_attend_smem & sm,
                                                          F items) {
    const sparq_attend_unit un = sparq_attend_unit_of(a, u);
    float y[GMAX];
    const int n_sel = items(un, 0, 1, y);
    sparq_attend_out<GMAX, TV>(a, un, sm, y, n_sel);
}

// a block per unit: all its items, then the output rows
template <int GMAX, typename TK, typename TV>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend(const sparq_cu_args a) {
    SPARQ_ATTEND_SMEM(GMAX);
    sparq_attend_query(a, blockIdx.x, sm);
    sparq_attend_wait();
    sparq_attend_block<GMAX, TV>(a, blockIdx.x, sm, [&](const sparq_attend_unit & un, int p, int n_part, float (&y)[GMAX]) {
        return sparq_attend_items<GMAX, TK, TV>(a, un, sm, p, n_part, y);
    });
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
    sparq_attend_out<GMAX, TV>(a, un, sm, y, n_sel);
}

// part p of n_part of unit un done (y, its items' values; n_sel: the unit's items): its softmax
// maximum, sum and approximate mass per head into pstat[u][p][h][3] and its unnormalised values into
// py[u][p][h][dv]; the last part of the unit to finish (a counter the score kernel cleared) combines
// them
template <int GMAX, typename TV>
static __device__ __forceinline__ void sparq_attend_part_done(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                              const sparq_attend_smem & sm, int p, int n_part,
                                                              const float (&y)[GMAX], int n_sel, int * s_last) {
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
        *s_last = atomicAdd(&a.udone[un.u], 1u) == (unsigned int) n_part - 1;
    }
    __syncthreads();
    if (!*s_last) {
        return;
    }
    __threadfence();
    sparq_attend_combine<GMAX, TV>(a, un, sm, n_part, n_sel);
}

// part blockIdx.x of unit blockIdx.y (gridDim.x parts; its query rows in sm.sq already): items(un, p,
// n_part, y) attends over its share, then sparq_attend_part_done
template <int GMAX, typename TV, typename F>
static __device__ __forceinline__ void sparq_attend_part_block(const sparq_cu_args & a, const sparq_attend_smem & sm,
                                                               int * s_last, F items) {
    const int p = blockIdx.x, n_part = gridDim.x;
    const sparq_attend_unit un = sparq_attend_unit_of(a, blockIdx.y);
    float y[GMAX];
    const int n_sel = items(un, p, n_part, y);
    sparq_attend_part_done<GMAX, TV>(a, un, sm, p, n_part, y, n_sel, s_last);
}

// part blockIdx.x of unit blockIdx.y: its items, the last part to finish combining
template <int GMAX, typename TK, typename TV>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend_part(const sparq_cu_args a) {
    SPARQ_ATTEND_SMEM(GMAX);
    __shared__ int s_last;
    sparq_attend_query(a, blockIdx.y, sm);
    sparq_attend_wait();
    sparq_attend_part_block<GMAX, TV>(a, sm, &s_last, [&](const sparq_attend_unit & un, int p, int n_part, float (&y)[GMAX]) {
        return sparq_attend_items<GMAX, TK, TV>(a, un, sm, p, n_part, y);
    });
}
