// llama-sparq: the CUDA kernels' exact k-selection primitive over order-preserving key bits
// (sparq_key_bits, sparq-cuda-common.cuh): the block-wide crossing of a histogram by a target count
// or mass, which a radix top-k takes bin by bin (the selection's first pass, its radix passes, the
// calibrated k's cut, a fixed k's per-tile candidates). No SparQ state: counts and masses in, the
// bin out. Included by sparq-cuda-kernels.cuh after sparq-cuda-common.cuh.
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

