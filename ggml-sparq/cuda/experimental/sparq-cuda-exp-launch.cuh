// llama-sparq, experimental build only (SPARQ_CUDA_EXPERIMENTAL, the CMake option
// LLAMA_SPARQ_CUDA_EXPERIMENTAL): the op's launch with the variants that no GPU has timed yet, each
// behind its LLAMA_SPARQ_CUDA_* switch (docs/development.md), read once per process, and the test
// hooks that force a choice the launch makes by itself. With no switch set, sparq_cu_run runs the
// default pipeline (sparq_pipeline_run), the default build's kernels. Included by
// sparq-cuda-kernels.cuh, which takes sparq_cu_scratch_sizes and sparq_cu_run from here; the
// includer also provides SPARQ_LAUNCH_PDL (a programmatic dependent launch where the device has
// them, else an ordinary one).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sparq-cuda-launch.cuh"
#include "sparq-cuda-exp-args.cuh"
#include "sparq-cuda-exp-score.cuh"
#include "sparq-cuda-exp-select.cuh"
#include "sparq-cuda-exp-attend.cuh"
#include "sparq-cuda-exp-fused.cuh"

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
// before it reads any scratch.
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
// (k_sparq_score_hist), and the select is one block per list that reads no logit but the
// candidates' (k_sparq_select_scored; the select tiles' pass over the logits was most of its time
// on an H200). The calibrated k stays on the select tiles: its histogram weighs each cell by its
// share of the softmax over all cells, which no score tile knows.
static bool sparq_score_hist_applies(const sparq_cu_args & a) {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_SCORE_HIST", "0", "1");
    return force == 2 && a.cov_p <= 0.0f && a.ph == a.g && a.buckets <= 0; // (buckets: the select tiles')
}

// LLAMA_SPARQ_CUDA_CALIB_HIST=1: where the calibrated k's lists are keyed by one head's logits (g ==
// 1 or per-head choice), the score tiles count the histogram and sum each bin's exp(x - the tile's
// maximum), and keep the cells of their best whole bins as candidates; the select is one block per
// list that merges the tiles' bins into the list's mass histogram (each tile rescaled by exp(its
// maximum - M) / Z) and reads the candidates instead of the list's logits where its crossing bins
// lie among them. GQA's shared choice keeps the select tiles: its key, the group's sum of each
// head's softmax, needs every head's M and Z before any cell has a bin. (The bucketed top-k needs a
// fixed k: never here.)
static bool sparq_calib_hist_applies(const sparq_cu_args & a) {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_CALIB_HIST", "0", "1");
    return force == 2 && a.cov_p > 0.0f && a.ph == a.g && a.buckets <= 0;
}

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
// list's bound k calls for (sparq_attend_parts with neither set)
static int sparq_attend_parts_k(const sparq_cu_args & a) {
    const int force = sparq_attend_force();
    const int items = sparq_attend_part_items();
    if (force == 1) {
        return 1;
    }
    return force == 2 ? std::max(1, (a.sel_max + items - 1) / items) : sparq_attend_parts(a, items);
}

// LLAMA_SPARQ_CUDA_DIFFUSE=1: the attend's all-cells units (dense rows) stream contiguous ranges of
// cells with 16-byte K and V loads (sparq-cuda-exp-attend.cuh) instead of the per-cell path (a K row
// by a warp 2 bytes per lane, V 8 positions per thread and round trip: 1422 us per layer at 64K on
// an H200 against flash attention's 243).
static bool sparq_attend_stream_on() {
    static const int force = sparq_env_way("LLAMA_SPARQ_CUDA_DIFFUSE", "0", "1");
    return force == 2;
}

// cells per streamed part at least (a chunk of SPARQ_NT is one pass of the block)
#define SPARQ_ATTEND_STREAM_CELLS 512

// The attend's parts per unit. With the stream on and every row dense (k >= S) the launch takes the
// parts that S calls for where those are more than k's; a list's chosen cells still take k's parts
// (parts_k), the others record an empty partial. These launches run the streamed kernels (more
// registers: the streamed path beside the list's); a k below S keeps the default kernels, whose
// dense rows (dense streams beside SparQ ones, short sequences) keep the per-cell path.
static bool sparq_attend_stream_applies(const sparq_cu_args & a) {
    return sparq_attend_stream_on() && a.k >= a.n_kv;
}

static int sparq_exp_attend_parts(const sparq_cu_args & a) {
    const int pk = sparq_attend_parts_k(a);
    const int force = sparq_attend_force();
    if (!sparq_attend_stream_applies(a) || force == 1) {
        return pk;
    }
    const int want = std::max(1, (a.n_kv + SPARQ_ATTEND_STREAM_CELLS - 1) / SPARQ_ATTEND_STREAM_CELLS);
    const int room = force == 2 ? want : std::max(1, SPARQ_ATTEND_BLOCKS / std::max(1, a.U));
    return std::max(pk, std::min(want, room));
}

// whether every K and V row of the op's caches allows the streamed path's 16-byte loads
static bool sparq_attend_kv_vec(const sparq_cu_args & a, bool k_f16, bool v_f16) {
    const size_t ke = k_f16 ? 8 : 4, ve = v_f16 ? 8 : 4;
    const auto al = [](const void * p, size_t n1, size_t n2, size_t n3) {
        return (uintptr_t) p % 16 == 0 && n1 % 16 == 0 && n2 % 16 == 0 && n3 % 16 == 0;
    };
    return a.d % ke == 0 && a.dv % ve == 0 && al(a.K, a.K_nb1, a.K_nb2, a.K_nb3) && al(a.V, a.V_nb1, a.V_nb2, a.V_nb3);
}

// LLAMA_SPARQ_CUDA_FUSED=1: the whole op in one launch (k_sparq_fused) where it applies.
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

// Where the one launch applies: the node carries the layer's tickets (a.tickets, the llama glue's; a
// graph without them, e.g. test-backend-ops', takes three launches) for every unit; a fixed k (lists
// keyed by one head's logits from the score tiles' candidates; GQA's shared choice from the last
// block's own pass over the unit's cells) without the bucketed top-k (its offers are gathered by the
// select tiles); S <= SPARQ_FUSED_MAX_KV; no streamed all-cells attend (LLAMA_SPARQ_CUDA_DIFFUSE with
// k >= S); f16 K and V (llama's caches), an f16 or 8-bit K^T read with the vector loads (fewer
// instantiations; the others take three launches). kt: K^T's element type (sparq_cu_kt). The caller
// keeps a.tickets only where it applies, before the scratch's sizes: the one launch runs where
// a.tickets is set.
static bool sparq_fused_applies(const sparq_cu_args & a, int kt, bool k_f16, bool v_f16) {
    return sparq_fused_on() && a.tickets != nullptr && a.U <= GGML_CUDA_SPARQ_TICKETS && a.cov_p <= 0.0f && a.buckets <= 0 &&
           a.n_kv <= SPARQ_FUSED_MAX_KV && !sparq_attend_stream_applies(a) && k_f16 && v_f16 && kt != SPARQ_CU_KT_F32 &&
           a.tl_a == SPARQ_NT * sparq_vec_cpt(sparq_gmax(a.g));
}

// The select tiles' ways, each 1 (the default way, set), 2 (the other) or 0 (unset). Where any is
// set the tiles run k_sparq_select_way, so that a switch's two ways are timed in one kernel (the
// default kernel, without their branches, has registers of its own).
// LLAMA_SPARQ_CUDA_SELECT=radix makes the selection take radix passes over the list even where the
// bin at the k-th key holds few enough cells to rank them in shared memory (comparisons, tests)
static int sparq_select_radix_way() {
    static const int way = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT", "rank", "radix");
    return way;
}

// LLAMA_SPARQ_CUDA_SELECT_HIST=atomic makes the selection tiles count their histogram with one
// shared-memory add per cell instead of one per distinct bin of a warp after __match_any_sync (the
// vote was 18 % of the select's samples on an H200; which way is faster is for a GPU to say)
static int sparq_select_hist_way() {
    static const int way = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT_HIST", "match", "atomic");
    return way;
}

// LLAMA_SPARQ_CUDA_SELECT_LOADS=early issues a selection tile's key loads before the list's context
// (the valid cells' count and scan, the tail window), so that those round trips and the loads wait
// together (the first use of the keys was 16 % of the select's samples on an H200)
static int sparq_select_loads_way() {
    static const int way = sparq_env_way("LLAMA_SPARQ_CUDA_SELECT_LOADS", "late", "early");
    return way;
}

// a's launch with the switches: the select tiles' ways, the one launch where a.tickets is set, the
// streamed attend's loads and parts
static sparq_exp_args sparq_exp_args_of(const sparq_cu_args & a, bool k_f16, bool v_f16) {
    sparq_exp_args e;
    static_cast<sparq_cu_args &>(e) = a;
    e.force_radix = sparq_select_radix_way() == 2;
    e.hist_atomic = sparq_select_hist_way() == 2;
    e.keys_early = sparq_select_loads_way() == 2;
    e.fused = a.tickets != nullptr;
    const bool stream = !e.fused && sparq_attend_stream_applies(a);
    e.kv_vec = stream && sparq_attend_kv_vec(a, k_f16, v_f16);
    e.parts_k = e.fused ? 1 : sparq_attend_parts_k(a);
    return e;
}

// the scratch's element counts (sparq_pipeline_sizes with the variants' parts, rows and candidates)
static sparq_cu_scratch sparq_cu_scratch_sizes(const sparq_cu_args & a) {
    const bool fused = a.tickets != nullptr;
    sparq_cu_scratch z = sparq_pipeline_sizes(a, fused ? 1 : sparq_exp_attend_parts(a));
    if (fused) { // a row description and a window bitmap per unit
        z.rows = a.U;
        z.wbits = a.win ? (size_t) a.U * a.W : 1;
    }
    const size_t L = a.L;
    if (sparq_score_hist_applies(a) || fused) {
        z.cand = std::max(z.cand, L * a.nt_a * (1 + (size_t) sparq_score_cap(a)));
    }
    if (sparq_calib_hist_applies(a)) { // the candidates, then the tiles' bins
        z.cand = std::max(z.cand, L * a.nt_a * (1 + (size_t) sparq_score_cap(a) + 1 + (size_t) a.tl_a));
    }
    return z;
}

// the one launch (sparq_fused_applies: f16 K and V, the vector K^T loads; GQA's shared choice its own
// instantiation, SHARED)
static void sparq_launch_fused(const sparq_exp_args & a, int kt, sparq_stream_t stream) {
    sparq_with_gmax(a.g, [&](auto gm) {
        constexpr int GMAX = decltype(gm)::value;
        constexpr int VW = sparq_vec_cpt(GMAX);
        const dim3 grid(a.nt_a, a.U);
        const auto launch = [&](auto shared) {
            constexpr bool SHARED = decltype(shared)::value;
            if (kt == SPARQ_CU_KT_F16) {
                SPARQ_LAUNCH((k_sparq_fused<GMAX, half, VW, half, half, SHARED>), grid, SPARQ_NT, stream, a);
            } else {
                SPARQ_LAUNCH((k_sparq_fused<GMAX, uint8_t, VW, half, half, SHARED>), grid, SPARQ_NT, stream, a);
            }
        };
        if constexpr (GMAX == 1) {
            launch(std::false_type{}); // (g == 1: ph == g)
        } else if (a.ph == a.g) {
            launch(std::false_type{});
        } else {
            launch(std::true_type{});
        }
    });
}

// The op's launch: sparq_pipeline_run's three kernels, each replaced by its variant where a switch
// applies, kernels 2 and 3 programmatic dependent launches with LLAMA_SPARQ_CUDA_PDL=1:
//   1 k_sparq_score_hist   (score_hist, calib_hist) the score tiles also keep each list's candidates
//   2 k_sparq_select_scored (score_hist, calib_hist: 1 x lists) one block per list from those
//     k_sparq_select_way  (SELECT, SELECT_HIST, SELECT_LOADS set) the select tiles' ways
//   3 k_sparq_attend_stream[_part] (DIFFUSE, where units may be all-cells) the streamed attend
// With a.tickets set (the caller's sparq_fused_applies) one launch instead: k_sparq_fused (score
// tiles x units), whose last block per unit chooses and attends.
static void sparq_cu_run(const sparq_cu_args & a0, int cpt, int kt, bool k_f16, bool v_f16, sparq_stream_t stream) {
    const sparq_exp_args a = sparq_exp_args_of(a0, k_f16, v_f16);
    if (a.fused) {
        sparq_launch_fused(a, kt, stream);
        return;
    }
    const sparq_cu_args & b = a; // (the default kernels' arguments)
    const bool pdl = sparq_pdl();
    const bool score_hist = sparq_score_hist_applies(a), calib_hist = sparq_calib_hist_applies(a);
    const bool way = sparq_select_radix_way() || sparq_select_hist_way() || sparq_select_loads_way();
    const int n_part = sparq_exp_attend_parts(a);
    const bool streamed = sparq_attend_stream_applies(a);
    if (!pdl && !score_hist && !calib_hist && !way && !streamed && n_part == sparq_attend_parts(a)) {
        sparq_pipeline_run(b, cpt, kt, k_f16, v_f16, stream); // no switch changes a launch
        return;
    }
    sparq_with_score_types(a.g, kt, cpt, [&](auto gm, auto t, auto c) {
        constexpr int GMAX = decltype(gm)::value, CPT = decltype(c)::value;
        using TKT = typename decltype(t)::type;
        if (calib_hist) {
            SPARQ_LAUNCH((k_sparq_score_hist<GMAX, TKT, CPT, true>), dim3(a.nt_a, a.U), SPARQ_NT, stream, b);
        } else if (score_hist) {
            SPARQ_LAUNCH((k_sparq_score_hist<GMAX, TKT, CPT, false>), dim3(a.nt_a, a.U), SPARQ_NT, stream, b);
        } else {
            SPARQ_LAUNCH((k_sparq_score<GMAX, TKT, CPT>), dim3(a.nt_a, a.U), SPARQ_NT, stream, b);
        }
    });
    if (calib_hist) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select_scored<true>), dim3(1, a.L), SPARQ_NT, stream, a);
    } else if (score_hist) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select_scored<false>), dim3(1, a.L), SPARQ_NT, stream, a);
    } else if (a.cov_p > 0.0f) {
        if (way) {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select_way<true>), dim3(a.nt_s, a.L), SPARQ_NT, stream, a);
        } else {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select<true>), dim3(a.nt_s, a.L), SPARQ_NT, stream, b);
        }
    } else if (way) {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select_way<false>), dim3(a.nt_s, a.L), SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH_AFTER(pdl, (k_sparq_select<false>), dim3(a.nt_s, a.L), SPARQ_NT, stream, b);
    }
    sparq_with_attend_types(a.g, k_f16, v_f16, [&](auto gm, auto tk, auto tv) {
        constexpr int GMAX = decltype(gm)::value;
        using TK = typename decltype(tk)::type;
        using TV = typename decltype(tv)::type;
        if (streamed && n_part == 1) {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend_stream<GMAX, TK, TV>), dim3(a.U), SPARQ_NT, stream, a);
        } else if (streamed) {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend_stream_part<GMAX, TK, TV>), dim3(n_part, a.U), SPARQ_NT, stream, a);
        } else if (n_part == 1) {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend<GMAX, TK, TV>), dim3(a.U), SPARQ_NT, stream, b);
        } else {
            SPARQ_LAUNCH_AFTER(pdl, (k_sparq_attend_part<GMAX, TK, TV>), dim3(n_part, a.U), SPARQ_NT, stream, b);
        }
    });
}
