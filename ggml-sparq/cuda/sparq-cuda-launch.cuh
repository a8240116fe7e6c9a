// llama-sparq: the launch sequence of GGML_OP_SPARQ_ATTN's CUDA kernels (the template choice per
// group size and cache type, the scratch sizes), shared by the CUDA backend and the CPU emulation.
// The includer's SPARQ_LAUNCH is the only way a kernel starts (the emulation counts them).
#pragma once

#include <type_traits>

#include "sparq-cuda-common.cuh"
#include "sparq-cuda-score.cuh"
#include "sparq-cuda-select-tile.cuh"
#include "sparq-cuda-attend.cuh"

static int sparq_gmax(int g) {
    return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : g <= 8 ? 8 : 16;
}

// the vector width of the K^T loads for a group size (cells per thread)
static constexpr int sparq_vec_cpt(int gmax) {
    return gmax <= 4 ? 8 : (gmax == 8 ? 4 : 2);
}

// The attention split over several blocks per unit (k_sparq_attend_part, whose last part to finish
// combines) while the units alone would leave the GPU idle: parts of at least
// SPARQ_ATTEND_PART_ITEMS of the list's bound, until about SPARQ_ATTEND_BLOCKS blocks in all (an H100
// has 132 SMs; 4 blocks of 256 threads each). One part: the one-block-per-unit kernel.
#define SPARQ_ATTEND_PART_ITEMS 32
#define SPARQ_ATTEND_BLOCKS     512

// the attend's parts per unit (items: the fewest of a list's positions per part)
static int sparq_attend_parts(const sparq_cu_args & a, int items = SPARQ_ATTEND_PART_ITEMS) {
    const int want = std::max(1, (a.sel_max + items - 1) / items);
    const int room = std::max(1, SPARQ_ATTEND_BLOCKS / std::max(1, a.U));
    return std::min(want, room);
}

// element counts of the scratch buffers (sparq_cu_args' scratch pointers), from the shapes only
struct sparq_cu_scratch {
    size_t rows, wbits, logits, tstat, tcnt, keys, hist, hmass, ldone, cand, ncand, bk, udone, selbits, sel, pstat, py;
    size_t report, lrep; // with a report (report: set a.report before the sizes)
};

// the sizes for the attend in n_part parts per unit
static sparq_cu_scratch sparq_pipeline_sizes(const sparq_cu_args & a, int n_part) {
    const size_t U = a.U, S = a.n_kv, g = a.g, L = a.L;
    sparq_cu_scratch z;
    z.rows = a.R;
    z.wbits = a.win ? (size_t) a.R * a.W : 1;
    z.logits = std::max<size_t>(1, U * g * S);
    z.tstat = U * a.nt_a * g;
    z.tcnt = U * a.nt_a;
    z.keys = a.g > 1 && a.ph == 1 ? std::max<size_t>(1, U * S) : 1;
    z.hist = L * SPARQ_NB;
    z.hmass = a.cov_p > 0.0f ? L * SPARQ_NB : 1;
    z.ldone = L;
    z.cand = a.cov_p > 0.0f ? 1 : L * a.nt_s * SPARQ_TILE_CAND;
    z.ncand = L;
    z.bk = a.buckets > 0 ? L * a.buckets : 1;
    z.udone = U;
    z.selbits = U * a.W;
    z.sel = std::max<size_t>(1, U * a.sel_max);
    z.pstat = n_part > 1 ? U * n_part * g * 3 : 1;
    z.py = n_part > 1 ? U * n_part * g * a.dv : 1;
    z.report = (size_t) a.n_stream * a.n_head_kv * 4;
    z.lrep = a.cov_p > 0.0f ? L * 2 : 1;
    return z;
}

// the launches' template choices: f(GMAX, ...) with each as a std::integral_constant (a value) or a
// sparq_cu_type (a type), so that one dispatch serves every kernel of a stage
template <int N> using sparq_cu_int = std::integral_constant<int, N>;
template <typename T> struct sparq_cu_type { using type = T; };

template <typename F>
static void sparq_with_gmax(int g, F && f) {
    switch (sparq_gmax(g)) {
        case 1:  f(sparq_cu_int<1>{}); break;
        case 2:  f(sparq_cu_int<2>{}); break;
        case 4:  f(sparq_cu_int<4>{}); break;
        case 8:  f(sparq_cu_int<8>{}); break;
        default: f(sparq_cu_int<16>{}); break;
    }
}

// f(GMAX, TKT, CPT) for kernel 1: K^T's element type (sparq_cu_kt) and load width (cpt: 1 or the
// group size's vector width)
template <typename F>
static void sparq_with_score_types(int g, int kt, int cpt, F && f) {
    sparq_with_gmax(g, [&](auto gm) {
        constexpr int VW = sparq_vec_cpt(decltype(gm)::value);
        const auto by_cpt = [&](auto t) {
            if (cpt == VW) {
                f(gm, t, sparq_cu_int<VW>{});
            } else {
                f(gm, t, sparq_cu_int<1>{});
            }
        };
        if (kt == SPARQ_CU_KT_F16) {
            by_cpt(sparq_cu_type<half>{});
        } else if (kt == SPARQ_CU_KT_E5M2) {
            by_cpt(sparq_cu_type<uint8_t>{});
        } else if (kt == SPARQ_CU_KT_KT4) {
            by_cpt(sparq_cu_type<sparq_cu_kt4>{});
        } else {
            by_cpt(sparq_cu_type<float>{});
        }
    });
}

// f(GMAX, TK, TV) for kernel 3: the K and V caches' types
template <typename F>
static void sparq_with_attend_types(int g, bool k_f16, bool v_f16, F && f) {
    sparq_with_gmax(g, [&](auto gm) {
        if (k_f16 && v_f16) {
            f(gm, sparq_cu_type<half>{}, sparq_cu_type<half>{});
        } else if (k_f16) {
            f(gm, sparq_cu_type<half>{}, sparq_cu_type<float>{});
        } else if (v_f16) {
            f(gm, sparq_cu_type<float>{}, sparq_cu_type<half>{});
        } else {
            f(gm, sparq_cu_type<float>{}, sparq_cu_type<float>{});
        }
    });
}

// The whole op in three launches, none of which waits on the host, each sized by the shapes only
// (a's shapes, tensors and scratch set; cpt: 1 or sparq_vec_cpt(sparq_gmax(g)), the K^T load width
// the rows' alignment allows, which nt_a and tl_a must match; the scratch sized by
// sparq_pipeline_sizes for sparq_attend_parts(a)):
//   1 k_sparq_score       (score tiles x units)     components, valid cells, approximate scores
//   2 k_sparq_select      (selection tiles x lists)  keys and histograms; each list's last tile chooses
//   3 k_sparq_attend[_part] (units, or parts x units) exact attention and the mean-V mix
// kt: K^T's element type (sparq_cu_kt)
static void sparq_pipeline_run(const sparq_cu_args & a, int cpt, int kt, bool k_f16, bool v_f16, sparq_stream_t stream) {
    sparq_with_score_types(a.g, kt, cpt, [&](auto gm, auto t, auto c) {
        SPARQ_LAUNCH((k_sparq_score<decltype(gm)::value, typename decltype(t)::type, decltype(c)::value>), dim3(a.nt_a, a.U),
                     SPARQ_NT, stream, a);
    });
    if (a.cov_p > 0.0f) {
        SPARQ_LAUNCH((k_sparq_select<true>), dim3(a.nt_s, a.L), SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH((k_sparq_select<false>), dim3(a.nt_s, a.L), SPARQ_NT, stream, a);
    }
    const int n_part = sparq_attend_parts(a);
    sparq_with_attend_types(a.g, k_f16, v_f16, [&](auto gm, auto tk, auto tv) {
        constexpr int GMAX = decltype(gm)::value;
        using TK = typename decltype(tk)::type;
        using TV = typename decltype(tv)::type;
        if (n_part == 1) {
            SPARQ_LAUNCH((k_sparq_attend<GMAX, TK, TV>), dim3(a.U), SPARQ_NT, stream, a);
        } else {
            SPARQ_LAUNCH((k_sparq_attend_part<GMAX, TK, TV>), dim3(n_part, a.U), SPARQ_NT, stream, a);
        }
    });
}
