// llama-sparq: the launch sequence of GGML_OP_SPARQ_ATTN's CUDA kernels (the template choice per
// group size and cache type, the scratch sizes), shared by the CUDA backend and the CPU emulation.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sparq-cuda-common.cuh"
#include "sparq-cuda-score.cuh"
#include "sparq-cuda-select.cuh"
#include "sparq-cuda-attend.cuh"

static int sparq_gmax(int g) {
    return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : g <= 8 ? 8 : 16;
}

// the vector width of the K^T loads for a group size (cells per thread)
static int sparq_vec_cpt(int gmax) {
    return gmax <= 4 ? 8 : (gmax == 8 ? 4 : 2);
}

// which of two ways an environment variable forces: 1 (it says way1), 2 (way2), 0 (unset or
// empty: the launch chooses; another value is said on stderr and chooses too)
static int sparq_env_way(const char * name, const char * way1, const char * way2) {
    const char * e = getenv(name);
    if (!e || !*e) {
        return 0;
    }
    if (strcmp(e, way1) == 0 || strcmp(e, way2) == 0) {
        return strcmp(e, way1) == 0 ? 1 : 2;
    }
    fprintf(stderr, "sparq_attn: %s=%s is neither %s nor %s: ignored, the launch chooses\n", name, e, way1, way2);
    return 0;
}

// Stage 7 split over several blocks per unit (k_sparq_attend_part, then k_sparq_attend_combine)
// while the units alone would leave the GPU idle: parts of at least SPARQ_ATTEND_PART_ITEMS list
// positions, until about SPARQ_ATTEND_BLOCKS blocks in all (an H100 has 132 SMs; 4 blocks of 256
// threads each). One part: the one-block-per-unit kernel, no combine.
#define SPARQ_ATTEND_PART_ITEMS 32
#define SPARQ_ATTEND_BLOCKS     512

// LLAMA_SPARQ_CUDA_ATTEND=single or split forces one way (comparisons, tests); split then takes a
// part per SPARQ_ATTEND_PART_ITEMS positions of the list whatever the number of units
static int sparq_attend_parts(const sparq_cu_args & a) {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_ATTEND", "single", "split");
    if (force == 1) {
        return 1;
    }
    const int want = std::max(1, (a.sel_max + SPARQ_ATTEND_PART_ITEMS - 1) / SPARQ_ATTEND_PART_ITEMS);
    const int room = force == 2 ? want : std::max(1, SPARQ_ATTEND_BLOCKS / std::max(1, a.U));
    return std::min(want, room);
}

// element counts of the scratch buffers (sparq_cu_args' scratch pointers), from the shapes only
struct sparq_cu_scratch {
    size_t rows, wbits, i1, qsc, logits, tstat, keys, hist, pick, eqcnt, selbits, sel, pstat, py;
};

static sparq_cu_scratch sparq_cu_scratch_sizes(const sparq_cu_args & a) {
    const size_t U = a.U, S = a.S, g = a.g, L = a.L;
    sparq_cu_scratch z;
    z.rows = a.R;
    z.wbits = a.win ? (size_t) a.R * a.W : 1;
    z.i1 = U * a.r;
    z.qsc = U * g * a.r;
    z.logits = std::max<size_t>(1, U * g * S);
    z.tstat = U * a.nt_a * g;
    z.keys = a.g > 1 && a.ph == 1 ? std::max<size_t>(1, U * S) : 1;
    z.hist = L * 256;
    z.pick = L;
    z.eqcnt = L * a.nt_s;
    z.selbits = U * a.W;
    z.sel = std::max<size_t>(1, U * a.sel_max);
    const size_t n_part = sparq_attend_parts(a);
    z.pstat = n_part > 1 ? U * n_part * g * 3 : 1;
    z.py = n_part > 1 ? U * n_part * g * a.dv : 1;
    return z;
}

template <int GMAX, typename TKT>
static void sparq_launch_approx(const sparq_cu_args & a, int cpt, sparq_stream_t stream) {
    const dim3 grid(a.nt_a, a.U);
    constexpr int VW = GMAX <= 4 ? 8 : (GMAX == 8 ? 4 : 2);
    if (cpt == VW) {
        SPARQ_LAUNCH((k_sparq_approx<GMAX, TKT, VW>), grid, SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH((k_sparq_approx<GMAX, TKT, 1>), grid, SPARQ_NT, stream, a);
    }
}

// stage 7: one block per unit, or n_part per unit and the combine
template <int GMAX, typename TK, typename TV>
static void sparq_launch_attend(const sparq_cu_args & a, int n_part, sparq_stream_t stream) {
    if (n_part == 1) {
        SPARQ_LAUNCH((k_sparq_attend<GMAX, TK, TV>), dim3(a.U), SPARQ_NT, stream, a);
        return;
    }
    SPARQ_LAUNCH((k_sparq_attend_part<GMAX, TK, TV>), dim3(n_part, a.U), SPARQ_NT, stream, a);
    SPARQ_LAUNCH((k_sparq_attend_combine<GMAX, TV>), dim3(a.U), SPARQ_NT, stream, a, n_part);
}

template <int GMAX>
static void sparq_launch_g(const sparq_cu_args & a, bool kt_f16, bool k_f16, bool v_f16, int cpt, int n_part,
                           sparq_stream_t stream) {
    if (n_part == 0) {
        if (kt_f16) {
            sparq_launch_approx<GMAX, half>(a, cpt, stream);
        } else {
            sparq_launch_approx<GMAX, float>(a, cpt, stream);
        }
        return;
    }
    if (k_f16 && v_f16) {
        sparq_launch_attend<GMAX, half, half>(a, n_part, stream);
    } else if (k_f16) {
        sparq_launch_attend<GMAX, half, float>(a, n_part, stream);
    } else if (v_f16) {
        sparq_launch_attend<GMAX, float, half>(a, n_part, stream);
    } else {
        sparq_launch_attend<GMAX, float, float>(a, n_part, stream);
    }
}

// n_part 0: stage 3 (the approximate scores); else stage 7 in n_part parts per unit
static void sparq_launch_by_g(const sparq_cu_args & a, bool kt_f16, bool k_f16, bool v_f16, int cpt, int n_part,
                              sparq_stream_t stream) {
    switch (sparq_gmax(a.g)) {
        case 1:  sparq_launch_g<1>(a, kt_f16, k_f16, v_f16, cpt, n_part, stream); break;
        case 2:  sparq_launch_g<2>(a, kt_f16, k_f16, v_f16, cpt, n_part, stream); break;
        case 4:  sparq_launch_g<4>(a, kt_f16, k_f16, v_f16, cpt, n_part, stream); break;
        case 8:  sparq_launch_g<8>(a, kt_f16, k_f16, v_f16, cpt, n_part, stream); break;
        default: sparq_launch_g<16>(a, kt_f16, k_f16, v_f16, cpt, n_part, stream); break;
    }
}

// Stages 5-6 in one kernel per list (k_sparq_select) for lists of at most this many selection
// tiles, where the ten launches of the radix chain cost more than one block reading the list five
// times; longer lists take the chain, whose tiles spread the reads over the whole GPU.
#define SPARQ_SELECT_FUSED_MAX_TILES 8

// LLAMA_SPARQ_CUDA_SELECT=fused or radix forces one way (comparisons, tests); unset: by the length
static bool sparq_select_fused(const sparq_cu_args & a) {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT", "fused", "radix");
    return force == 1 || (force == 0 && a.nt_s <= SPARQ_SELECT_FUSED_MAX_TILES);
}

// The whole op: a's shapes, tensors and scratch set (cpt: 1 or sparq_vec_cpt(sparq_gmax(g)), the
// K^T load width the rows' alignment allows; nt_a must match it; the scratch sized by
// sparq_cu_scratch_sizes, whose choice of parts sparq_attend_parts repeats).
static void sparq_cu_run(const sparq_cu_args & a, int cpt, bool kt_f16, bool k_f16, bool v_f16, sparq_stream_t stream) {
    const bool fused = sparq_select_fused(a);
    if (!fused) {
        SPARQ_MEMSET(a.hist, (size_t) a.L * 256 * sizeof(unsigned int), stream);
    }
    SPARQ_MEMSET(a.selbits, (size_t) a.U * a.W * sizeof(unsigned int), stream);

    SPARQ_MEMSET(a.rows, (size_t) a.R * sizeof(sparq_cu_row), stream);
    SPARQ_LAUNCH(k_sparq_count, dim3(std::max(1, (a.S + SPARQ_COUNT_TILE - 1) / SPARQ_COUNT_TILE), a.R), SPARQ_NT, stream, a);
    SPARQ_LAUNCH(k_sparq_rows, dim3(a.R), SPARQ_NT, stream, a);
    SPARQ_LAUNCH(k_sparq_components, dim3(a.U), SPARQ_NT, stream, a);
    sparq_launch_by_g(a, kt_f16, k_f16, v_f16, cpt, 0, stream);
    const dim3 gsel(a.nt_s, a.U), glist(a.nt_s, a.L);
    if (a.g > 1 && a.ph == 1) {
        SPARQ_LAUNCH(k_sparq_group_keys, gsel, SPARQ_NT, stream, a);
    }
    if (fused) {
        SPARQ_LAUNCH(k_sparq_select, dim3(a.L), SPARQ_NT, stream, a);
    } else {
        for (int shift = 24; shift >= 0; shift -= 8) {
            SPARQ_LAUNCH(k_sparq_hist, glist, SPARQ_NT, stream, a, shift);
            SPARQ_LAUNCH(k_sparq_pick, dim3(a.L), 32, stream, a, shift);
        }
        SPARQ_LAUNCH(k_sparq_eqcount, glist, SPARQ_NT, stream, a);
        SPARQ_LAUNCH(k_sparq_collect, glist, SPARQ_NT, stream, a);
    }
    sparq_launch_by_g(a, kt_f16, k_f16, v_f16, cpt, sparq_attend_parts(a), stream);
}
