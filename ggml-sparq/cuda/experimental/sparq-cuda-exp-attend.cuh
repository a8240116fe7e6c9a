// llama-sparq, experimental build only (SPARQ_CUDA_EXPERIMENTAL): the attend's all-cells units
// streamed (LLAMA_SPARQ_CUDA_DIFFUSE=1). A dense row's part is a contiguous range
// of cells, all valid ones attended, so there is no list to build and the K and V rows of a chunk
// are read 16 bytes per load (sparq_exp_args::kv_vec) with many rows in flight per warp (the per-cell
// path, sparq-cuda-attend-items.cuh, moves 2 bytes per load, its values 8 positions per thread and
// round trip). A list's chosen cells take the per-cell path over at most parts_k of the launch's
// parts (sized from S where units may be all-cells), the other parts record an empty partial.
#pragma once

#include "sparq-cuda-attend.cuh"
#include "sparq-cuda-exp-args.cuh"

// the streamed kernels' shared memory: the attend's (sp with 16 rows: GMAX * VV <= 16) and a chunk's
// mask values
struct sparq_stream_smem : sparq_attend_smem {
    float * smv; // [SPARQ_NT]
};

// a streamed chunk [c0, min(c0 + SPARQ_NT, hi)): its cells (-1: masked or past hi) and mask values
// into scell and smv; false (uniform over the block) when it holds no valid cell (a short sequence
// in a long cache). The scan's barriers publish both
static __device__ __forceinline__ bool sparq_stream_chunk(const sparq_cu_args & a, const sparq_attend_unit & un,
                                                          const sparq_stream_smem & sm, int c0, int hi) {
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
                                                           const sparq_stream_smem & sm, int n_c) {
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
                        sm.sp[h * SPARQ_NT + it[x]] =
                            c[x] >= 0 ? sparq_variant_logit(a, part[x][h] * a.scale, sparq_alibi_slope(a, un.kvh * g + h),
                                                            sm.smv[it[x]], sparq_bias_term(a, un.R, un.kvh * g + h, c[x]))
                                      : -INFINITY;
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
                                                           const sparq_stream_smem & sm, int n_c,
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
static __device__ __forceinline__ void sparq_stream_gather(const sparq_attend_unit & un, const sparq_stream_smem & sm,
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
                                                          const sparq_stream_smem & sm, int lo, int hi,
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

// part p of n_part of the unit's items, as sparq_attend_items: an all-cells unit's share of the
// cells streamed, a list's chosen cells over at most parts_k parts
template <int GMAX, typename TK, typename TV>
static __device__ __forceinline__ int sparq_stream_items(const sparq_exp_args & a, const sparq_attend_unit & un,
                                                         const sparq_stream_smem & sm, int p, int n_part,
                                                         float (&y)[GMAX]) {
    if (un.sparse) {
        return sparq_attend_items<GMAX, TK, TV>(a, un, sm, p, min(n_part, a.parts_k), y);
    }
    sparq_attend_init(a, un, sm);
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

// the streamed kernels' shared memory and ss, its view
#define SPARQ_STREAM_SMEM                \
    SPARQ_ATTEND_SMEM(16);               \
    __shared__ float smv[SPARQ_NT];      \
    const sparq_stream_smem ss = { sm, smv }

// k_sparq_attend with the all-cells units streamed
template <int GMAX, typename TK, typename TV>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend_stream(const sparq_exp_args a) {
    SPARQ_STREAM_SMEM;
    sparq_attend_query(a, blockIdx.x, sm);
    sparq_attend_wait();
    sparq_attend_block<GMAX, TV>(a, blockIdx.x, sm, [&](const sparq_attend_unit & un, int p, int n_part, float (&y)[GMAX]) {
        return sparq_stream_items<GMAX, TK, TV>(a, un, ss, p, n_part, y);
    });
}

// k_sparq_attend_part with the all-cells units streamed
template <int GMAX, typename TK, typename TV>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend_stream_part(const sparq_exp_args a) {
    SPARQ_STREAM_SMEM;
    __shared__ int s_last;
    sparq_attend_query(a, blockIdx.y, sm);
    sparq_attend_wait();
    sparq_attend_part_block<GMAX, TV>(a, sm, &s_last, [&](const sparq_attend_unit & un, int p, int n_part, float (&y)[GMAX]) {
        return sparq_stream_items<GMAX, TK, TV>(a, un, ss, p, n_part, y);
    });
}
