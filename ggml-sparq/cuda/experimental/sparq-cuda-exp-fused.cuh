// llama-sparq, experimental build only (SPARQ_CUDA_EXPERIMENTAL): GGML_OP_SPARQ_ATTN in one launch
// for short contexts (LLAMA_SPARQ_CUDA_FUSED=1; sparq-cuda.cu lists the kernels): k_sparq_fused runs
// the three kernels' device code in one grid, the score tiles' grid. Every block
// scores its tile and keeps its candidates (the score tiles' histogram); the last block of a unit to
// finish (a ticket) then chooses each of the unit's lists from those candidates and attends for the
// unit, one block, as the SparQ paper's appendix F suggests. At 4K cells on an H200 the three
// launches took 69 us per layer, most of it launch gaps and dependent round trips, against flash
// attention's 20 us.
#pragma once

#include "sparq-cuda-exp-select.cuh"
#include "sparq-cuda-attend.cuh"

// Byte offsets into the kernel's one buffer of shared memory, which its three phases take in turn
// (a barrier between them): the three kernels' arrays side by side exceed the 48 KB of static
// shared memory of a block with GQA (the query rows and the chunk's weights per head).
template <int GMAX>
struct sparq_fused_smem_layout {
    static constexpr int D = GGML_CUDA_SPARQ_D_MAX;
    // the score tile: sq [GMAX * D], si1, aq, chosen_of [D], shist [SPARQ_NB]
    static constexpr size_t SC_SQ = 0, SC_SI1 = SC_SQ + sizeof(float) * GMAX * D, SC_AQ = SC_SI1 + sizeof(int) * D,
                            SC_CH = SC_AQ + sizeof(float) * D, SC_HIST = SC_CH + sizeof(int) * D,
                            SC_END = SC_HIST + sizeof(unsigned int) * SPARQ_NB;
    // the lists' choice: hc [SPARQ_NB] (ci aliases its upper half), rc [256], rm [256], wb [SPARQ_TS / 32]
    static constexpr size_t SE_HC = 0, SE_RC = SE_HC + sizeof(unsigned int) * SPARQ_NB,
                            SE_RM = SE_RC + sizeof(unsigned int) * 256, SE_WB = SE_RM + sizeof(double) * 256,
                            SE_END = SE_WB + sizeof(unsigned int) * (SPARQ_TS / 32);
    // the attention: sq [GMAX * D], sp [GMAX * SPARQ_NT], scell [SPARQ_NT]
    static constexpr size_t AT_SQ = 0, AT_SP = AT_SQ + sizeof(float) * GMAX * D,
                            AT_SC = AT_SP + sizeof(float) * GMAX * SPARQ_NT, AT_END = AT_SC + sizeof(int) * SPARQ_NT;
    static constexpr size_t BYTES = SC_END > SE_END ? (SC_END > AT_END ? SC_END : AT_END) : (SE_END > AT_END ? SE_END : AT_END);
    static_assert(SE_RM % sizeof(double) == 0, "sparq: the doubles' alignment");
};

// GQA's shared choice of unit u (one list, li = u) by the unit's last block: the select kernel's
// tiles one after another over the unit's at most SPARQ_FUSED_MAX_KV / SPARQ_TS tiles (the group
// keys, the sum over the g heads of each softmax, from the logits and the score tiles' statistics;
// the window's cells; the histogram and the tile's candidates, added into the list's), then the
// list's choice as the select's last tile makes it (each unit owns its row's copy)
static __device__ void sparq_fused_shared_choice(const sparq_exp_args & a, int u, const sparq_sel_smem & sm, float * sM,
                                                 float * siZ, int * s_nc) {
    sparq_sel_ctx c = sparq_sel_ctx_of(a, u, sm.sh, sm.s_int);
    c.row_owner = true;
    if (c.mode != 0) {
        sparq_tile_dense_row(a, c, 0);
        return;
    }
    sparq_tile_group_stats(a, c, sM, siZ);
    const float * src = sparq_list_logits(a, u);
    unsigned int * hg = a.hist + (size_t) u * SPARQ_NB;
    for (int t0 = 0; t0 < a.n_kv; t0 += SPARQ_TS) {
        const int t1 = min(a.n_kv, t0 + SPARQ_TS);
        sparq_tile_clear_shared<false>(sm);
        __syncthreads();
        if (a.win && a.l > 0) {
            sparq_tile_window(a, c, sm, t0, t1);
        }
        float xs[SPARQ_TS_CPT];
        sparq_tile_load(src, t0, t1, xs);
        sparq_tile_group_keys(a, c, src, sM, siZ, t0, t1, xs);
        sparq_tile_histogram<false>(a, c, sm, t0, t1, xs);
        sparq_tile_candidates(a, c, sm, t0, t1, xs);
        for (int b = threadIdx.x; b < SPARQ_NB; b += SPARQ_NT) {
            if (sm.hc[b]) {
                atomicAdd(&hg[b], sm.hc[b]);
            }
        }
        __syncthreads();
    }
    // (the list's histogram, candidates and keys, written here, visible to the choice's loads)
    __threadfence();
    __syncthreads();
    sparq_select_list(a, c, sm, s_nc, sparq_forced_src<sparq_tiles_src>(sparq_tiles_src{}, a.force_radix));
}

// Per (score tile, unit), as k_sparq_score_hist<..., false>: the tile's logits, statistics and
// candidates. Then a ticket per unit: the unit's last block to finish (every tile's writes visible
// after the fences) chooses each of its lists as k_sparq_select_scored<false> does one (the window,
// the crossing from the candidates' histogram, one pass, the crossing bin ranked) and attends for
// the unit as k_sparq_attend does (the mean-V mix, the report). GQA's shared choice: the score tiles
// keep no candidates (its key is the group's sum of softmaxes) and the last block runs the select's
// tiles over the unit's cells itself (sparq_fused_shared_choice).
//
// The ticket needs memory that is zero when the launch starts, and the pool's is garbage, with no
// earlier launch of the op's to clear it. So the counters are a persistent buffer of the layer
// (sparq_cu_args::tickets, allocated and zeroed once by the llama glue; its address a node parameter
// that never changes, as the report's is, so a captured CUDA graph replays it), and every launch
// leaves them zero again: atomicInc with the wrap gridDim.x - 1 returns the unit's counter to 0 at
// its last block, so each launch, replayed or not, finds them zero. No allocation, memset or host
// synchronisation in a step.
//
// No unit waits for another: each unit's last block writes its own row description and window
// bitmap (rows [U], wbits [U][W]; the args' pointers shifted so that the device code's row R is the
// unit's copy, and every unit's score tiles clear theirs), where the three launches share one per
// row between the row's units.
// SHARED: GQA's shared choice (its own instantiation, so that the lists of one head keep their
// registers).
template <int GMAX, typename TKT, int CPT, typename TK, typename TV, bool SHARED>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_fused(const sparq_exp_args a) {
    using LY = sparq_fused_smem_layout<GMAX>;
    __shared__ double raw[(LY::BYTES + sizeof(double) - 1) / sizeof(double)];
    __shared__ int sh[SPARQ_NW];
    __shared__ float red[SPARQ_NW];
    __shared__ double shd[SPARQ_NW];
    __shared__ sparq_cross s_cross;
    __shared__ float hm[1];
    __shared__ int s_int[4];
    __shared__ int s_nc;
    __shared__ int s_last;
    __shared__ float sMw[1];
    __shared__ double siZw[1];
    __shared__ float sM_g[SHARED ? GGML_CUDA_SPARQ_G_MAX : 1], siZ_g[SHARED ? GGML_CUDA_SPARQ_G_MAX : 1];
    __shared__ float sM[GMAX], sP[GMAX], scorr[GMAX], sMs[GMAX];
    __shared__ double sZ[GMAX], smass[GMAX];
    unsigned char * rb = (unsigned char *) raw;

    const int u = blockIdx.y, R = u / a.n_head_kv;
    sparq_exp_args au = a;
    au.rows += u - R;
    au.wbits += (size_t) (u - R) * a.W;
    if (a.win && u != R * a.n_head_kv) { // (the score block clears the row's first unit's)
        const int w0 = blockIdx.x * (a.tl_a / 32), w1 = min(a.W, w0 + a.tl_a / 32);
        for (int w = w0 + (int) threadIdx.x; w < w1; w += SPARQ_NT) {
            au.wbits[(size_t) R * a.W + w] = 0u;
        }
    }

    // the score tile, and with lists of one head their candidates (a shared choice's key is the group's)
    float * sq = (float *) (rb + LY::SC_SQ);
    sparq_score_block<GMAX, TKT, CPT>(au, sq, (int *) (rb + LY::SC_SI1), (float *) (rb + LY::SC_AQ), (int *) (rb + LY::SC_CH),
                                      sh, red, [&](int h, int s0, bool in, const float (&x)[CPT], float bm) {
                                          if constexpr (!SHARED) {
                                              sparq_score_keep<CPT, false>(au, h, s0, in, x, bm, sq,
                                                                           (unsigned int *) (rb + LY::SC_HIST), sh, shd,
                                                                           &s_cross);
                                          }
                                      });
    // the tile's writes, then the ticket (release); the ticket's taker fences before the barrier
    // (acquire), so that every thread's loads after it see every tile's writes (no stale L1 line of
    // another unit's last block on this SM)
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicInc(a.tickets + u, gridDim.x - 1) == gridDim.x - 1;
        __threadfence();
    }
    __syncthreads();
    if (!s_last) {
        return;
    }
    __threadfence();

    unsigned int * hc = (unsigned int *) (rb + LY::SE_HC);
    const sparq_sel_smem ss = { hc, hm, (int *) hc + SPARQ_CAND_MAX, (unsigned int *) (rb + LY::SE_RC),
                                (double *) (rb + LY::SE_RM), (unsigned int *) (rb + LY::SE_WB), sh, shd, s_int,
                                &s_cross, sMw, siZw };
    if constexpr (SHARED) {
        sparq_fused_shared_choice(au, u, ss, sM_g, siZ_g, &s_nc);
    } else {
        for (int h = 0; h < a.ph; ++h) {
            sparq_select_scored<false>(au, ss, &s_nc, u * a.ph + h);
            __syncthreads();
        }
    }
    // (the bitmap's atomics and the row's description visible to the attention's loads)
    __threadfence();
    __syncthreads();

    const sparq_attend_smem sm = { (float *) (rb + LY::AT_SQ), (float *) (rb + LY::AT_SP), (int *) (rb + LY::AT_SC),
                                   sM, sP, scorr, sMs, sZ, smass, sh };
    sparq_attend_query(au, u, sm);
    sparq_attend_block<GMAX, TV>(au, u, sm, [&](const sparq_attend_unit & un, int p, int n_part, float (&y)[GMAX]) {
        return sparq_attend_items<GMAX, TK, TV>(au, un, sm, p, n_part, y);
    });
}
