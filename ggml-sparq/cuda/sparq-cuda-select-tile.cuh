// llama-sparq: the second kernel of GGML_OP_SPARQ_ATTN, k_sparq_select (sparq-cuda.cu lists the
// kernels): per (selection tile, list) the keys and a histogram of their top bits, a fixed k's
// candidates, then the last tile of the list hands over to the list's choice
// (sparq-cuda-select-list.cuh).
#pragma once

#include "sparq-cuda-select-list.cuh"

// whether cell s of the tile [t0, t1) (its key x) may be chosen by score: sparq_sel_eligible, with
// the given window's bits of the tile from shared memory (wb)
static __device__ __forceinline__ bool sparq_tile_eligible(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                           const unsigned int * wb, int t0, int t1, int s, float x) {
    return s < t1 && s < c.w0 && x > -INFINITY && !(a.win && ((wb[(s - t0) >> 5] >> (s & 31)) & 1u));
}

// the tile's keys, or with GQA summed the first head's logits (the logits hold the mask): every
// load issued before any is used, SPARQ_TS_CPT in flight per thread
static __device__ __forceinline__ void sparq_tile_load(const float * src, int t0, int t1, float * xs) {
#pragma unroll
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = t0 + i * SPARQ_NT + threadIdx.x;
        xs[i] = s < t1 ? src[s] : -INFINITY;
    }
}

// a dense row: nothing to choose; the row's description, by the first block (tile 0) of the list
// that owns the row
static __device__ __forceinline__ void sparq_tile_dense_row(const sparq_cu_args & a, const sparq_sel_ctx & c, int tile) {
    if (threadIdx.x == 0 && tile == 0 && c.row_owner) {
        sparq_cu_row ri;
        ri.n_valid = c.n_valid;
        ri.w0 = a.n_kv;
        ri.n_win = 0;
        ri.mode = c.mode;
        a.rows[c.R] = ri;
    }
}

// the tile's histograms and window bits cleared (no barrier: the list's context's scans follow)
template <bool COV>
static __device__ __forceinline__ void sparq_tile_clear_shared(const sparq_sel_smem & sm) {
    const int tid = threadIdx.x;
    for (int b = tid; b < SPARQ_NB; b += SPARQ_NT) {
        sm.hc[b] = 0u;
        if (COV) {
            sm.hm[b] = 0.0f;
        }
    }
    if (tid < SPARQ_TS / 32) {
        sm.wb[tid] = 0u;
    }
}

// with a shared choice the group's softmax statistics (maximum, 1 / sum) into sM, siZ
static __device__ __forceinline__ void sparq_tile_group_stats(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                              float * sM, float * siZ) {
    const int tid = threadIdx.x;
    if (c.summed && tid < a.g) {
        float M;
        double Z;
        sparq_unit_stats(a, c.u, tid, &M, &Z);
        sM[tid] = M;
        siZ[tid] = Z > 0.0 ? (float) (1.0 / Z) : 0.0f;
    }
    __syncthreads();
}

// the window list's valid cells in the tile [t0, t1), each once, into the tile's bits and the row's bitmap
static __device__ __forceinline__ void sparq_tile_window(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                         const sparq_sel_smem & sm, int t0, int t1) {
    const int st = c.R / a.n_rows, row = c.R % a.n_rows;
    const char * m = sparq_mask_row(a, c.R);
    const int32_t * src = (const int32_t *) (a.win + (size_t) row * a.win_nb1 + (size_t) st * a.win_nb2);
    for (int i = threadIdx.x; i < min(a.l, a.win_n); i += SPARQ_NT) {
        const int s = src[i];
        if (s >= t0 && s < t1 && sparq_valid(a, m, s)) {
            atomicOr(&sm.wb[(s - t0) >> 5], 1u << (s & 31));
            atomicOr(&a.wbits[(size_t) c.R * a.W + (s >> 5)], 1u << (s & 31));
        }
    }
    __syncthreads();
}

// a shared choice's group keys (sum_h of the heads' softmaxes, from the first head's logits lg on)
// into the unit's keys and xs
static __device__ __forceinline__ void sparq_tile_group_keys(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                             const float * lg, const float * sM, const float * siZ,
                                                             int t0, int t1, float * xs) {
#pragma unroll
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = t0 + i * SPARQ_NT + threadIdx.x;
        if (s < t1) {
            float x = -INFINITY;
            if (xs[i] > -INFINITY) { // a valid cell (the logits hold the mask)
                x = 0.0f;
                for (int hh = 0; hh < a.g; ++hh) {
                    if (sM[hh] != -INFINITY) {
                        x += siZ[hh] * __expf(lg[(size_t) hh * a.n_kv + s] - sM[hh]);
                    }
                }
            }
            a.keys[(size_t) c.u * a.n_kv + s] = x;
            xs[i] = x;
        }
    }
}

// a cell's count into a tile's histogram, by every thread of the warp (el: the cell is eligible,
// bin its key's bin): one shared-memory add per distinct bin of the warp (the top bits of nearby
// keys agree often)
struct sparq_tile_vote {
    __device__ void operator()(const sparq_sel_smem & sm, bool el, unsigned int bin) const {
        const unsigned int peers = __match_any_sync(0xffffffff, bin);
        if (el && (int) (threadIdx.x % 32) == __ffs(peers) - 1) {
            atomicAdd(&sm.hc[bin], (unsigned int) __popc(peers));
        }
    }
};

// the eligible cells counted (count, by every thread) and, for the calibrated k, weighed by their
// key's top SPARQ_NB_BITS bits
template <bool COV, typename F = sparq_tile_vote>
static __device__ __forceinline__ void sparq_tile_histogram(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                            const sparq_sel_smem & sm, int t0, int t1, const float * xs,
                                                            F count = {}) {
#pragma unroll
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = t0 + i * SPARQ_NT + threadIdx.x;
        const float x = xs[i];
        const bool el = sparq_tile_eligible(a, c, sm.wb, t0, t1, s, x);
        const unsigned int bin = el ? sparq_key_bits(x) >> SPARQ_NB_SHIFT : 0xffffffffu;
        count(sm, el, bin);
        if (COV && el) {
            atomicAdd(&sm.hm[bin], (float) sparq_key_mass(a, c, x));
        }
    }
    __syncthreads();
}

// A fixed k: the tile's cells that can be among the list's best, those in the bins from the tile's
// own crossing of the row's k up (below it, this tile alone holds k better ones), into the list's
// candidates, so that the last block reads these instead of the list's every cell
static __device__ __forceinline__ void sparq_tile_candidates(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                             const sparq_sel_smem & sm, int t0, int t1, const float * xs) {
    const unsigned int * hc = sm.hc;
    const sparq_cross lx = sparq_find_cross<SPARQ_NB / SPARQ_NT>(false, (double) c.rk, [&](int bin) { return (int) hc[bin]; },
                                                                 [&](int) { return 0.0; }, sm.sh, sm.shd, sm.s_cross);
    const unsigned int lb = lx.bin < 0 ? 0u : (unsigned int) lx.bin;
    const unsigned int cap = (unsigned int) (a.nt_s * SPARQ_TILE_CAND);
    uint2 * cd = a.cand + (size_t) c.li * cap;
    // the tile's candidates counted first and their room in the list's buffer taken with one atomic
    // per block (an atomic per warp and cell chunk, each waited for, cost the tile blocks more than
    // their histogram), then each thread's written from its offset
    unsigned int put = 0u;
#pragma unroll
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = t0 + i * SPARQ_NT + threadIdx.x;
        const float x = xs[i];
        if (sparq_tile_eligible(a, c, sm.wb, t0, t1, s, x) && (sparq_key_bits(x) >> SPARQ_NB_SHIFT) >= lb) {
            put |= 1u << i;
        }
    }
    int n_tile;
    const int before = sparq_block_scan(__popc(put), &n_tile, sm.sh) - __popc(put);
    if (threadIdx.x == 0) {
        sm.s_int[0] = n_tile > 0 ? (int) atomicAdd(&a.ncand[c.li], (unsigned int) n_tile) : 0;
    }
    __syncthreads();
    unsigned int pos = (unsigned int) (sm.s_int[0] + before);
#pragma unroll
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        if ((put >> i) & 1u) {
            if (pos < cap) {
                uint2 e;
                e.x = sparq_key_bits(xs[i]);
                e.y = (unsigned int) (t0 + i * SPARQ_NT + threadIdx.x);
                cd[pos] = e;
            }
            ++pos;
        }
    }
}

// The bucketed top-k: each eligible cell of the tile offered to its bucket of list li's
// (sparq_bucket_offer, sparq-cuda-topk.cuh)
static __device__ __forceinline__ void sparq_tile_buckets(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                          const sparq_sel_smem & sm, int t0, int t1, const float * xs) {
    unsigned long long * bk = a.bk + (size_t) c.li * a.buckets;
#pragma unroll
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = t0 + i * SPARQ_NT + threadIdx.x;
        if (sparq_tile_eligible(a, c, sm.wb, t0, t1, s, xs[i])) {
            sparq_bucket_offer(bk, a.buckets, s, xs[i]);
        }
    }
}

// the tile's histograms added into the list's; true in the last tile of the list to finish (its
// writes, and every other tile's, visible first)
template <bool COV>
static __device__ __forceinline__ bool sparq_tile_flush(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                        const sparq_sel_smem & sm, int * s_last) {
    unsigned int * hg = a.hist + (size_t) c.li * SPARQ_NB;
    for (int b = threadIdx.x; b < SPARQ_NB; b += SPARQ_NT) {
        if (sm.hc[b]) {
            atomicAdd(&hg[b], sm.hc[b]);
            if (COV) {
                atomicAdd(&a.hmass[(size_t) c.li * SPARQ_NB + b], (double) sm.hm[b]);
            }
        }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *s_last = atomicAdd(&a.ldone[c.li], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!*s_last) {
        return false;
    }
    __threadfence();
    return true;
}

// The context of tile [t0, t1) of list blockIdx.y before its keys: the list's (c), and for a SparQ
// row a shared choice's group statistics and the given window's cells of the tile. False for a dense
// row, whose description the list's first tile writes: nothing to choose.
static __device__ __forceinline__ bool sparq_tile_context(const sparq_cu_args & a, const sparq_sel_smem & sm, float * sM,
                                                          float * siZ, int t0, int t1, sparq_sel_ctx & c) {
    c = sparq_sel_ctx_of(a, blockIdx.y, sm.sh, sm.s_int);
    if (c.mode != 0) {
        sparq_tile_dense_row(a, c, blockIdx.x);
        return false;
    }
    sparq_tile_group_stats(a, c, sM, siZ);
    if (a.win && a.l > 0) {
        sparq_tile_window(a, c, sm, t0, t1);
    }
    return true;
}

// A tile once its keys xs are loaded (src: the list's logits): a shared choice's group keys; the
// bucketed top-k's offers, or the histogram (count: sparq_tile_histogram's) and a fixed k's
// candidates; the tile's histogram added into the list's; the list's last tile then chooses from
// lsrc's histogram and candidates (sparq_select_list)
template <bool COV, typename F, typename SRC>
static __device__ __forceinline__ void sparq_tile_finish(const sparq_cu_args & a, const sparq_sel_ctx & c,
                                                         const sparq_sel_smem & sm, const float * sM, const float * siZ,
                                                         int t0, int t1, const float * src, float * xs, F count,
                                                         const SRC & lsrc, int * s_last, int * s_nc) {
    if (c.summed) {
        sparq_tile_group_keys(a, c, src, sM, siZ, t0, t1, xs);
    }
    if (!COV && a.buckets > 0) {
        sparq_tile_buckets(a, c, sm, t0, t1, xs); // (no histogram: the offers are all the choice reads)
    } else {
        sparq_tile_histogram<COV>(a, c, sm, t0, t1, xs, count);
        if (!COV) {
            sparq_tile_candidates(a, c, sm, t0, t1, xs);
        }
    }
    if (sparq_tile_flush<COV>(a, c, sm, s_last)) {
        sparq_select_list<!COV>(a, c, sm, s_nc, lsrc);
    }
}

// the select kernels' shared memory (TILE_MASS: the tiles' masses, WIN_MASS: the window's heads'
// statistics, both for the calibrated k) and sm, its view
#define SPARQ_SELECT_SMEM(TILE_MASS, WIN_MASS)                                                                  \
    __shared__ unsigned int hc[SPARQ_NB];                                                                      \
    __shared__ float hm[TILE_MASS ? SPARQ_NB : 1];                                                             \
    __shared__ unsigned int rc[256];                                                                           \
    __shared__ double rm[256];                                                                                 \
    __shared__ unsigned int wb[SPARQ_TS / 32];                                                                 \
    __shared__ int sh[SPARQ_NW];                                                                               \
    __shared__ double shd[SPARQ_NW];                                                                           \
    __shared__ int s_int[4];                                                                                   \
    __shared__ int s_nc;                                                                                       \
    __shared__ sparq_cross s_cross;                                                                            \
    __shared__ float sMw[WIN_MASS ? GGML_CUDA_SPARQ_G_MAX : 1];                                                \
    __shared__ double siZw[WIN_MASS ? GGML_CUDA_SPARQ_G_MAX : 1];                                              \
    const sparq_sel_smem sm = { hc, hm, (int *) hc + SPARQ_CAND_MAX, rc, rm, wb, sh, shd, s_int, &s_cross, sMw, siZw }

// the select tiles' own: the group's softmax statistics (a shared choice), the last tile's flag
#define SPARQ_SELECT_TILE_SMEM                                                                                 \
    __shared__ float sM[GGML_CUDA_SPARQ_G_MAX], siZ[GGML_CUDA_SPARQ_G_MAX];                                     \
    __shared__ int s_last

// The select tiles' blocks per SM that ptxas budgets registers for: two with the calibrated k, three
// with a fixed k (about 100 and 80 registers). Left to itself, its choice moves with any edit of
// these kernels, between fewer blocks and spills.
#define SPARQ_SELECT_BLOCKS(COV) ((COV) ? 2 : 3)

// a select block's start: its shared histograms cleared, then, as a programmatic dependent launch,
// its wait for the score kernel before any scratch is read (every block, on every path); the attend
// blocks may be placed from then on (they wait for this kernel's end in turn)
template <bool COV>
static __device__ __forceinline__ void sparq_select_begin(const sparq_sel_smem & sm) {
    sparq_tile_clear_shared<COV>(sm);
    ggml_cuda_pdl_sync();
    ggml_cuda_pdl_lc();
}

// Per (selection tile of SPARQ_TS cells, list): the group keys of a shared choice into keys; the
// given window's cells of the tile into the row's window bitmap; the eligible cells counted (and,
// for the calibrated k, weighed) by their key's top SPARQ_NB_BITS bits into the list's histograms.
// The last tile of a list to finish (a counter; the scratch was cleared by the score kernel) then
// chooses the list's cells (sparq_select_list). A dense row only has its description written.
// SPARQ_SELECT_BLOCKS: its register budget.
template <bool COV>
static __global__ void __launch_bounds__(SPARQ_NT, SPARQ_SELECT_BLOCKS(COV)) k_sparq_select(const sparq_cu_args a) {
    SPARQ_SELECT_SMEM(COV, COV);
    SPARQ_SELECT_TILE_SMEM;
    const int t0 = blockIdx.x * SPARQ_TS, t1 = min(a.n_kv, t0 + SPARQ_TS);
    sparq_select_begin<COV>(sm);
    sparq_sel_ctx c;
    if (!sparq_tile_context(a, sm, sM, siZ, t0, t1, c)) {
        return;
    }
    const float * src = sparq_list_logits(a, blockIdx.y);
    float xs[SPARQ_TS_CPT];
    sparq_tile_load(src, t0, t1, xs);
    sparq_tile_finish<COV>(a, c, sm, sM, siZ, t0, t1, src, xs, sparq_tile_vote{}, sparq_tiles_src{}, &s_last, &s_nc);
}
