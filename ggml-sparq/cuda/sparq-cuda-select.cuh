// llama-sparq: the second kernel of GGML_OP_SPARQ_ATTN (sparq-cuda.cu lists the kernels), what a
// list's choice works with: the list's context (the row's valid cells, mode and tail window, its
// head's softmax statistics), the passes over the list or the tiles' candidates into the unit's
// bitmap, the window's bits, the crossing bin's cells ranked in shared memory and the radix passes
// over the list. The choice itself is sparq-cuda-select-list.cuh's, the kernel and its tiles'
// steps sparq-cuda-select-tile.cuh's.
#pragma once

#include "sparq-cuda-common.cuh"
#include "sparq-cuda-topk.cuh"

// ---------------------------------------------------------------------------
// keys, bins and masses
// ---------------------------------------------------------------------------

// float -> the ordered key bits' inverse (sparq_key_bits)
static __device__ __forceinline__ float sparq_key_float(unsigned int o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// what a list's selection needs of its unit and row, the same in every block of the list
struct sparq_sel_ctx {
    int li, u, h, R;
    bool row_owner;        // this list writes its row's description (the row's first unit's first list)
    int n_valid, rk, mode; // valid cells, the row's k, 0 SparQ / 1 dense / 2 dense stream
    int w0;                // candidates are the cells < w0
    bool summed;           // the key is the group's sum of softmaxes (g > 1, shared choice)
    const float * keys;    // the list's keys (for a summed key, written by the tile blocks)
    float M;               // the list head's softmax maximum (not summed)
    double iZ;             // and 1 / its sum
};

// the estimated attention mass of a cell with key x (the target of the calibrated k): its head's
// softmax, or the group's mean softmax for a summed key
static __device__ __forceinline__ double sparq_key_mass(const sparq_cu_args & a, const sparq_sel_ctx & c, float x) {
    return c.summed ? (double) x / a.g : exp((double) x - (double) c.M) * c.iZ;
}

// whether cell s (its key x) may be chosen by score
static __device__ __forceinline__ bool sparq_sel_eligible(const sparq_cu_args & a, const sparq_sel_ctx & c, int s, float x) {
    return s < c.w0 && x > -INFINITY && !(a.win && sparq_win_bit(a, c.R, s));
}

// cells s0 .. s0 + SPARQ_NT - 1 of a list into the unit's bitmap sb: the window (by the unit's
// first list, h == 0), the keys above pk's bound, and the keys equal to it in cell order while
// fewer than pk.want were taken (eq_seen: those before s0, uniform over the block; advanced here)
static __device__ __forceinline__ void sparq_collect_chunk(const sparq_cu_args & a, const sparq_cu_row & ri, int R, int h,
                                                           const char * m, const float * key, const sparq_cu_pick & pk,
                                                           bool choose, int s0, int & eq_seen, int * sh, unsigned int * sb) {
    const int tid = threadIdx.x, lane = tid % 32;
    const int s = s0 + tid;
    bool take = false, eq = false;
    if (s < a.n_kv) {
        if (h == 0) {
            take = a.win ? sparq_win_bit(a, R, s) : (s >= ri.w0 && sparq_valid(a, m, s));
        }
        const float x = __ldcg(key + s);
        if (choose && s < ri.w0 && x > -INFINITY && !(a.win && sparq_win_bit(a, R, s))) {
            const unsigned int o = sparq_key_bits(x);
            const unsigned int hi = o >> pk.shift;
            const unsigned int bh = pk.prefix >> pk.shift;
            if (hi > bh) {
                take = true;
            } else if (hi == bh) {
                eq = true;
            }
        }
    }
    if (pk.ties) { // uniform over the block
        int tot;
        const int incl = sparq_block_scan(eq ? 1 : 0, &tot, sh);
        if (eq && eq_seen + incl - 1 < pk.want) {
            take = true;
        }
        eq_seen += tot;
    } else if (eq) {
        take = true;
    }
    // the warp's 32 cells are one bitmap word (chunks are multiples of 32)
    const unsigned int bits = __ballot_sync(0xffffffff, take);
    if (lane == 0 && bits) {
        atomicOr(&sb[(s0 + (tid - lane)) >> 5], bits);
    }
}

// ---------------------------------------------------------------------------
// the row: valid cells, mode, tail window
// ---------------------------------------------------------------------------

// The start of the tail window: the earliest of the row's last l valid cells, found from the score
// tiles' counts (tcnt) and one scan of the tile that holds it. n_valid > l.
static __device__ int sparq_tail_w0(const sparq_cu_args & a, int u, const char * m, int * sh, int * s_int) {
    const int tid = threadIdx.x;
    const int * tc = a.tcnt + (size_t) u * a.nt_a;
    if (tid == 0) {
        int t = a.nt_a - 1, after = 0;
        while (t > 0 && after + tc[t] < a.l) {
            after += tc[t];
            --t;
        }
        s_int[0] = t;
        s_int[1] = a.l - after; // the window's cells in tile t and before
        s_int[2] = t * a.tl_a;
    }
    __syncthreads();
    const int t = s_int[0], need = s_int[1];
    const int lo = t * a.tl_a, hi = min(a.n_kv, lo + a.tl_a);
    int found = 0;
    for (int base = 0; base < hi - lo && found < need; base += SPARQ_NT) { // found: uniform over the block
        const int s = hi - 1 - (base + tid);
        const int f = s >= lo && sparq_valid(a, m, s);
        int tot;
        const int incl = sparq_block_scan(f, &tot, sh);
        if (f && found + incl == need) {
            s_int[2] = s;
        }
        found += tot;
    }
    __syncthreads();
    const int w0 = s_int[2];
    __syncthreads();
    return w0;
}

// the list's context: the row's valid cells (the score tiles' counts), mode and tail window, and the
// softmax statistics of the list's head
static __device__ sparq_sel_ctx sparq_sel_ctx_of(const sparq_cu_args & a, int li, int * sh, int * s_int) {
    sparq_sel_ctx c;
    c.li = li;
    c.u = li / a.ph;
    c.h = li % a.ph;
    c.R = c.u / a.n_head_kv;
    c.row_owner = c.u % a.n_head_kv == 0 && c.h == 0;
    c.summed = a.g > 1 && a.ph == 1;
    c.keys = sparq_list_keys(a, li);
    int n = 0;
    for (int t = threadIdx.x; t < a.nt_a; t += SPARQ_NT) {
        n += a.tcnt[(size_t) c.u * a.nt_a + t];
    }
    sparq_block_scan(n, &c.n_valid, sh);
    c.rk = sparq_row_k(a, c.n_valid);
    const int st = c.R / a.n_rows;
    c.mode = a.v_count[st] < 0.0f ? 2 : (c.n_valid <= c.rk ? 1 : 0);
    c.w0 = a.n_kv;
    if (c.mode == 0 && a.l > 0 && !a.win) {
        c.w0 = sparq_tail_w0(a, c.u, sparq_mask_row(a, c.R), sh, s_int);
    }
    c.M = -INFINITY;
    c.iZ = 0.0;
    // only the calibrated k weighs keys by their mass (a loop over the score tiles with a double exp
    // each, in every block of the list: a third of a fixed k's instructions at 64K cells)
    if (c.mode == 0 && !c.summed && a.cov_p > 0.0f) {
        double Z;
        sparq_unit_stats(a, c.u, c.h, &c.M, &Z);
        c.iZ = Z > 0.0 ? 1.0 / Z : 0.0;
    }
    return c;
}

// ---------------------------------------------------------------------------
// the last block's passes over a list
// ---------------------------------------------------------------------------

// shared memory of the select kernel
struct sparq_sel_smem {
    unsigned int * hc;   // [SPARQ_NB] tile counts; then the candidates' key bits [SPARQ_CAND_MAX]
    float * hm;          // [SPARQ_NB] tile masses (the calibrated k)
    int * ci;            // [SPARQ_CAND_MAX] the candidates' cells (aliases hc's upper half)
    unsigned int * rc;   // [256] a radix pass's counts
    double * rm;         // [256] a radix pass's masses
    unsigned int * wb;   // [SPARQ_TS / 32] the tile's window cells
    int * sh;            // [SPARQ_NW]
    double * shd;        // [SPARQ_NW]
    int * s_int;         // [4]
    sparq_cross * s_cross;
    float * sMw;         // [GGML_CUDA_SPARQ_G_MAX] the window's heads' softmax maxima
    double * siZw;       // [GGML_CUDA_SPARQ_G_MAX] and 1 / their sums
};

// cells of list li per pass iteration in sparq_sel_pass (SPARQ_NT at a time, their loads in flight)
#define SPARQ_PASS_UNROLL 8

// One pass over list li's cells in order, SPARQ_NT at a time (a warp's 32 cells are one bitmap
// word): the window (by the unit's first list) and the eligible cells whose key's top bits are
// above bin b (all eligible cells with b < 0, bin b too with take_eq) into the unit's bitmap
// (set_bits); the eligible cells of bin b into the candidates (gather; *s_nc counts them all, the
// first SPARQ_CAND_MAX are kept).
static __device__ void sparq_sel_pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool take_eq, bool set_bits,
                                      bool gather, const sparq_sel_smem & sm, int * s_nc) {
    const int tid = threadIdx.x, lane = tid % 32;
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    for (int base = 0; base < a.n_kv; base += SPARQ_NT * SPARQ_PASS_UNROLL) {
        float x[SPARQ_PASS_UNROLL];
#pragma unroll
        for (int i = 0; i < SPARQ_PASS_UNROLL; ++i) {
            const int s = base + i * SPARQ_NT + tid;
            x[i] = s < a.n_kv ? __ldcg(c.keys + s) : -INFINITY;
        }
#pragma unroll
        for (int i = 0; i < SPARQ_PASS_UNROLL; ++i) {
            const int s0 = base + i * SPARQ_NT;
            if (s0 >= a.n_kv) {
                break; // uniform over the block
            }
            const int s = s0 + tid;
            bool take = false;
            if (s < a.n_kv) {
                if (c.h == 0) {
                    take = a.win ? sparq_win_bit(a, c.R, s) : (s >= c.w0 && x[i] > -INFINITY);
                }
                if (sparq_sel_eligible(a, c, s, x[i])) {
                    const int kb = (int) (sparq_key_bits(x[i]) >> SPARQ_NB_SHIFT);
                    if (b < 0 || kb > b || (take_eq && kb == b)) {
                        take = true;
                    } else if (gather && kb == b) {
                        const int pos = atomicAdd(s_nc, 1);
                        if (pos < SPARQ_CAND_MAX) {
                            sm.hc[pos] = sparq_key_bits(x[i]);
                            sm.ci[pos] = s;
                        }
                    }
                }
            }
            if (set_bits) {
                const unsigned int bits = __ballot_sync(0xffffffff, take);
                if (lane == 0 && bits) {
                    atomicOr(&sb[(s0 + tid - lane) >> 5], bits);
                }
            }
        }
    }
    __syncthreads();
}

// whether candidate i comes before candidate j: the larger key, then the lower cell
static __device__ __forceinline__ bool sparq_cand_before(const sparq_sel_smem & sm, int i, int j) {
    return sm.hc[i] > sm.hc[j] || (sm.hc[i] == sm.hc[j] && sm.ci[i] < sm.ci[j]);
}

// the n gathered candidates in order (best first): a bitonic sort in shared memory, padded to a
// power of two with entries that sort last
static __device__ void sparq_sort_cands(const sparq_sel_smem & sm, int n) {
    const int tid = threadIdx.x;
    int n2 = 1;
    while (n2 < n) {
        n2 <<= 1;
    }
    for (int i = n + tid; i < n2; i += SPARQ_NT) {
        sm.hc[i] = 0u;
        sm.ci[i] = 0x7fffffff;
    }
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < n2; i += SPARQ_NT) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const bool first = (i & k) == 0; // this run puts the better one at i
                    if (first ? sparq_cand_before(sm, ixj, i) : sparq_cand_before(sm, i, ixj)) {
                        const unsigned int tk = sm.hc[i];
                        sm.hc[i] = sm.hc[ixj];
                        sm.hc[ixj] = tk;
                        const int tc = sm.ci[i];
                        sm.ci[i] = sm.ci[ixj];
                        sm.ci[ixj] = tc;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The want best (larger key, then lower cell) of the n gathered candidates of bin b (0 < want < n)
// into the unit's bitmap: up to a candidate per thread, each one's rank counted directly; more,
// radix passes over the candidates' key bits below the bin (8, 8 and 4 bits) in shared memory down
// to the key of the want-th best, then the candidates above it and as many at it as are wanted,
// the lower cells first (a few ties at that exact key, rare, are ranked by a count over the
// candidates, more than 16 by the bitonic sort). The sort of every candidate this replaces was
// most of the select's time on a GPU at 4K cells.
static __device__ void sparq_take_best_cands(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, int n, int want,
                                             const sparq_sel_smem & sm) {
    const int tid = threadIdx.x;
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    if (n <= SPARQ_NT) {
        // a candidate per thread: its rank is the number that come before it, all at once (the
        // radix passes below cost three block-wide scans for the few cells a bin usually holds)
        if (tid < n) {
            int rank = 0;
            for (int j = 0; j < n; ++j) {
                rank += sparq_cand_before(sm, j, tid);
            }
            if (rank < want) {
                const int s = sm.ci[tid];
                atomicOr(&sb[s >> 5], 1u << (s & 31));
            }
        }
        __syncthreads();
        return;
    }
    unsigned int prefix = (unsigned int) b << SPARQ_NB_SHIFT;
    int shift = SPARQ_NB_SHIFT, n_eq = n;
    const int want0 = want;
    const int passes[3][2] = { { 12, 8 }, { 4, 8 }, { 0, 4 } };
    for (int p = 0; p < 3 && n_eq != want; ++p) { // n_eq and want are uniform over the block
        const int hs = passes[p][0] + passes[p][1];
        sm.rc[tid] = 0u;
        __syncthreads();
        for (int i = tid; i < n; i += SPARQ_NT) {
            const unsigned int o = sm.hc[i];
            if ((o >> hs) == (prefix >> hs)) {
                atomicAdd(&sm.rc[(o >> passes[p][0]) & ((1u << passes[p][1]) - 1u)], 1u);
            }
        }
        __syncthreads();
        const sparq_cross y = sparq_find_cross<1>(false, (double) want, [&](int bin) { return (int) sm.rc[bin]; },
                                                  [&](int) { return 0.0; }, sm.sh, sm.shd, sm.s_cross);
        prefix |= (unsigned int) y.bin << passes[p][0];
        shift = passes[p][0];
        want -= y.c_above;
        n_eq = y.c_bin;
    }
    const unsigned int ph = prefix >> shift;
    if (n_eq > want && n_eq > 16) {
        sparq_sort_cands(sm, n); // many equal keys: every candidate ranked, the first want0 taken
        for (int i = tid; i < want0; i += SPARQ_NT) {
            const int s = sm.ci[i];
            atomicOr(&sb[s >> 5], 1u << (s & 31));
        }
        __syncthreads();
        return;
    }
    for (int i = tid; i < n; i += SPARQ_NT) {
        const unsigned int hi = sm.hc[i] >> shift;
        bool take = hi > ph;
        if (hi == ph) {
            take = n_eq == want;
            if (!take) {
                // at the exact key: taken while fewer than want equal candidates have lower cells
                int lower = 0;
                for (int j = 0; j < n; ++j) {
                    lower += sm.hc[j] == sm.hc[i] && sm.ci[j] < sm.ci[i];
                }
                take = lower < want;
            }
        }
        if (take) {
            const int s = sm.ci[i];
            atomicOr(&sb[s >> 5], 1u << (s & 31));
        }
    }
    __syncthreads();
}

// One radix pass over list li: the eligible cells whose key bits above shift + width equal
// prefix's, counted (and weighed, mass) by their bits [shift, shift + width); then the crossing of
// target as sparq_find_cross (the bin in [0, 2^width)).
static __device__ sparq_cross sparq_radix_pass(const sparq_cu_args & a, const sparq_sel_ctx & c, unsigned int prefix,
                                               int shift, int width, bool mass, double target,
                                               const sparq_sel_smem & sm) {
    const int tid = threadIdx.x;
    sm.rc[tid] = 0u;
    sm.rm[tid] = 0.0;
    __syncthreads();
    const int hs = shift + width;
    for (int s = tid; s < a.n_kv; s += SPARQ_NT) {
        const float x = __ldcg(c.keys + s);
        if (sparq_sel_eligible(a, c, s, x)) {
            const unsigned int o = sparq_key_bits(x);
            if ((hs >= 32 ? 0u : o >> hs) == (hs >= 32 ? 0u : prefix >> hs)) {
                const int bin = (int) ((o >> shift) & ((1u << width) - 1u));
                atomicAdd(&sm.rc[bin], 1u);
                if (mass) {
                    atomicAdd(&sm.rm[bin], sparq_key_mass(a, c, x));
                }
            }
        }
    }
    __syncthreads();
    return sparq_find_cross<1>(mass, target, [&](int bin) { return (int) sm.rc[bin]; },
                               [&](int bin) { return sm.rm[bin]; }, sm.sh, sm.shd, sm.s_cross);
}

// The window's cells (by the unit's first list) into the unit's bitmap without a pass over the
// list: the given window's bits, or the tail's valid cells from w0 on.
static __device__ void sparq_window_bits(const sparq_cu_args & a, const sparq_sel_ctx & c) {
    const int tid = threadIdx.x, lane = tid % 32;
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    if (a.win) {
        for (int w = tid; w < a.W; w += SPARQ_NT) {
            const unsigned int bits = __ldcg(a.wbits + (size_t) c.R * a.W + w);
            if (bits) {
                atomicOr(&sb[w], bits);
            }
        }
        return;
    }
    for (int s0 = c.w0 & ~31; s0 < a.n_kv; s0 += SPARQ_NT) { // chunks of whole bitmap words
        const int s = s0 + tid;
        const bool take = s >= c.w0 && s < a.n_kv && __ldcg(c.keys + s) > -INFINITY;
        const unsigned int bits = __ballot_sync(0xffffffff, take);
        if (lane == 0 && bits) {
            atomicOr(&sb[(s0 + tid - lane) >> 5], bits);
        }
    }
}

// sparq_sel_pass over the tiles' candidates (a fixed k; n of them, all there) instead of the list's
// every cell: those above bin b (and of b with take_eq) into the bitmap, b's gathered with gather.
static __device__ void sparq_cand_pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool take_eq, bool gather,
                                       int n, const sparq_sel_smem & sm, int * s_nc) {
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    const uint2 * cd = a.cand + (size_t) c.li * a.nt_s * SPARQ_TILE_CAND;
    constexpr int U = 4; // entries per thread loaded before any is used (the atomics keep loads in order)
    for (int i0 = threadIdx.x; i0 < n; i0 += U * SPARQ_NT) {
        uint2 e[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * SPARQ_NT;
            e[u] = i < n ? __ldcg(cd + i) : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (i0 + u * SPARQ_NT >= n) {
                break;
            }
            const int kb = (int) (e[u].x >> SPARQ_NB_SHIFT);
            if (kb > b || (take_eq && kb == b)) {
                atomicOr(&sb[e[u].y >> 5], 1u << (e[u].y & 31));
            } else if (gather && kb == b) {
                const int pos = atomicAdd(s_nc, 1);
                if (pos < SPARQ_CAND_MAX) {
                    sm.hc[pos] = e[u].x;
                    sm.ci[pos] = (int) e[u].y;
                }
            }
        }
    }
    __syncthreads();
}

