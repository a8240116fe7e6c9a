// llama-sparq: the second kernel of GGML_OP_SPARQ_ATTN (sparq-cuda.cu lists the kernels), its list
// side: the last tile of each list to finish chooses the list's cells (the row's window and mode,
// the calibrated k's cut, the bin holding the k-th largest key, those above it and the best of that
// bin) into the unit's bitmap. The kernel and its tiles' steps are sparq-cuda-select-tile.cuh's.
#pragma once

#include "sparq-cuda-common.cuh"

// ---------------------------------------------------------------------------
// keys, bins and masses
// ---------------------------------------------------------------------------

// float -> the ordered key bits' inverse (sparq_key_bits)
static __device__ __forceinline__ float sparq_key_float(unsigned int o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// what a list's selection needs of its unit and row, the same in every block of the list
struct sparq_sel_ctx {
    int li, u, h, R, kvh;
    int n_valid, rk, mode; // valid cells, the row's k, 0 SparQ / 1 dense / 2 dense stream
    int w0;                // candidates are the cells < w0
    bool summed;           // the key is the group's sum of softmaxes (g > 1, shared choice)
    const float * keys;    // the list's keys (for a summed key, written by the tile blocks)
    float M;               // the list head's softmax maximum (not summed)
    double iZ;             // and 1 / its sum
    int cand_lo;           // with calib_hist: the score tiles' candidates hold every valid cell in the
                           // bins from this one up (SPARQ_NB: none)
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
    c.kvh = c.u % a.n_head_kv;
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
    c.cand_lo = SPARQ_NB;
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

static __device__ void sparq_scored_gather(const sparq_cu_args & a, const sparq_sel_ctx & c, int b,
                                           const sparq_sel_smem & sm, int * s_nc);

// The calibrated k's cut of list li: the fewest best eligible cells whose mass reaches need (> 0),
// or -1 when that takes more than kk cells (the unit is diffuse). From the first-pass histograms,
// then the bin of the crossing: its cells ranked in shared memory, or radix passes over the list
// when there are more of them than fit. *reach: the cut's cells, for the report; beyond the cap
// not ranked further (a diffuse unit reads every cell anyway): the cells above the crossing's bin
// and one, or every eligible cell when all of them fall short (lower bounds).
// MASS (calib_hist): the histograms are the merge's (sparq_calib_merge), and a crossing bin at or
// above the score tiles' cand_lo gathers its cells from their candidates instead of the list.
template <bool MASS = false>
static __device__ int sparq_coverage_cut(const sparq_cu_args & a, const sparq_sel_ctx & c, double need, int kk,
                                         const sparq_sel_smem & sm, int * s_nc, int * reach) {
    const int tid = threadIdx.x;
    const unsigned int * hg = a.hist + (size_t) c.li * SPARQ_NB;
    const double * hmg = a.hmass + (size_t) c.li * SPARQ_NB;
    const sparq_cross x = sparq_find_cross<SPARQ_NB / SPARQ_NT>(true, need, [&](int bin) { return (int) __ldcg(hg + bin); },
                                                                [&](int bin) { return __ldcg(hmg + bin); }, sm.sh, sm.shd,
                                                                sm.s_cross);
    if (x.bin < 0 || x.c_above >= kk) {
        *reach = x.bin < 0 ? x.c_total : x.c_above + 1;
        return -1; // short of the target with every eligible cell, or beyond the cap
    }
    const double rem = need - x.m_above;
    if (x.c_bin <= SPARQ_CAND_MAX && !a.force_radix) {
        if (tid == 0) {
            *s_nc = 0;
            sm.s_int[3] = 0x7fffffff;
        }
        __syncthreads();
        if (MASS && x.bin >= c.cand_lo) {
            sparq_scored_gather(a, c, x.bin, sm, s_nc);
        } else {
            sparq_sel_pass(a, c, x.bin, false, false, true, sm, s_nc);
        }
        const int n = min(*s_nc, SPARQ_CAND_MAX);
        sparq_sort_cands(sm, n);
        // the running mass over the sorted candidates: a contiguous share per thread
        const int per = (n + SPARQ_NT - 1) / SPARQ_NT;
        const int i0 = min(n, tid * per), i1 = min(n, i0 + per);
        double loc = 0.0;
        for (int i = i0; i < i1; ++i) {
            loc += sparq_key_mass(a, c, sparq_key_float(sm.hc[i]));
        }
        double tot;
        double acc = sparq_block_scan_d(loc, &tot, sm.shd) - loc;
        for (int i = i0; i < i1; ++i) {
            acc += sparq_key_mass(a, c, sparq_key_float(sm.hc[i]));
            if (acc >= rem) {
                atomicMin(&sm.s_int[3], i);
                break;
            }
        }
        __syncthreads();
        const int pos = sm.s_int[3];
        __syncthreads();
        // (past the bin only by rounding between the histogram's sums and these)
        const int n_cut = x.c_above + (pos == 0x7fffffff ? n + 1 : pos + 1);
        *reach = n_cut;
        return n_cut <= kk ? n_cut : -1;
    }
    // radix passes within the bin: 8, 8 and 4 more bits down to the exact key of the crossing
    unsigned int prefix = (unsigned int) x.bin << SPARQ_NB_SHIFT;
    int c_above = x.c_above;
    double m_above = x.m_above;
    const int passes[3][2] = { { 12, 8 }, { 4, 8 }, { 0, 4 } };
    int c_bin = x.c_bin;
    for (int p = 0; p < 3; ++p) {
        const sparq_cross y = sparq_radix_pass(a, c, prefix, passes[p][0], passes[p][1], true, need - m_above, sm);
        if (y.bin < 0) {
            const int n_cut = c_above + c_bin + 1; // (rounding, as above)
            *reach = n_cut;
            return n_cut <= kk ? n_cut : -1;
        }
        prefix |= (unsigned int) y.bin << passes[p][0];
        c_above += y.c_above;
        m_above += y.m_above;
        c_bin = y.c_bin;
    }
    // cells with the crossing's key weigh the same: as many of them as the rest of the target needs
    const double w = sparq_key_mass(a, c, sparq_key_float(prefix));
    int j = w > 0.0 ? (int) ceil((need - m_above) / w) : c_bin;
    j = max(1, min(c_bin, j));
    const int n_cut = c_above + j;
    *reach = n_cut;
    return n_cut <= kk ? n_cut : -1;
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

// With score_hist: fn(key bits, cell) for each candidate the score tiles kept for list li, a warp
// per tile, four loads in flight per lane
template <typename F>
static __device__ __forceinline__ void sparq_scored_each(const sparq_cu_args & a, const sparq_sel_ctx & c, F fn) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int cap = sparq_score_cap(a);
    constexpr int U = 4;
    for (int t = warp; t < a.nt_a; t += SPARQ_NW) {
        const uint2 * cd = sparq_score_cands(a, c.li, t);
        const int n = min((int) cd[0].x, cap);
        for (int i0 = lane; i0 < n; i0 += U * 32) {
            uint2 e[U];
#pragma unroll
            for (int v = 0; v < U; ++v) {
                const int i = i0 + v * 32;
                e[v] = i < n ? cd[1 + i] : make_uint2(0u, 0u);
            }
#pragma unroll
            for (int v = 0; v < U; ++v) {
                if (i0 + v * 32 < n) {
                    fn(e[v].x, (int) e[v].y);
                }
            }
        }
    }
}

// With score_hist: whether every score tile kept all its candidates (uniform over the block)
static __device__ bool sparq_scored_complete(const sparq_cu_args & a, const sparq_sel_ctx & c, int * sh) {
    const int cap = sparq_score_cap(a);
    int over = 0;
    for (int t = threadIdx.x; t < a.nt_a; t += SPARQ_NT) {
        over += (int) sparq_score_cands(a, c.li, t)[0].x > cap;
    }
    int tot;
    sparq_block_scan(over, &tot, sh);
    return tot == 0;
}

// With score_hist: list li's eligible cells counted by their key's top bits into sm.hc: from the
// score tiles' candidates (complete: exact in every bin from the list's crossing up, which is all
// the choice reads), else from a pass over the list
static __device__ void sparq_scored_histogram(const sparq_cu_args & a, const sparq_sel_ctx & c, bool complete,
                                              const sparq_sel_smem & sm) {
    for (int b = threadIdx.x; b < SPARQ_NB; b += SPARQ_NT) {
        sm.hc[b] = 0u;
    }
    __syncthreads();
    if (complete) {
        sparq_scored_each(a, c, [&](unsigned int o, int s) {
            if (s < c.w0 && !(a.win && sparq_win_bit(a, c.R, s))) {
                atomicAdd(&sm.hc[o >> SPARQ_NB_SHIFT], 1u);
            }
        });
    } else {
        for (int s = threadIdx.x; s < a.n_kv; s += SPARQ_NT) {
            const float x = __ldcg(c.keys + s);
            if (sparq_sel_eligible(a, c, s, x)) {
                atomicAdd(&sm.hc[sparq_key_bits(x) >> SPARQ_NB_SHIFT], 1u);
            }
        }
    }
    __syncthreads();
}

// sparq_cand_pass over the score tiles' candidates (score_hist, all kept): the eligible ones above
// bin b (and of b with take_eq) into the bitmap, b's gathered with gather
static __device__ void sparq_scored_pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool take_eq, bool gather,
                                         const sparq_sel_smem & sm, int * s_nc) {
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    sparq_scored_each(a, c, [&](unsigned int o, int s) {
        if (s >= c.w0 || (a.win && sparq_win_bit(a, c.R, s))) {
            return;
        }
        const int kb = (int) (o >> SPARQ_NB_SHIFT);
        if (kb > b || (take_eq && kb == b)) {
            atomicOr(&sb[s >> 5], 1u << (s & 31));
        } else if (gather && kb == b) {
            const int pos = atomicAdd(s_nc, 1);
            if (pos < SPARQ_CAND_MAX) {
                sm.hc[pos] = o;
                sm.ci[pos] = s;
            }
        }
    });
    __syncthreads();
}

// With calib_hist: the eligible candidates of bin b (at or above cand_lo: every one is there) into
// the gathered candidates, as sparq_sel_pass's gather (the calibrated k's crossing bin)
static __device__ void sparq_scored_gather(const sparq_cu_args & a, const sparq_sel_ctx & c, int b,
                                           const sparq_sel_smem & sm, int * s_nc) {
    sparq_scored_each(a, c, [&](unsigned int o, int s) {
        if (s < c.w0 && (int) (o >> SPARQ_NB_SHIFT) == b && !(a.win && sparq_win_bit(a, c.R, s))) {
            const int pos = atomicAdd(s_nc, 1);
            if (pos < SPARQ_CAND_MAX) {
                sm.hc[pos] = o;
                sm.ci[pos] = s;
            }
        }
    });
    __syncthreads();
}

// With calib_hist: list li's first-pass histograms (a.hist, a.hmass, which the score kernel cleared;
// the list's one block adds into them) from the score tiles' non-empty bins, each tile's masses
// rescaled from its own maximum m_t by exp(m_t - M) / Z; then the window's cells, which the score
// tiles counted as any valid cell, taken out again. Returns the lowest bin from which the tiles'
// candidates hold every valid cell (the highest of their lowest whole bins).
static __device__ int sparq_calib_merge(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    unsigned int * hg = a.hist + (size_t) c.li * SPARQ_NB;
    double * hmg = a.hmass + (size_t) c.li * SPARQ_NB;
    if (tid == 0) {
        sm.s_int[3] = 0;
    }
    __syncthreads();
    const float2 * ts = a.tstat + (size_t) c.u * a.nt_a * a.g + c.h; // (a list per head: its head is c.h)
    for (int t = warp; t < a.nt_a; t += SPARQ_NW) {
        const float mt = ts[(size_t) t * a.g].x;
        if (mt == -INFINITY) {
            continue; // no valid cell (uniform over the warp)
        }
        const double f = exp((double) mt - (double) c.M) * c.iZ;
        const uint2 * bd = sparq_score_bins(a, c.li, t);
        const int n = (int) bd[0].x;
        for (int i = lane; i < n; i += 32) {
            const uint2 e = bd[1 + i];
            const int b = (int) (e.x >> 16);
            atomicAdd(&hg[b], e.x & 0xffffu);
            atomicAdd(&hmg[b], (double) __uint_as_float(e.y) * f);
        }
        if (lane == 0) {
            atomicMax(&sm.s_int[3], (int) sparq_score_cands(a, c.li, t)[0].y);
        }
    }
    // the window's cells: the given window's bits, or the tail's valid cells from w0 on
    const auto drop = [&](int s) {
        const float x = __ldcg(c.keys + s);
        if (x > -INFINITY) {
            const float mt = ts[(size_t) (s / a.tl_a) * a.g].x;
            const int b = (int) (sparq_key_bits(x) >> SPARQ_NB_SHIFT);
            atomicAdd(&hg[b], 0xffffffffu);
            atomicAdd(&hmg[b], -((double) sparq_tile_mass(x, mt) * exp((double) mt - (double) c.M) * c.iZ));
        }
    };
    if (a.win) {
        for (int w = tid; w < a.W; w += SPARQ_NT) {
            unsigned int bits = __ldcg(a.wbits + (size_t) c.R * a.W + w);
            while (bits) {
                const int i = __ffs(bits) - 1;
                bits &= bits - 1u;
                drop(w * 32 + i);
            }
        }
    } else {
        for (int s = c.w0 + tid; s < a.n_kv; s += SPARQ_NT) {
            drop(s);
        }
    }
    __threadfence();
    __syncthreads();
    // a bin left with no cell weighs nothing (not the rounding of its sum and the window's)
    for (int b = tid; b < SPARQ_NB; b += SPARQ_NT) {
        if (__ldcg(hg + b) == 0u || __ldcg(hmg + b) < 0.0) {
            hmg[b] = 0.0;
        }
    }
    __threadfence();
    __syncthreads();
    const int lo = sm.s_int[3];
    __syncthreads();
    return lo;
}

// The kk (> 0) best eligible cells of list li and the window into the unit's bitmap: from the
// first-pass histogram (the select tiles', or with score_hist the score tiles' candidates') the bin
// holding the kk-th best key; one pass takes the cells above it and gathers the bin's cells, the
// best of which are ranked in shared memory; a bin with more cells than fit takes radix passes over
// the list and a collection in cell order (equal keys to the lower cells, as the CPU op).
// SCORED: score_hist's (with MASS, calib_hist's: the merge's histogram, and the pass over the score
// tiles' candidates where the bin is at or above their cand_lo).
template <bool SCORED, bool MASS = false>
static __device__ void sparq_choose(const sparq_cu_args & a, const sparq_sel_ctx & c, int kk, const sparq_sel_smem & sm,
                                    int * s_nc) {
    const int tid = threadIdx.x;
    const unsigned int * hg = a.hist + (size_t) c.li * SPARQ_NB;
    bool scored = false; // the score tiles kept every candidate (uniform over the block)
    constexpr bool IN_SM = SCORED && !MASS; // the histogram in shared memory (score_hist's)
    if constexpr (IN_SM) {
        scored = sparq_scored_complete(a, c, sm.sh);
        sparq_scored_histogram(a, c, scored, sm);
    }
    const sparq_cross x = sparq_find_cross<SPARQ_NB / SPARQ_NT>(false, (double) kk,
                                                                [&](int bin) { return (int) (IN_SM ? sm.hc[bin] : __ldcg(hg + bin)); },
                                                                [&](int) { return 0.0; }, sm.sh, sm.shd, sm.s_cross);
    if (x.bin < 0) {
        sparq_sel_pass(a, c, -1, false, true, false, sm, s_nc); // no more eligible cells than wanted: all
        return;
    }
    const int want = kk - x.c_above;
    if (want == x.c_bin || (x.c_bin <= SPARQ_CAND_MAX && !a.force_radix)) {
        if (tid == 0) {
            *s_nc = 0;
        }
        __syncthreads();
        const bool all_of_bin = want == x.c_bin;
        // a fixed k's tiles left their candidates (every cell in a bin from x.bin up among them)
        const unsigned int nc = a.cov_p > 0.0f || SCORED ? 0xffffffffu : __ldcg(a.ncand + c.li);
        if (scored || (MASS && x.bin >= c.cand_lo)) {
            if (c.h == 0) {
                sparq_window_bits(a, c);
            }
            sparq_scored_pass(a, c, x.bin, all_of_bin, !all_of_bin, sm, s_nc);
        } else if (nc <= (unsigned int) (a.nt_s * SPARQ_TILE_CAND)) {
            if (c.h == 0) {
                sparq_window_bits(a, c);
            }
            sparq_cand_pass(a, c, x.bin, all_of_bin, !all_of_bin, (int) nc, sm, s_nc);
        } else {
            sparq_sel_pass(a, c, x.bin, all_of_bin, true, !all_of_bin, sm, s_nc);
        }
        if (all_of_bin) {
            return;
        }
        const int n = min(*s_nc, SPARQ_CAND_MAX);
        if (want < n) {
            sparq_take_best_cands(a, c, x.bin, n, want, sm);
        } else { // (fewer gathered than counted: only if the two passes disagreed)
            unsigned int * sb = a.selbits + (size_t) c.u * a.W;
            for (int i = tid; i < n; i += SPARQ_NT) {
                const int s = sm.ci[i];
                atomicOr(&sb[s >> 5], 1u << (s & 31));
            }
            __syncthreads();
        }
        return;
    }
    // radix passes within the bin, then the collection in cell order
    sparq_cu_pick pk = {};
    pk.prefix = (unsigned int) x.bin << SPARQ_NB_SHIFT;
    pk.shift = SPARQ_NB_SHIFT;
    pk.want = want;
    pk.n_eq = x.c_bin;
    const int passes[3][2] = { { 12, 8 }, { 4, 8 }, { 0, 4 } };
    for (int p = 0; p < 3 && !pk.done; ++p) { // pk is uniform over the block
        const sparq_cross y = sparq_radix_pass(a, c, pk.prefix, passes[p][0], passes[p][1], false, (double) pk.want, sm);
        pk.prefix |= (unsigned int) y.bin << passes[p][0];
        pk.shift = passes[p][0];
        pk.want -= y.c_above;
        pk.n_eq = y.c_bin;
        if (pk.n_eq == pk.want || pk.shift == 0) {
            pk.done = 1;
            pk.ties = pk.n_eq != pk.want;
        }
    }
    sparq_cu_row ri = {};
    ri.w0 = c.w0;
    const char * m = sparq_mask_row(a, c.R);
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    int eq_seen = 0;
    for (int s0 = 0; s0 < a.n_kv; s0 += SPARQ_NT) {
        sparq_collect_chunk(a, ri, c.R, c.h, m, c.keys, pk, true, s0, eq_seen, sm.sh, sb);
    }
}

// The bucketed top-k's choice of list li: the kk (> 0) best of its buckets' offers (the tiles'
// sparq_tile_buckets; distinct words, the larger the better) and the window into the unit's bitmap.
// Radix passes of 8 bits over the offers down to the kk-th best, then every offer at or above it
// (every offer where there are at most kk).
static __device__ void sparq_choose_buckets(const sparq_cu_args & a, const sparq_sel_ctx & c, int kk,
                                            const sparq_sel_smem & sm) {
    const int tid = threadIdx.x;
    const unsigned long long * bk = a.bk + (size_t) c.li * a.buckets;
    unsigned long long lo = 0ull; // the bound's bits found so far (all of them once done)
    int want = kk;
    for (int shift = 56; shift >= 0; shift -= 8) { // lo, want and the crossing are uniform over the block
        sm.rc[tid] = 0u;
        __syncthreads();
        for (int b = tid; b < a.buckets; b += SPARQ_NT) {
            const unsigned long long v = __ldcg(bk + b);
            if (v != 0ull && (shift == 56 || (v >> (shift + 8)) == (lo >> (shift + 8)))) {
                atomicAdd(&sm.rc[(v >> shift) & 255u], 1u);
            }
        }
        __syncthreads();
        const sparq_cross y = sparq_find_cross<1>(false, (double) want, [&](int bin) { return (int) sm.rc[bin]; },
                                                  [&](int) { return 0.0; }, sm.sh, sm.shd, sm.s_cross);
        if (y.bin < 0) {
            lo = 1ull; // fewer offers than wanted (only in the first pass): all of them
            break;
        }
        lo |= (unsigned long long) y.bin << shift;
        want -= y.c_above;
        if (y.c_bin == want) {
            break; // the bin's every offer is wanted: the bound is lo (at shift 0 the bin is one offer)
        }
    }
    if (c.h == 0) {
        sparq_window_bits(a, c);
    }
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    for (int b = tid; b < a.buckets; b += SPARQ_NT) {
        const unsigned long long v = __ldcg(bk + b);
        if (v != 0ull && v >= lo) {
            const int s = (int) (0xffffffffu - (unsigned int) v);
            atomicOr(&sb[s >> 5], 1u << (s & 31));
        }
    }
    __syncthreads();
}

// the number of window cells of a row with a given window list: its valid distinct cells, which the
// tile blocks set in the row's window bitmap
static __device__ int sparq_count_win_bits(const sparq_cu_args & a, int R, int * sh) {
    int n = 0;
    for (int w = threadIdx.x; w < a.W; w += SPARQ_NT) {
        n += __popc(__ldcg(a.wbits + (size_t) R * a.W + w));
    }
    int tot;
    sparq_block_scan(n, &tot, sh);
    return tot;
}

// the window's estimated mass for the calibrated k: the mean over the list's heads (every head of
// the group for a shared list) of their softmax over the window's cells
static __device__ double sparq_window_mass(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm) {
    const int h0 = a.ph > 1 ? c.h : 0, h1 = a.ph > 1 ? c.h + 1 : a.g;
    const int tid = threadIdx.x;
    if (tid < h1 - h0) {
        float M;
        double Z;
        sparq_unit_stats(a, c.u, h0 + tid, &M, &Z);
        sm.sMw[tid] = M;
        sm.siZw[tid] = Z > 0.0 ? 1.0 / Z : 0.0;
    }
    __syncthreads();
    const float * lg = a.logits + (size_t) c.u * a.g * a.n_kv;
    double loc = 0.0;
    for (int s = (a.win ? 0 : c.w0) + tid; s < a.n_kv; s += SPARQ_NT) {
        if (a.win ? sparq_win_bit(a, c.R, s) : lg[s] > -INFINITY) {
            for (int hh = h0; hh < h1; ++hh) {
                loc += exp((double) lg[(size_t) hh * a.n_kv + s] - (double) sm.sMw[hh - h0]) * sm.siZw[hh - h0];
            }
        }
    }
    double tot;
    sparq_block_scan_d(loc, &tot, sm.shd);
    return tot / (h1 - h0);
}

// The last block of list li to finish its tile (SCORED: score_hist's block of the list; with MASS
// calib_hist's): the window's cells counted, the row's description for the attend kernel, the
// calibrated k's cut, then the chosen cells. BUCKETS: the bucketed top-k may apply (a fixed k's
// select tiles; an instantiation of its own, so that the others keep their registers).
template <bool SCORED, bool MASS = false, bool BUCKETS = false>
static __device__ void sparq_select_list(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm,
                                         int * s_nc) {
    const int n_win = a.l <= 0 ? 0 : a.win ? sparq_count_win_bits(a, c.R, sm.sh) : a.l;
    if (threadIdx.x == 0 && (c.kvh == 0 || a.fused) && c.h == 0) { // (fused: each unit's own row)
        sparq_cu_row ri;
        ri.n_valid = c.n_valid;
        ri.w0 = c.w0;
        ri.n_win = n_win;
        ri.mode = 0;
        a.rows[c.R] = ri;
    }
    int kk = c.rk - n_win;
    if (a.lrep && threadIdx.x == 0 && (a.cov_p <= 0.0f || kk <= 0)) {
        // not measured: no target, or the window fills the row's cap (as the CPU op)
        a.lrep[2 * c.li] = -1;
        a.lrep[2 * c.li + 1] = 0;
    }
    if (a.cov_p > 0.0f && kk > 0) {
        const double need = (double) a.cov_p - (n_win > 0 ? sparq_window_mass(a, c, sm) : 0.0);
        int n_cut = 0, reach = 0;
        if (need > 0.0) {
            n_cut = sparq_coverage_cut<MASS>(a, c, need, kk, sm, s_nc, &reach);
        }
        if (a.lrep && threadIdx.x == 0) {
            a.lrep[2 * c.li] = reach;
            a.lrep[2 * c.li + 1] = n_cut >= 0;
        }
        if (n_cut < 0) {
            if (threadIdx.x == 0) {
                a.udense[c.u] = 1; // diffuse: the unit attends over every valid cell
            }
            return;
        }
        kk = min(kk, max(n_cut, a.k_min - n_win));
    }
    if (kk <= 0) {
        if (c.h == 0) {
            sparq_sel_pass(a, c, 0x7fffffff, false, true, false, sm, s_nc); // the window alone
        }
        return;
    }
    if (BUCKETS && a.buckets > 0) {
        sparq_choose_buckets(a, c, kk, sm);
        return;
    }
    sparq_choose<SCORED, MASS>(a, c, kk, sm, s_nc);
}
