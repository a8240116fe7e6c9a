// llama-sparq: the CUDA kernels' k-selection primitive over order-preserving key bits
// (sparq_key_bits, sparq-cuda-common.cuh), exact or bucketed. Exact: the block-wide crossing of a
// histogram by a target count or mass, which a radix top-k takes bin by bin (the selection's first
// pass, its radix passes, the calibrated k's cut, a fixed k's per-tile candidates). Bucketed (the
// approximate bucketed top-k: one cell per bucket, then the best of those): the buckets' offers and
// the bound of the best of them. No SparQ state: keys, counts and masses in, the bin or the cells
// out. Included by sparq-cuda-kernels.cuh after sparq-cuda-common.cuh.
#pragma once

// the bin where a running count or mass, from the largest keys down, reaches a target
struct sparq_cross {
    int bin;        // the bin (-1: the total falls short of the target)
    int c_above;    // cells in the bins above it
    double m_above; // their mass
    int c_bin;      // cells in the bin
    int c_total;    // cells in all bins
};

// Over nb = SPARQ_NT * B bins, thread t holding the B bins below nb - B t (bins from the top): the
// crossing of target by the running count (mass false) or mass (mass true). cnt(b), ms(b): bin b's
// count and mass. sh / shd: SPARQ_NW ints / doubles; s_out: a shared result slot.
template <int B, typename FC, typename FM>
static __device__ sparq_cross sparq_find_cross(bool mass, double target, FC cnt, FM ms, int * sh, double * shd,
                                               sparq_cross * s_out) {
    const int tid = threadIdx.x;
    const int top = SPARQ_NT * B - 1 - tid * B; // this thread's highest bin
    int c[B];
    double mv[B];
    int c_loc = 0;
    double m_loc = 0.0;
#pragma unroll
    for (int i = 0; i < B; ++i) {
        c[i] = cnt(top - i);
        mv[i] = mass ? ms(top - i) : 0.0;
        c_loc += c[i];
        m_loc += mv[i];
    }
    int c_tot;
    const int c_incl = sparq_block_scan(c_loc, &c_tot, sh);
    double m_tot = 0.0, m_incl = 0.0;
    if (mass) {
        m_incl = sparq_block_scan_d(m_loc, &m_tot, shd);
    }
    if (tid == 0) {
        s_out->bin = -1;
        s_out->c_total = c_tot;
    }
    __syncthreads();
    const bool here = mass ? (m_incl - m_loc < target && target <= m_incl) : (c_incl - c_loc < target && target <= c_incl);
    if (here) {
        int ca = c_incl - c_loc;
        double ma = m_incl - m_loc;
#pragma unroll
        for (int i = 0; i < B; ++i) {
            if (mass ? ma + mv[i] >= target : ca + c[i] >= target) {
                s_out->bin = top - i;
                s_out->c_above = ca;
                s_out->m_above = ma;
                s_out->c_bin = c[i];
                break;
            }
            ca += c[i];
            ma += mv[i];
        }
    }
    __syncthreads();
    const sparq_cross r = *s_out;
    __syncthreads();
    return r;
}


// ----- the bucketed top-k -----

// Cell's key offered to its bucket (cell mod B) of bk (B words, 0: no offer) as key bits << 32 |
// ~cell, so that the larger word is the larger key, then the lower cell; the bucket keeps the
// largest (offers only grow, so one already at least as large skips the atomic)
static __device__ __forceinline__ void sparq_bucket_offer(unsigned long long * bk, int B, int cell, float key) {
    const unsigned long long v = (unsigned long long) sparq_key_bits(key) << 32 | (0xffffffffu - (unsigned int) cell);
    unsigned long long * p = bk + cell % B;
    if (__ldcg(p) < v) {
        atomicMax(p, v);
    }
}

// The bound of the kk (> 0) best offers of bk[0..B) (distinct words, the larger the better): the
// offers at or above it are those (every offer where there are at most kk). Radix passes of 8 bits
// over the offers down to the kk-th best. rc: 256 counts; sh, shd, s_cross: sparq_find_cross's
// (shared memory). Uniform over the block.
static __device__ unsigned long long sparq_bucket_bound(const unsigned long long * bk, int B, int kk, unsigned int * rc,
                                                        int * sh, double * shd, sparq_cross * s_cross) {
    const int tid = threadIdx.x;
    unsigned long long lo = 0ull; // the bound's bits found so far (all of them once done)
    int want = kk;
    for (int shift = 56; shift >= 0; shift -= 8) { // lo, want and the crossing are uniform over the block
        rc[tid] = 0u;
        __syncthreads();
        for (int b = tid; b < B; b += SPARQ_NT) {
            const unsigned long long v = __ldcg(bk + b);
            if (v != 0ull && (shift == 56 || (v >> (shift + 8)) == (lo >> (shift + 8)))) {
                atomicAdd(&rc[(v >> shift) & 255u], 1u);
            }
        }
        __syncthreads();
        const sparq_cross y = sparq_find_cross<1>(false, (double) want, [&](int bin) { return (int) rc[bin]; },
                                                  [&](int) { return 0.0; }, sh, shd, s_cross);
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
    return lo;
}

// take(cell) for each offer of bk[0..B) at or above bound, the block's threads sharing the buckets
template <typename F>
static __device__ __forceinline__ void sparq_bucket_each(const unsigned long long * bk, int B, unsigned long long bound,
                                                         F take) {
    for (int b = threadIdx.x; b < B; b += SPARQ_NT) {
        const unsigned long long v = __ldcg(bk + b);
        if (v != 0ull && v >= bound) {
            take((int) (0xffffffffu - (unsigned int) v));
        }
    }
}
