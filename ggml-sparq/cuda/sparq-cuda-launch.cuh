// llama-sparq: the launch sequence of GGML_OP_SPARQ_ATTN's CUDA kernels (the template choice per
// group size and cache type, the scratch sizes), shared by the CUDA backend and the CPU emulation.
// The includer's SPARQ_LAUNCH (and SPARQ_LAUNCH_PDL, a programmatic dependent launch where the
// device has it) is the only way a kernel starts (the emulation counts them).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sparq-cuda-common.cuh"
#include "sparq-cuda-score.cuh"
#include "sparq-cuda-select-tile.cuh"
#include "sparq-cuda-attend.cuh"
#include "sparq-cuda-fused.cuh"

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

// LLAMA_SPARQ_CUDA_PDL=1 launches kernels 2 and 3 as programmatic dependent launches
// (SPARQ_LAUNCH_PDL; sm_90 and later, else an ordinary launch): each may be placed on the GPU while
// its predecessor's last blocks run, does what needs nothing of the predecessor (clearing shared
// memory, reading the query), then waits for the predecessor's completion (ggml_cuda_pdl_sync)
// before it reads any scratch. Off by default until a GPU has timed it and run the grid with it.
static bool sparq_pdl() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_PDL", "0", "1");
    return force == 2;
}

// a launch after another of the op's kernels: programmatic with pdl, else ordinary
#define SPARQ_LAUNCH_AFTER(pdl, kernel, grid, block, stream, ...)         \
    do {                                                                  \
        if (pdl) {                                                        \
            SPARQ_LAUNCH_PDL(kernel, grid, block, stream, __VA_ARGS__);   \
        } else {                                                          \
            SPARQ_LAUNCH(kernel, grid, block, stream, __VA_ARGS__);       \
        }                                                                 \
    } while (0)

// LLAMA_SPARQ_CUDA_SCORE_HIST=1: where a fixed k's lists are keyed by one head's logits (g == 1 or
// per-head choice), the score tiles count the histogram and keep the candidates
// (sparq_cu_args::score_hist), and the select is one block per list that reads no logit but the
// candidates' (the select tiles' pass over the logits was most of its time on an H200). The
// calibrated k stays on the select tiles: its histogram weighs each cell by its share of the
// softmax over all cells, which no score tile knows. Off by default until a GPU has timed it.
static bool sparq_score_hist_applies(const sparq_cu_args & a) {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_SCORE_HIST", "0", "1");
    return force == 2 && a.cov_p <= 0.0f && a.ph == a.g && a.buckets <= 0; // (buckets: the select tiles')
}

// LLAMA_SPARQ_CUDA_CALIB_HIST=1: where the calibrated k's lists are keyed by one head's logits (g ==
// 1 or per-head choice), the score tiles count the histogram and sum each bin's exp(x - the tile's
// maximum), and keep the cells of their best whole bins as candidates (sparq_cu_args::calib_hist);
// the select is one block per list that merges the tiles' bins into the list's mass histogram
// (each tile rescaled by exp(its maximum - M) / Z) and reads the candidates instead of the list's
// logits where its crossing bins lie among them. GQA's shared choice keeps the select tiles: its
// key, the group's sum of each head's softmax, needs every head's M and Z before any cell has a
// bin. Off by default until a GPU has timed it. (The bucketed top-k needs a fixed k: never here.)
static bool sparq_calib_hist_applies(const sparq_cu_args & a) {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_CALIB_HIST", "0", "1");
    return force == 2 && a.cov_p > 0.0f && a.ph == a.g && a.buckets <= 0;
}

// The attention split over several blocks per unit (k_sparq_attend_part, whose last part to finish
// combines) while the units alone would leave the GPU idle: parts of at least
// SPARQ_ATTEND_PART_ITEMS of the list's bound, until about SPARQ_ATTEND_BLOCKS blocks in all (an H100
// has 132 SMs; 4 blocks of 256 threads each). One part: the one-block-per-unit kernel.
#define SPARQ_ATTEND_PART_ITEMS 32
#define SPARQ_ATTEND_BLOCKS     512

// LLAMA_SPARQ_CUDA_ATTEND_ITEMS=N (1 to 1024) sets the positions per part in place of
// SPARQ_ATTEND_PART_ITEMS, so that a GPU session times other part sizes without a rebuild; another
// value is said on stderr and the default kept
static int sparq_attend_part_items() {
    static const int items = [] {
        const char * e = getenv("LLAMA_SPARQ_CUDA_ATTEND_ITEMS");
        if (!e || !*e) {
            return SPARQ_ATTEND_PART_ITEMS;
        }
        char * end = nullptr;
        const long v = strtol(e, &end, 10);
        if (*end != '\0' || v < 1 || v > 1024) {
            fprintf(stderr, "sparq_attn: LLAMA_SPARQ_CUDA_ATTEND_ITEMS=%s is not an integer in 1..1024: ignored, %d\n", e,
                    SPARQ_ATTEND_PART_ITEMS);
            return SPARQ_ATTEND_PART_ITEMS;
        }
        return (int) v;
    }();
    return items;
}

static int sparq_attend_force() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_ATTEND", "single", "split");
    return force;
}

// LLAMA_SPARQ_CUDA_ATTEND=single or split forces one way (comparisons, tests); split then takes a
// part per sparq_attend_part_items() positions of the list whatever the number of units. The parts a
// list's bound k calls for
static int sparq_attend_parts_k(const sparq_cu_args & a) {
    const int force = sparq_attend_force();
    if (force == 1) {
        return 1;
    }
    const int items = sparq_attend_part_items();
    const int want = std::max(1, (a.sel_max + items - 1) / items);
    const int room = force == 2 ? want : std::max(1, SPARQ_ATTEND_BLOCKS / std::max(1, a.U));
    return std::min(want, room);
}

// LLAMA_SPARQ_CUDA_DIFFUSE=1: the attend's all-cells units (dense rows, units the calibrated k found
// diffuse) stream contiguous ranges of cells with 16-byte K and V loads (sparq_cu_args::stream_dense)
// instead of the per-cell path (a K row by a warp 2 bytes per lane, V 8 positions per thread and
// round trip: 1422 us per layer at 64K on an H200 against flash attention's 243). Off by default
// until a GPU has timed it.
static bool sparq_attend_stream_on() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_DIFFUSE", "0", "1");
    return force == 2;
}

// cells per streamed part at least (a chunk of SPARQ_NT is one pass of the block)
#define SPARQ_ATTEND_STREAM_CELLS 512

// The attend's parts per unit. Which units attend over every cell is known on the device only, so
// with the stream on and units that may be all-cells at the bound k (the calibrated k's diffuse
// units; k >= S: every row dense) the launch takes the parts that S calls for where those are more
// than k's; a list's chosen cells still take k's parts (parts_k), the others record an empty
// partial. These launches run the attend's STREAM instantiation (more registers: the streamed path
// beside the list's); a fixed k below S keeps k's launch and the per-cell kernels, whose dense rows
// (dense streams beside SparQ ones, short sequences) keep the per-cell path.
static bool sparq_attend_stream_applies(const sparq_cu_args & a) {
    return sparq_attend_stream_on() && (a.cov_p > 0.0f || a.k >= a.n_kv);
}

static int sparq_attend_parts(const sparq_cu_args & a) {
    const int pk = sparq_attend_parts_k(a);
    const int force = sparq_attend_force();
    if (!sparq_attend_stream_applies(a) || force == 1) {
        return pk;
    }
    const int want = std::max(1, (a.n_kv + SPARQ_ATTEND_STREAM_CELLS - 1) / SPARQ_ATTEND_STREAM_CELLS);
    const int room = force == 2 ? want : std::max(1, SPARQ_ATTEND_BLOCKS / std::max(1, a.U));
    return std::max(pk, std::min(want, room));
}

// LLAMA_SPARQ_CUDA_FUSED=1: the whole op in one launch (k_sparq_fused) where it applies. Off by
// default until a GPU has timed it against the three launches.
static bool sparq_fused_on() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_FUSED", "0", "1");
    return force == 2;
}

// The one launch's longest sequence. Its unit's last block chooses and attends alone while the
// rest of the GPU idles, and what it reads grows with S (the score tiles' candidates, up to 512 per
// tile of 2048 cells; a pass over the list where a tile kept fewer than it found; the tiles'
// statistics per head); at 16K cells a unit has 8 score tiles, and from 32K on the three launches'
// many blocks per unit were about level with flash attention on an H200 already.
#define SPARQ_FUSED_MAX_KV 16384

// Where the one launch applies: the node carries the layer's tickets (the llama glue's; a graph
// without them, e.g. test-backend-ops', takes three launches) for every unit; a fixed k (lists keyed
// by one head's logits from the score tiles' candidates; GQA's shared choice from the last block's
// own pass over the unit's cells) without the bucketed top-k (its offers are gathered by the select
// tiles); S <= SPARQ_FUSED_MAX_KV;
// no streamed all-cells attend (LLAMA_SPARQ_CUDA_DIFFUSE with k >= S); f16 K and V (llama's caches),
// an f16 or 8-bit K^T read with the vector loads (fewer instantiations; the others take three launches).
// kt: K^T's element type (sparq_cu_kt). The caller sets sparq_cu_args::fused from it before the
// scratch's sizes.
static bool sparq_fused_applies(const sparq_cu_args & a, int kt, bool k_f16, bool v_f16) {
    return sparq_fused_on() && a.tickets != nullptr && a.U <= GGML_CUDA_SPARQ_TICKETS && a.cov_p <= 0.0f && a.buckets <= 0 &&
           a.n_kv <= SPARQ_FUSED_MAX_KV && !sparq_attend_stream_applies(a) && k_f16 && v_f16 && kt != SPARQ_CU_KT_F32 &&
           a.tl_a == SPARQ_NT * sparq_vec_cpt(sparq_gmax(a.g));
}

// whether every K and V row of the op's caches allows the streamed path's 16-byte loads
static bool sparq_attend_kv_vec(const sparq_cu_args & a, bool k_f16, bool v_f16) {
    const size_t ke = k_f16 ? 8 : 4, ve = v_f16 ? 8 : 4;
    const auto al = [](const void * p, size_t n1, size_t n2, size_t n3) {
        return (uintptr_t) p % 16 == 0 && n1 % 16 == 0 && n2 % 16 == 0 && n3 % 16 == 0;
    };
    return a.d % ke == 0 && a.dv % ve == 0 && al(a.K, a.K_nb1, a.K_nb2, a.K_nb3) && al(a.V, a.V_nb1, a.V_nb2, a.V_nb3);
}

// element counts of the scratch buffers (sparq_cu_args' scratch pointers), from the shapes only
struct sparq_cu_scratch {
    size_t rows, wbits, logits, tstat, tcnt, keys, hist, hmass, ldone, cand, ncand, bk, udone, udense, selbits, sel, pstat, py;
    size_t report, lrep; // with a report (report: set a.report before the sizes)
};

static sparq_cu_scratch sparq_cu_scratch_sizes(const sparq_cu_args & a) {
    const size_t U = a.U, S = a.n_kv, g = a.g, L = a.L;
    sparq_cu_scratch z;
    // (fused: a row description and a window bitmap per unit)
    z.rows = a.fused ? a.U : a.R;
    z.wbits = a.win ? (size_t) (a.fused ? a.U : a.R) * a.W : 1;
    z.logits = std::max<size_t>(1, U * g * S);
    z.tstat = U * a.nt_a * g;
    z.tcnt = U * a.nt_a;
    z.keys = a.g > 1 && a.ph == 1 ? std::max<size_t>(1, U * S) : 1;
    z.hist = L * SPARQ_NB;
    z.hmass = a.cov_p > 0.0f ? L * SPARQ_NB : 1;
    z.ldone = L;
    z.cand = a.cov_p > 0.0f ? 1 : L * a.nt_s * SPARQ_TILE_CAND;
    if (sparq_score_hist_applies(a) || a.fused) {
        z.cand = std::max(z.cand, L * a.nt_a * (1 + (size_t) sparq_score_cap(a)));
    }
    if (sparq_calib_hist_applies(a)) { // the candidates, then the tiles' bins
        z.cand = std::max(z.cand, L * a.nt_a * (1 + (size_t) sparq_score_cap(a) + 1 + (size_t) a.tl_a));
    }
    z.ncand = L;
    z.bk = a.buckets > 0 ? L * a.buckets : 1;
    z.udone = U;
    z.udense = U;
    z.selbits = U * a.W;
    z.sel = std::max<size_t>(1, U * a.sel_max);
    const size_t n_part = a.fused ? 1 : sparq_attend_parts(a);
    z.pstat = n_part > 1 ? U * n_part * g * 3 : 1;
    z.py = n_part > 1 ? U * n_part * g * a.dv : 1;
    z.report = (size_t) a.n_stream * a.n_head_kv * 4;
    z.lrep = a.cov_p > 0.0f ? L * 2 : 1;
    return z;
}

// kernel 1: the scores (CPT: the K^T load width)
template <int GMAX, typename TKT>
static void sparq_launch_score(const sparq_cu_args & a, int cpt, sparq_stream_t stream) {
    const dim3 grid(a.nt_a, a.U);
    constexpr int VW = GMAX <= 4 ? 8 : (GMAX == 8 ? 4 : 2);
    if (a.calib_hist) {
        if (cpt == VW) {
            SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, VW, true, true>), grid, SPARQ_NT, stream, a);
        } else {
            SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, 1, true, true>), grid, SPARQ_NT, stream, a);
        }
    } else if (cpt == VW) {
        if (a.score_hist) {
            SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, VW, true>), grid, SPARQ_NT, stream, a);
        } else {
            SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, VW, false>), grid, SPARQ_NT, stream, a);
        }
    } else if (a.score_hist) {
        SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, 1, true>), grid, SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, 1, false>), grid, SPARQ_NT, stream, a);
    }
}

// kernel 3: one block per unit, or n_part per unit (the last of them combines)
template <int GMAX, typename TK, typename TV>
static void sparq_launch_attend(const sparq_cu_args & a, int n_part, sparq_stream_t stream) {
    const bool pdl = sparq_pdl();
    if (a.stream_dense) {
        if (n_part == 1) {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend<GMAX, TK, TV, true>), dim3(a.U), SPARQ_NT, stream, a);
        } else {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend_part<GMAX, TK, TV, true>), dim3(n_part, a.U), SPARQ_NT, stream, a);
        }
    } else if (n_part == 1) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend<GMAX, TK, TV, false>), dim3(a.U), SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend_part<GMAX, TK, TV, false>), dim3(n_part, a.U), SPARQ_NT, stream, a);
    }
}

template <int GMAX>
static void sparq_launch_g(const sparq_cu_args & a, int kt, bool k_f16, bool v_f16, int cpt, int n_part,
                           sparq_stream_t stream) {
    if (n_part == 0) {
        if (kt == SPARQ_CU_KT_F16) {
            sparq_launch_score<GMAX, half>(a, cpt, stream);
        } else if (kt == SPARQ_CU_KT_E5M2) {
            sparq_launch_score<GMAX, uint8_t>(a, cpt, stream);
        } else {
            sparq_launch_score<GMAX, float>(a, cpt, stream);
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

// the one launch (sparq_fused_applies: f16 K and V, the vector K^T loads; SHARED: GQA's shared choice)
template <int GMAX, bool SHARED>
static void sparq_launch_fused(const sparq_cu_args & a, int kt, sparq_stream_t stream) {
    constexpr int VW = GMAX <= 4 ? 8 : (GMAX == 8 ? 4 : 2);
    const dim3 grid(a.nt_a, a.U);
    if (kt == SPARQ_CU_KT_F16) {
        SPARQ_LAUNCH((k_sparq_fused<GMAX, half, VW, half, half, SHARED>), grid, SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH((k_sparq_fused<GMAX, uint8_t, VW, half, half, SHARED>), grid, SPARQ_NT, stream, a);
    }
}

template <int GMAX>
static void sparq_launch_fused_g(const sparq_cu_args & a, int kt, sparq_stream_t stream) {
    if (a.ph == a.g) {
        sparq_launch_fused<GMAX, false>(a, kt, stream);
    } else {
        sparq_launch_fused<GMAX, true>(a, kt, stream);
    }
}

// n_part 0: kernel 1 (the scores); else kernel 3 in n_part parts per unit
static void sparq_launch_by_g(const sparq_cu_args & a, int kt, bool k_f16, bool v_f16, int cpt, int n_part,
                              sparq_stream_t stream) {
    switch (sparq_gmax(a.g)) {
        case 1:  sparq_launch_g<1>(a, kt, k_f16, v_f16, cpt, n_part, stream); break;
        case 2:  sparq_launch_g<2>(a, kt, k_f16, v_f16, cpt, n_part, stream); break;
        case 4:  sparq_launch_g<4>(a, kt, k_f16, v_f16, cpt, n_part, stream); break;
        case 8:  sparq_launch_g<8>(a, kt, k_f16, v_f16, cpt, n_part, stream); break;
        default: sparq_launch_g<16>(a, kt, k_f16, v_f16, cpt, n_part, stream); break;
    }
}

// LLAMA_SPARQ_CUDA_SELECT=radix makes the selection take radix passes over the list even where the
// bin at the k-th key holds few enough cells to rank them in shared memory (comparisons, tests)
static int sparq_select_radix_forced() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT", "rank", "radix");
    return force == 2;
}

// LLAMA_SPARQ_CUDA_SELECT_HIST=atomic makes the selection tiles count their histogram with one
// shared-memory add per cell instead of one per distinct bin of a warp after __match_any_sync (the
// vote was 18 % of the select's samples on an H200; which way is faster is for a GPU to say)
static int sparq_select_hist_atomic() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT_HIST", "match", "atomic");
    return force == 2;
}

// LLAMA_SPARQ_CUDA_SELECT_LOADS=early issues a selection tile's key loads before the list's context
// (the valid cells' count and scan, the tail window), so that those round trips and the loads wait
// together (the first use of the keys was 16 % of the select's samples on an H200)
static int sparq_select_keys_early() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT_LOADS", "late", "early");
    return force == 2;
}

// The whole op in three launches, none of which waits on the host, each sized by the shapes only
// (a's shapes, tensors and scratch set; cpt: 1 or sparq_vec_cpt(sparq_gmax(g)), the K^T load width
// the rows' alignment allows, which nt_a and tl_a must match; the scratch sized by
// sparq_cu_scratch_sizes, whose choice of parts sparq_attend_parts repeats; with sparq_pdl() 2 and
// 3 programmatic dependent launches):
//   1 k_sparq_score       (score tiles x units)     components, valid cells, approximate scores
//   2 k_sparq_select      (selection tiles x lists)  keys and histograms; each list's last tile chooses
//                         (score_hist, calib_hist: one block per list, from the score tiles' candidates
//                         and, for the calibrated k, their bins' masses)
//   3 k_sparq_attend[_part] (units, or parts x units) exact attention and the mean-V mix
// kt: K^T's element type (sparq_cu_kt)
// With a0.fused (the caller's sparq_fused_applies) one launch instead: k_sparq_fused (score tiles x
// units), whose last block per unit chooses and attends.
static void sparq_cu_run(const sparq_cu_args & a0, int cpt, int kt, bool k_f16, bool v_f16, sparq_stream_t stream) {
    sparq_cu_args a = a0;
    if (a.fused) {
        a.score_hist = a.ph == a.g; // (the score tiles keep candidates for lists of one head)
        a.stream_dense = 0;
        a.kv_vec = 0;
        a.parts_k = 1;
        switch (sparq_gmax(a.g)) {
            case 1:  sparq_launch_fused<1, false>(a, kt, stream); break; // (g == 1: ph == g)
            case 2:  sparq_launch_fused_g<2>(a, kt, stream); break;
            case 4:  sparq_launch_fused_g<4>(a, kt, stream); break;
            case 8:  sparq_launch_fused_g<8>(a, kt, stream); break;
            default: sparq_launch_fused_g<16>(a, kt, stream); break;
        }
        return;
    }
    a.score_hist = sparq_score_hist_applies(a);
    a.calib_hist = sparq_calib_hist_applies(a);
    a.stream_dense = sparq_attend_stream_applies(a);
    a.kv_vec = a.stream_dense && sparq_attend_kv_vec(a, k_f16, v_f16);
    a.parts_k = sparq_attend_parts_k(a);
    sparq_launch_by_g(a, kt, k_f16, v_f16, cpt, 0, stream);
    const bool pdl = sparq_pdl();
    if (a.calib_hist) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select<true, true>), dim3(1, a.L), SPARQ_NT, stream, a);
    } else if (a.cov_p > 0.0f) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select<true, false>), dim3(a.nt_s, a.L), SPARQ_NT, stream, a);
    } else if (a.score_hist) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select<false, true>), dim3(1, a.L), SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select<false, false>), dim3(a.nt_s, a.L), SPARQ_NT, stream, a);
    }
    sparq_launch_by_g(a, kt, k_f16, v_f16, cpt, sparq_attend_parts(a), stream);
}
