// llama-sparq: the CPU driver's entry points (see sparq-cpu.h): the ISA choice, the scratch size,
// and sparq_cpu_compute, which runs the phases on every thread between barriers, wave by wave.
// The phases are in sparq-cpu-prepare.cpp, sparq-cpu-scores.cpp and sparq-cpu-attend.cpp, the
// selectors' parts in sparq-cpu-select-*.cpp.

#include "sparq-cpu-phases.h"

#include <cstdio>
#include <cstdlib>

using namespace sparq_cpu;

static_assert(sizeof(sparq_block_q8_0) == 34, "sparq_block_q8_0 must be ggml's block_q8_0 (an f16 and 32 int8, no padding)");

// ---------------------------------------------------------------------------
// ISA selection
// ---------------------------------------------------------------------------

static bool sparq_cpu_has(const char * what) {
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (strcmp(what, "avx2") == 0) {
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    if (strcmp(what, "avx512") == 0) {
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    }
#endif
#if defined(__aarch64__)
    if (strcmp(what, "neon") == 0) {
        return true; // Advanced SIMD is mandatory on AArch64
    }
#endif
    (void) what;
    return false;
}

const struct sparq_isa * sparq_isa_by_name(const char * name) {
    if (strcmp(name, "scalar") == 0) {
        return &sparq_isa_scalar;
    }
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(name, "avx2") == 0) {
        return sparq_cpu_has("avx2") ? &sparq_isa_avx2 : nullptr;
    }
    if (strcmp(name, "avx512") == 0) {
        return sparq_cpu_has("avx512") ? &sparq_isa_avx512 : nullptr;
    }
#endif
#if defined(__aarch64__)
    if (strcmp(name, "neon") == 0) {
        return &sparq_isa_neon;
    }
#endif
    return nullptr;
}

// Chosen once per process, from the environment variable GGML_SPARQ_ISA (read once):
//   unset, empty or "auto"   the best this CPU and build have: avx512, avx2, neon, scalar in turn
//   "scalar"                 the portable kernels (every build)
//   "avx2", "avx512"         x86-64 builds, when the CPU has the features (sparq_cpu_has)
//   "neon"                   AArch64 builds
// anything else, or an ISA this CPU/build lacks, aborts with a message (never a silent fallback).
// The op's worker threads call this concurrently on the first SparQ step, so the choice is a
// function-local static: C++11 initialises it exactly once, and every other caller waits for it
// (no data race on the pointer).
static const struct sparq_isa * sparq_isa_choose(void) {
    const char * env = getenv("GGML_SPARQ_ISA");
    const struct sparq_isa * isa = nullptr;
    if (env && *env && strcmp(env, "auto") != 0) {
        isa = sparq_isa_by_name(env);
        if (!isa) {
            fprintf(stderr, "sparq: GGML_SPARQ_ISA=%s is unknown or not supported by this CPU/build "
                            "(allowed: auto, scalar, avx2, avx512 on x86-64 with the CPU features, neon on AArch64)\n", env);
            abort();
        }
    } else {
        const char * order[] = { "avx512", "avx2", "neon", "scalar" };
        for (const char * n : order) {
            if ((isa = sparq_isa_by_name(n)) != nullptr) {
                break;
            }
        }
    }
    return isa;
}

const struct sparq_isa * sparq_isa_select(void) {
    static const struct sparq_isa * const chosen = sparq_isa_choose();
    return chosen;
}

// ---------------------------------------------------------------------------
// the op: units (stream, row, KV head) split over the threads, phases between barriers
// ---------------------------------------------------------------------------

int sparq_sel_max(const struct sparq_args * a0) {
    const sparq_args b = effective_args(a0);
    const int g = b.n_head_kv > 0 ? b.n_head / b.n_head_kv : 1;
    return b.per_head && g > 1 ? g * b.k : b.k;
}

size_t sparq_cpu_work_size(const struct sparq_args * a0, int nth) {
    const sparq_args b = effective_args(a0);
    return make_layout(&b, nth).total;
}

void sparq_cpu_compute(const struct sparq_args * a0, const struct sparq_isa * isa,
                       void * wdata, size_t wsize, int ith, int nth,
                       sparq_barrier_fn barrier, void * barrier_ctx) {
    const sparq_args b = effective_args(a0);
    const sparq_args * a = &b;
    ctx C;
    C.a = a;
    C.isa = isa;
    C.sel = &selector_of(a->selector);
    C.L = make_layout(a, nth);
    if (wsize < C.L.total) {
        fprintf(stderr, "sparq: work buffer of %zu bytes, %zu needed\n", wsize, C.L.total);
        abort();
    }
    C.base = (char *) (((uintptr_t) wdata + SPARQ_ALIGN - 1) & ~(uintptr_t) (SPARQ_ALIGN - 1));

    phase_components(C, ith, nth);
    barrier(barrier_ctx);
    phase_windows(C, ith, nth);
    barrier(barrier_ctx);
    for (int wb = 0; wb < C.L.n_units; wb += C.L.wave_units) {
        const int we = std::min(C.L.n_units, wb + C.L.wave_units);
        phase_scores(C, wb, we, ith);
        barrier(barrier_ctx);
        if (C.L.group_size > 1 && C.sel->ranks_scores) {
            phase_gqa_candidates(C, wb, we, ith);
            barrier(barrier_ctx);
        }
        phase_select(C, wb, we, ith, nth);
        phase_attend(C, wb, we, ith, nth);
        if (we < C.L.n_units) {
            barrier(barrier_ctx);
        }
    }
    if (C.sel->finish) {
        // every row has chosen and attended
        barrier(barrier_ctx);
        C.sel->finish(C, ith, nth);
    }
}
