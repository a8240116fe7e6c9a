// llama-sparq: the CUDA kernels of stages 5-6 (sparq-cuda.cu lists the stages): the radix select
// of the kk-th largest key of each list and the collection of the chosen cells and the window into
// the unit's bitmap.
#pragma once

#include "sparq-cuda-common.cuh"

// ---------------------------------------------------------------------------
// 5 radix select: the kk-th largest key of each list, 8 bits per pass
// ---------------------------------------------------------------------------

// whether cell s may be chosen by score in list li's row (key of that cell given)
static __device__ __forceinline__ bool sparq_eligible(const sparq_cu_args & a, const sparq_cu_row & ri, int R, int s, float key) {
    return s < ri.w0 && key > -INFINITY && !(a.win && sparq_win_bit(a, R, s));
}

// cell s (its key x) into a pass's block histogram hs: eligible, and its bits above this pass's
// byte equal to the bound found so far (prefix, already shifted; every cell at the first pass)
static __device__ __forceinline__ void sparq_hist_cell(const sparq_cu_args & a, const sparq_cu_row & ri, int R, int s,
                                                       float x, int shift, unsigned int prefix, unsigned int * hs) {
    if (sparq_eligible(a, ri, R, s, x)) {
        const unsigned int o = sparq_key_bits(x);
        if (shift == 24 || (o >> (shift + 8)) == prefix) {
            atomicAdd(&hs[(o >> shift) & 255u], 1u);
        }
    }
}

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_hist(const sparq_cu_args a, const int shift) {
    __shared__ unsigned int hs[256];
    const int li = blockIdx.y, tid = threadIdx.x;
    const int u = li / a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0 || sparq_row_kk(a, ri) <= 0) {
        return;
    }
    unsigned int prefix = 0;
    if (shift < 24) {
        const sparq_cu_pick pk = a.pick[li];
        if (pk.done) {
            return;
        }
        prefix = pk.prefix >> (shift + 8);
    }
    hs[tid] = 0u;
    __syncthreads();
    const float * key = sparq_list_keys(a, li);
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        if (s >= a.S) {
            break;
        }
        sparq_hist_cell(a, ri, R, s, key[s], shift, prefix, hs);
    }
    __syncthreads();
    if (hs[tid]) {
        atomicAdd(&a.hist[(size_t) li * 256 + tid], hs[tid]);
    }
}

// a list's radix select before its first pass: kk cells wanted, no bound yet (done: nothing to choose)
static __device__ __forceinline__ sparq_cu_pick sparq_pick_start(int kk, bool done) {
    sparq_cu_pick pk = {};
    pk.shift = 32;
    pk.want = kk;
    pk.done = done;
    return pk;
}

// one warp over a pass's histogram (lane l holds bins 8l..8l+7 in c): the bin holding the wanted
// key, written to *out as pk advanced by one pass (by the lane that found it), or every eligible
// cell chosen when the first pass counts no more than wanted
static __device__ __forceinline__ void sparq_pick_warp(const unsigned int (&c)[8], int shift, sparq_cu_pick pk,
                                                       sparq_cu_pick * out) {
    const int lane = threadIdx.x % 32;
    int tot = 0;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        tot += (int) c[b];
    }
    // suffix sums over the lanes: suf = the counts of this lane's bins and every higher bin
    int suf = tot;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_down_sync(0xffffffff, suf, o);
        if (lane + o < 32) {
            suf += y;
        }
    }
    const int total = __shfl_sync(0xffffffff, suf, 0);
    if (shift == 24 && total <= pk.want) {
        // no more eligible cells than wanted: all of them
        if (lane == 0) {
            pk.all = 1;
            pk.done = 1;
            *out = pk;
        }
        return;
    }
    // total >= want here (later passes count exactly the cells of the chosen bin, >= want):
    // exactly one lane holds the bin where the running count from the top reaches want
    const int above_lane = suf - tot;
    if (above_lane < pk.want && pk.want <= suf) {
        int above = above_lane;
        int bin = lane * 8;
        int cnt = 0;
#pragma unroll
        for (int b = 7; b >= 0; --b) {
            if (above + (int) c[b] >= pk.want) {
                bin = lane * 8 + b;
                cnt = (int) c[b];
                break;
            }
            above += (int) c[b];
        }
        pk.prefix |= (unsigned int) bin << shift;
        pk.shift = shift;
        pk.want -= above;
        pk.n_eq = cnt;
        if (cnt == pk.want || shift == 0) {
            pk.done = 1;
            pk.ties = cnt != pk.want;
        }
        *out = pk;
    }
}

// one warp per list: the bin holding the wanted key; clears the histogram for the next pass
static __global__ void __launch_bounds__(32) k_sparq_pick(const sparq_cu_args a, const int shift) {
    const int li = blockIdx.x, lane = threadIdx.x;
    const int u = li / a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    const int kk = sparq_row_kk(a, ri);
    sparq_cu_pick pk;
    if (shift == 24) {
        pk = sparq_pick_start(kk, ri.mode != 0 || kk <= 0);
        if (pk.done) {
            if (lane == 0) {
                a.pick[li] = pk;
            }
            return;
        }
    } else {
        pk = a.pick[li];
        if (pk.done) {
            return;
        }
    }
    unsigned int * hg = a.hist + (size_t) li * 256;
    unsigned int c[8];
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        c[b] = hg[lane * 8 + b];
        hg[lane * 8 + b] = 0u;
    }
    sparq_pick_warp(c, shift, pk, &a.pick[li]);
}

// ---------------------------------------------------------------------------
// 6 collect: the chosen cells and the window into the unit's bitmap
// ---------------------------------------------------------------------------

// per tile, the eligible cells whose key equals the bound (only for lists with ties)
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_eqcount(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    const int li = blockIdx.y, tid = threadIdx.x;
    const int u = li / a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0 || sparq_row_kk(a, ri) <= 0) {
        return;
    }
    const sparq_cu_pick pk = a.pick[li];
    if (!pk.ties) {
        return;
    }
    const float * key = sparq_list_keys(a, li);
    int n = 0;
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        if (s < a.S) {
            const float x = key[s];
            n += sparq_eligible(a, ri, R, s, x) && sparq_key_bits(x) == pk.prefix;
        }
    }
    int tot;
    sparq_block_scan(n, &tot, sh);
    if (tid == 0) {
        a.eqcnt[(size_t) li * a.nt_s + blockIdx.x] = tot;
    }
}

// cells s0 .. s0 + SPARQ_NT - 1 of list li into the unit's bitmap sb: the window (by the unit's
// first list, h == 0), the keys above pk's bound, and the keys equal to it in cell order while
// fewer than pk.want were taken (eq_seen: those before s0, uniform over the block; advanced here)
static __device__ __forceinline__ void sparq_collect_chunk(const sparq_cu_args & a, const sparq_cu_row & ri, int R, int h,
                                                           const char * m, const float * key, const sparq_cu_pick & pk,
                                                           bool choose, int s0, int & eq_seen, int * sh, unsigned int * sb) {
    const int tid = threadIdx.x, lane = tid % 32;
    const int s = s0 + tid;
    bool take = false, eq = false;
    if (s < a.S) {
        if (h == 0) {
            take = a.win ? sparq_win_bit(a, R, s) : (s >= ri.w0 && sparq_valid(a, m, s));
        }
        if (choose) {
            const float x = key[s];
            if (sparq_eligible(a, ri, R, s, x)) {
                if (pk.all) {
                    take = true;
                } else {
                    const unsigned int o = sparq_key_bits(x);
                    const unsigned int hi = pk.shift >= 32 ? 0u : o >> pk.shift;
                    const unsigned int bh = pk.shift >= 32 ? 0u : pk.prefix >> pk.shift;
                    if (hi > bh) {
                        take = true;
                    } else if (hi == bh) {
                        eq = true;
                    }
                }
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
    // the warp's 32 cells are one bitmap word (tiles and chunks are multiples of 32)
    const unsigned int bits = __ballot_sync(0xffffffff, take);
    if (lane == 0 && bits) {
        atomicOr(&sb[(s0 + (tid - lane)) >> 5], bits);
    }
}

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_collect(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    const int li = blockIdx.y;
    const int u = li / a.ph, h = li % a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0) {
        return;
    }
    const int kk = sparq_row_kk(a, ri);
    sparq_cu_pick pk = {};
    if (kk > 0) {
        pk = a.pick[li];
    }
    const bool choose = kk > 0;
    const char * m = sparq_mask_row(a, R);
    const float * key = sparq_list_keys(a, li);
    unsigned int * sb = a.selbits + (size_t) u * a.W;

    // equal keys before this tile (ties only)
    int eq_seen = 0;
    if (pk.ties) {
        for (int t = 0; t < (int) blockIdx.x; ++t) {
            eq_seen += a.eqcnt[(size_t) li * a.nt_s + t];
        }
    }
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        sparq_collect_chunk(a, ri, R, h, m, key, pk, choose, blockIdx.x * SPARQ_TS + i * SPARQ_NT, eq_seen, sh, sb);
    }
}

// ---------------------------------------------------------------------------
// 5+6 in one kernel: a block per list does the radix select and the collection itself
// ---------------------------------------------------------------------------

// The same choice as k_sparq_hist / k_sparq_pick / k_sparq_eqcount / k_sparq_collect (the kk largest
// eligible keys, equal keys to the lower cells, the window's bits by the unit's first list), one
// block walking the whole list: four passes of the keys (from L2: the scores were just written)
// and one of the cells, where the chain above takes ten launches. For short lists, where the
// launches and not the reads set the time (sparq_select_fused chooses).
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_select(const sparq_cu_args a) {
    __shared__ unsigned int hs[256];
    __shared__ int sh[SPARQ_NW];
    __shared__ sparq_cu_pick spk;
    const int li = blockIdx.x, tid = threadIdx.x, lane = tid % 32;
    const int u = li / a.ph, h = li % a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0) {
        return; // uniform over the block
    }
    const int kk = sparq_row_kk(a, ri);
    const bool choose = kk > 0;
    const float * key = sparq_list_keys(a, li);

    sparq_cu_pick pk = sparq_pick_start(kk, !choose);
    for (int shift = 24; shift >= 0 && !pk.done; shift -= 8) { // pk is uniform over the block
        hs[tid] = 0u;
        if (tid == 0) {
            spk = pk;
        }
        __syncthreads();
        const unsigned int prefix = shift == 24 ? 0u : pk.prefix >> (shift + 8);
        for (int s = tid; s < a.S; s += SPARQ_NT) {
            sparq_hist_cell(a, ri, R, s, key[s], shift, prefix, hs);
        }
        __syncthreads();
        if (tid < 32) { // the first warp picks the bin, as k_sparq_pick
            unsigned int c[8];
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                c[b] = hs[lane * 8 + b];
            }
            sparq_pick_warp(c, shift, pk, &spk);
        }
        __syncthreads();
        pk = spk;
        __syncthreads(); // spk is written again by the next pass
    }

    // the chosen cells (and the window, by the unit's first list) into the unit's bitmap, cells in
    // ascending order so that equal keys go to the lower cells
    const char * m = sparq_mask_row(a, R);
    unsigned int * sb = a.selbits + (size_t) u * a.W;
    int eq_seen = 0;
    for (int s0 = 0; s0 < a.S; s0 += SPARQ_NT) {
        sparq_collect_chunk(a, ri, R, h, m, key, pk, choose, s0, eq_seen, sh, sb);
    }
}
