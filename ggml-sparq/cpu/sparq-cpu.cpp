// llama-sparq: the ISA-independent part of the CPU SparQ kernel (see sparq-cpu.h).

#include "sparq-cpu.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// ---------------------------------------------------------------------------
// half <-> float (IEEE binary16), portable
// ---------------------------------------------------------------------------

float sparq_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    uint32_t exp  = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {                 // inf / nan
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {             // normal
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {            // zero
        bits = sign;
    } else {                           // subnormal: normalise
        exp = 113;
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t sparq_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {                       // inf / nan
        return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0);
    }
    if (ax >= 0x477ff000u) {                       // rounds to >= 65520: inf
        return sign | 0x7c00u;
    }
    if (ax < 0x38800000u) {                        // subnormal or zero in half
        if (ax < 0x33000000u) {
            return sign;                           // below half of the smallest subnormal
        }
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;            // 14..24
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) {
            h++;
        }
        return sign | (uint16_t) h;
    }
    uint32_t h = ((ax >> 13) - (112u << 10));      // rebias exponent
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;
    }
    return sign | (uint16_t) h;
}

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

// Chosen once per process. The op's worker threads call this concurrently on the first
// SparQ step, so the choice is a function-local static: C++11 initialises it exactly once,
// and every other caller waits for it (no data race on the pointer).
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
// scratch layout
// ---------------------------------------------------------------------------

namespace {

constexpr int    SPARQ_BLOCK_MAX = 1024;              // cells per approximate-score block (g == 1)
constexpr size_t SPARQ_ALIGN     = 64;
constexpr size_t SPARQ_LOGIT_CAP = (size_t) 64 << 20; // bytes of GQA logits kept at once

struct cand { float key; int32_t idx; };

struct cand_greater {
    bool operator()(const cand & a, const cand & b) const {
        return a.key > b.key || (a.key == b.key && a.idx < b.idx);
    }
};

static size_t align_up(size_t x) { return (x + SPARQ_ALIGN - 1) & ~(SPARQ_ALIGN - 1); }

// per query row: valid cells, the local window (its size, its cells ascending in the
// row's window list, and w0: the start of the window when it is the tail of the cells)
struct row_info { int32_t n_valid; int32_t w0; int32_t n_win; int32_t dense_all; };

struct layout {
    int U, R, g, nc, cap, wave, B;
    int wcap;       // entries of a row's window list: l, or k with the streaming selector (window + sinks)
    int ph;         // selection lists per unit: g with per-head selection (g > 1), else 1
    int sel_max;    // cells a unit's selection can hold
    int chunk_max;
    size_t off_mask, off_cnt, off_row, off_win, off_i1, off_qs, off_stat, off_ccount, off_cand, off_logit, off_thread;
    size_t off_h2o; // H2O: per thread, the attention weights of its rows per (stream, KV head, cell)
    size_t off_ivf; // index: per unit, the group's summed query (d), the lists' |c|^2 and probe flags (n_list each)
    size_t off_ivf_n; // index: per unit of the wave and chunk, the key rows scored
    // per-thread area: offsets from the thread's base
    size_t t_blk, t_ck, t_idx, t_gm, t_big, t_merge, t_sel, t_ex, t_vec, t_gh, t_rows, t_ivf, t_pc;
    size_t thread_bytes, total;
};

static int sparq_cap(const sparq_args * a) { return std::max(16, 4 * a->k); }

// the selectors that rank no approximate scores (no K^T, no mean-V, one choice per KV head)
static bool sel_baseline(const sparq_args * a) {
    return a->selector == SPARQ_SEL_STREAMING || a->selector == SPARQ_SEL_H2O || a->selector == SPARQ_SEL_INDEX;
}

// the arguments a selector actually runs with: the oracle is SparQ with every component; the
// baselines have no approximate scores (no components, no mean-V) and one choice per group
static sparq_args effective_args(const sparq_args * a) {
    sparq_args b = *a;
    if (b.selector == SPARQ_SEL_ORACLE) {
        b.r = b.d;
    }
    if (sel_baseline(&b)) {
        b.r = 1;
        b.no_mean_v = 1;
        b.per_head = b.selector == SPARQ_SEL_INDEX ? b.per_head : 0; // the index can search per query head
        b.q_sel = nullptr;
        b.comp_w = nullptr;
    }
    return b;
}

// index: per unit, a query per search (the group's sum, or each head's), the lists' |c|^2, per
// search its probe flags, and the flags of the lists any search probes (int32, list_gather's table)
static size_t ivf_unit_floats(const sparq_args * a, int ph) {
    return (size_t) ph * a->d + a->ivf_n_list + (size_t) ph * a->ivf_n_list + a->ivf_n_list;
}

static layout make_layout(const sparq_args * a, int nth) {
    layout L{};
    L.R   = a->n_stream * a->n_rows;
    L.U   = L.R * a->n_head_kv;
    L.g   = a->n_head / a->n_head_kv;
    L.nc  = nth;
    L.cap = sparq_cap(a);
    L.ph  = a->per_head && L.g > 1 ? L.g : 1;
    L.wcap = a->selector == SPARQ_SEL_STREAMING ? a->k : a->l;
    L.sel_max = L.ph * a->k;
    // block of cells whose g rows of scores stay in L1/L2 while the r rows of K^T stream through
    L.B   = std::max(256, std::min(SPARQ_BLOCK_MAX, (4096 / L.g) & ~31));
    const size_t S = (size_t) a->n_kv;
    if (L.g == 1) {
        L.wave = L.U;
    } else {
        const size_t per_unit = (size_t) L.g * S * sizeof(float);
        L.wave = (int) std::max<size_t>(1, std::min<size_t>(L.U, SPARQ_LOGIT_CAP / std::max<size_t>(per_unit, 1)));
    }
    size_t o = 0;
    L.off_mask   = o; o += align_up((a->mask && a->mask_type == SPARQ_F16) ? (size_t) L.R * S * sizeof(float) : 0);
    L.off_cnt    = o; o += align_up((size_t) L.R * L.nc * sizeof(int32_t));
    L.off_row    = o; o += align_up((size_t) L.R * sizeof(row_info));
    L.off_win    = o; o += align_up((size_t) L.R * (L.wcap + 1) * sizeof(int32_t));
    L.off_i1     = o; o += align_up((size_t) L.U * a->r * sizeof(int32_t));
    L.off_qs     = o; o += align_up((size_t) L.U * L.g * a->r * sizeof(float));
    L.off_stat   = o; o += align_up((size_t) L.wave * L.nc * L.g * 2 * sizeof(float));
    L.off_ccount = o; o += align_up((size_t) L.wave * L.nc * L.ph * sizeof(int32_t));
    L.off_cand   = o; o += align_up((size_t) L.wave * L.nc * L.ph * L.cap * sizeof(cand));
    L.off_logit  = o; o += align_up(L.g > 1 && !sel_baseline(a) ? (size_t) L.wave * L.g * S * sizeof(float) : 0);
    L.off_h2o    = o; o += align_up(a->selector == SPARQ_SEL_H2O ? (size_t) nth * a->n_stream * a->n_head_kv * S * sizeof(float) : 0);
    L.off_ivf    = o; o += align_up(a->selector == SPARQ_SEL_INDEX ? (size_t) L.U * ivf_unit_floats(a, L.ph) * sizeof(float) : 0);
    L.off_ivf_n  = o; o += align_up(a->selector == SPARQ_SEL_INDEX ? (size_t) L.wave * L.nc * sizeof(int32_t) : 0);
    // per thread: g x B approximate scores of a block, the chunk's keys, filter indices,
    // group maxima, the tie fallback buffer, the merge buffer, the selection, exact
    // logits, and y / vbar / a K row (phase A: |q| and an order)
    const int dmax = std::max(a->d, a->dv);
    L.chunk_max = (int) ((S + nth - 1) / nth) + 1;
    size_t t = 0;
    L.t_blk   = t; t += align_up((size_t) L.g * L.B * sizeof(float));
    // the chunk's keys (the index searching per query head: one row of keys per head)
    L.t_ck    = t; t += align_up((size_t) L.chunk_max * (a->selector == SPARQ_SEL_INDEX ? L.ph : 1) * sizeof(float));
    L.t_idx   = t; t += align_up((size_t) L.chunk_max * sizeof(int32_t));
    L.t_gm    = t; t += align_up((size_t) (L.chunk_max + 2) * sizeof(float));
    L.t_big   = t; t += align_up((size_t) L.chunk_max * sizeof(cand));
    L.t_merge = t; t += align_up(((size_t) L.nc * L.cap + a->k + 1) * sizeof(cand));
    L.t_sel   = t; t += align_up(((size_t) L.sel_max + 1) * sizeof(int32_t));
    L.t_ex    = t; t += align_up(((size_t) L.sel_max + 1) * sizeof(float));
    L.t_vec   = t; t += align_up((size_t) 3 * dmax * sizeof(float));
    L.t_gh    = t; t += align_up((size_t) 2 * L.g * sizeof(float));
    L.t_rows  = t; t += align_up((size_t) a->r * sizeof(void *));
    // index: the lists' ranking (phase A)
    L.t_ivf   = t; t += align_up(a->selector == SPARQ_SEL_INDEX ? (size_t) a->ivf_n_list * sizeof(cand) : 0);
    // index: the chunk's cells in probed lists
    L.t_pc    = t; t += align_up(a->selector == SPARQ_SEL_INDEX ? (size_t) (L.chunk_max + 16) * sizeof(int32_t) : 0);
    L.thread_bytes = t;
    L.off_thread = o; o += L.thread_bytes * nth;
    L.total = o + SPARQ_ALIGN; // room to align the base pointer
    return L;
}

struct ctx {
    const sparq_args * a;
    const sparq_isa  * isa;
    layout L;
    char * base;

    float     * maskf(int row)              const { return (float *) (base + L.off_mask) + (size_t) row * a->n_kv; }
    int32_t   * cnt(int row)                const { return (int32_t *) (base + L.off_cnt) + (size_t) row * L.nc; }
    row_info  * rinfo(int row)              const { return (row_info *) (base + L.off_row) + row; }
    int32_t   * win(int row)                const { return (int32_t *) (base + L.off_win) + (size_t) row * (L.wcap + 1); }
    // H2O: thread ith's share of the attention weights of (stream, KV head), and the scores
    float     * h2o_part(int ith, int st, int kvh) const {
        return (float *) (base + L.off_h2o) + (((size_t) ith * a->n_stream + st) * a->n_head_kv + kvh) * a->n_kv;
    }
    // index: the unit's summed query, its lists' squared norms, its probe flags (1.0: probed)
    float     * ivf_q(int u, int h = 0)     const {
        return (float *) (base + L.off_ivf) + (size_t) u * ivf_unit_floats(a, L.ph) + (size_t) h * a->d;
    }
    float     * ivf_cn2(int u)              const { return ivf_q(u, L.ph); }
    float     * ivf_probe(int u, int h = 0) const { return ivf_cn2(u) + a->ivf_n_list + (size_t) h * a->ivf_n_list; }
    int32_t   * ivf_any(int u)              const { return (int32_t *) ivf_probe(u, L.ph); }
    const float * ivf_centroid(int st, int kvh, int c) const {
        return (const float *) ((const char *) a->ivf_cent + (size_t) c * a->ivf_cent_nb1 + (size_t) kvh * a->ivf_cent_nb2 +
                                (size_t) st * a->ivf_cent_nb3);
    }
    int32_t   * ivf_n(int w, int c)         const { return (int32_t *) (base + L.off_ivf_n) + (size_t) w * L.nc + c; }
    // index: where the op reports the key rows it read for (stream, KV head): centroid row n_list
    float     * ivf_reads(int st, int kvh)  const { return (float *) ivf_centroid(st, kvh, a->ivf_n_list); }
    float     * ivf_lists(int st, int kvh)  const {
        return (float *) ((char *) a->ivf_list + (size_t) kvh * a->ivf_list_nb1 + (size_t) st * a->ivf_list_nb2);
    }
    float     * h2o_row(int st, int kvh)    const {
        return (float *) ((char *) a->h2o + (size_t) kvh * a->h2o_nb1 + (size_t) st * a->h2o_nb2);
    }
    int32_t   * i1(int u)                   const { return (int32_t *) (base + L.off_i1) + (size_t) u * a->r; }
    float     * qs(int u)                   const { return (float *) (base + L.off_qs) + (size_t) u * L.g * a->r; }
    float     * stat(int w, int c)          const { return (float *) (base + L.off_stat) + ((size_t) w * L.nc + c) * L.g * 2; }
    int32_t   * ccount(int w, int c, int h = 0) const {
        return (int32_t *) (base + L.off_ccount) + ((size_t) w * L.nc + c) * L.ph + h;
    }
    cand      * cands(int w, int c, int h = 0) const {
        return (cand *) (base + L.off_cand) + (((size_t) w * L.nc + c) * L.ph + h) * L.cap;
    }
    float     * logits(int w, int h)        const { return (float *) (base + L.off_logit) + ((size_t) w * L.g + h) * a->n_kv; }
    char      * tbuf(int ith, size_t off)   const { return base + L.off_thread + (size_t) ith * L.thread_bytes + off; }

    // unit u = (stream * n_rows + row) * n_head_kv + kvh
    int unit_row(int u) const { return u / a->n_head_kv; }        // row index over all streams
    int unit_kvh(int u) const { return u % a->n_head_kv; }
    int row_stream(int R) const { return R / a->n_rows; }
    int row_in_stream(int R) const { return R % a->n_rows; }

    const void * mask_row_raw(int R) const {
        const int st = row_stream(R);
        return (const char *) a->mask + (size_t) row_in_stream(R) * a->mask_nb1 + (size_t) (st % a->mask_ne3) * a->mask_nb3;
    }
    // f32 view of the mask row (NULL when there is no mask)
    const float * mask_row(int R) const {
        if (!a->mask) {
            return nullptr;
        }
        return a->mask_type == SPARQ_F32 ? (const float *) mask_row_raw(R) : maskf(R);
    }
    const float * q_row(int R, int h) const {
        return (const float *) ((const char *) a->q + (size_t) row_in_stream(R) * a->q_nb1 + (size_t) h * a->q_nb2 +
                                (size_t) row_stream(R) * a->q_nb3);
    }
    // the query in K^T's basis (steps 1-2)
    const float * qsel_row(int R, int h) const {
        if (!a->q_sel) {
            return q_row(R, h);
        }
        return (const float *) ((const char *) a->q_sel + (size_t) row_in_stream(R) * a->q_sel_nb1 +
                                (size_t) h * a->q_sel_nb2 + (size_t) row_stream(R) * a->q_sel_nb3);
    }
    const float * comp_w(int kvh, int st) const {
        return a->comp_w ? (const float *) ((const char *) a->comp_w + (size_t) kvh * a->comp_w_nb1 +
                                            (size_t) st * a->comp_w_nb2) : nullptr;
    }
    const char * K_row(int st, int kvh, int i) const {
        return (const char *) a->K + (size_t) i * a->K_nb1 + (size_t) kvh * a->K_nb2 + (size_t) st * a->K_nb3;
    }
    const char * V_row(int st, int kvh, int i) const {
        return (const char *) a->V + (size_t) i * a->V_nb1 + (size_t) kvh * a->V_nb2 + (size_t) st * a->V_nb3;
    }
    const char * KT_row(int st, int kvh, int comp) const {
        return (const char *) a->KT + (size_t) comp * a->KT_nb1 + (size_t) kvh * a->KT_nb2 + (size_t) st * a->KT_nb3;
    }
};

static inline bool is_valid(float m) { return m != -INFINITY; }

static void chunk_range(int n, int c, int nc, int * s0, int * s1) {
    *s0 = (int) (((int64_t) n * c) / nc);
    *s1 = (int) (((int64_t) n * (c + 1)) / nc);
}

// keep the kk largest of buf[0..n) in buf[0..kk); return the kk-th key
static float compact(cand * buf, int n, int kk) {
    std::nth_element(buf, buf + (kk - 1), buf + n, cand_greater());
    return buf[kk - 1].key;
}

// ----- phase A: mask rows to f32 + valid counts; component selection -----
static void phase_a(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    if (a->selector == SPARQ_SEL_H2O) {
        memset(C.h2o_part(ith, 0, 0), 0, (size_t) a->n_stream * a->n_head_kv * S * sizeof(float));
    }
    for (int R = 0; R < C.L.R; ++R) {
        int s0, s1;
        chunk_range(S, ith, nth, &s0, &s1);
        int32_t n = 0;
        if (!a->mask) {
            n = s1 - s0;
        } else {
            const float * m;
            if (a->mask_type == SPARQ_F16) {
                const uint16_t * src = (const uint16_t *) C.mask_row_raw(R);
                float * dst = C.maskf(R);
                if (s1 > s0) {
                    C.isa->f16_to_f32(src + s0, dst + s0, s1 - s0);
                }
                m = dst;
            } else {
                m = (const float *) C.mask_row_raw(R);
            }
            for (int s = s0; s < s1; ++s) {
                n += is_valid(m[s]);
            }
        }
        C.cnt(R)[ith] = n;
    }

    // component selection, per unit
    const int d = a->d, r = a->r, g = C.L.g;
    float * absq = (float *) C.tbuf(ith, C.L.t_vec);
    int32_t * order = (int32_t *) (absq + d);
    for (int u = ith; u < C.L.U; u += nth) {
        const int R = C.unit_row(u), kvh = C.unit_kvh(u);
        const float * cw = C.comp_w(kvh, C.row_stream(R));
        for (int j = 0; j < d; ++j) {
            absq[j] = 0.0f;
        }
        for (int h = 0; h < g; ++h) {
            const float * q = C.qsel_row(R, kvh * g + h);
            for (int j = 0; j < d; ++j) {
                absq[j] += fabsf(q[j]);
            }
        }
        if (cw) {
            for (int j = 0; j < d; ++j) {
                absq[j] *= cw[j];
            }
        }
        for (int j = 0; j < d; ++j) {
            order[j] = j;
        }
        // r largest of sum_h |q_h|, ties to the lower index
        auto by_mag = [absq](int32_t x, int32_t y) { return absq[x] > absq[y] || (absq[x] == absq[y] && x < y); };
        if (r < d) {
            std::nth_element(order, order + (r - 1), order + d, by_mag);
        }
        std::sort(order, order + r); // ascending components: K^T rows in address order
        int32_t * i1 = C.i1(u);
        memcpy(i1, order, r * sizeof(int32_t));
        float * qs = C.qs(u);
        for (int h = 0; h < g; ++h) {
            const float * q = C.qsel_row(R, kvh * g + h);
            double l1_all = 0.0, l1_sel = 0.0;
            for (int j = 0; j < d; ++j) {
                l1_all += fabsf(q[j]) * (cw ? cw[j] : 1.0f);
            }
            for (int j = 0; j < r; ++j) {
                l1_sel += fabsf(q[i1[j]]) * (cw ? cw[i1[j]] : 1.0f);
            }
            // 1/tau generalised to any scale: scale * sqrt(||q||_1 / ||q[i1]||_1)
            const float f = l1_sel > 0.0 ? (float) (a->scale * sqrt(l1_all / l1_sel)) : a->scale;
            for (int j = 0; j < r; ++j) {
                qs[h * r + j] = q[i1[j]] * f;
            }
        }
    }

    if (a->selector == SPARQ_SEL_INDEX) {
        // per unit: the query of each search (the group's sum; with per-head choice each head's own),
        // the lists' squared norms (for assignments), and each search's probed lists
        const int nl = a->ivf_n_list, ph = C.L.ph;
        cand * ls = (cand *) C.tbuf(ith, C.L.t_ivf);
        for (int u = ith; u < C.L.U; u += nth) {
            const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
            for (int hs = 0; hs < ph; ++hs) {
                float * qv = C.ivf_q(u, hs);
                for (int j = 0; j < d; ++j) {
                    qv[j] = 0.0f;
                }
                for (int h = ph > 1 ? hs : 0; h < (ph > 1 ? hs + 1 : g); ++h) {
                    const float * q = C.q_row(R, kvh * g + h);
                    for (int j = 0; j < d; ++j) {
                        qv[j] += q[j];
                    }
                }
            }
            float * cn2 = C.ivf_cn2(u);
            for (int c = 0; c < nl; ++c) {
                const float * ce = C.ivf_centroid(st, kvh, c);
                cn2[c] = C.isa->dot_f32(ce, ce, d);
            }
            const int np = std::min(a->ivf_n_probe, nl);
            int32_t * any = C.ivf_any(u);
            for (int c = 0; c < nl; ++c) {
                any[c] = 0;
            }
            for (int hs = 0; hs < ph; ++hs) {
                float * pr = C.ivf_probe(u, hs);
                for (int c = 0; c < nl; ++c) {
                    ls[c].key = C.isa->dot_f32(C.ivf_q(u, hs), C.ivf_centroid(st, kvh, c), d);
                    ls[c].idx = c;
                    pr[c] = 0.0f;
                }
                // the n_probe best lists, ties to the lower index
                if (np < nl) {
                    compact(ls, nl, np);
                }
                for (int i = 0; i < np; ++i) {
                    pr[ls[i].idx] = 1.0f;
                    any[ls[i].idx] = 1;
                }
            }
        }
    }
}

// ----- phase B: valid cells and window start per row -----
static void phase_b(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    for (int R = ith; R < C.L.R; R += nth) {
        int32_t n_valid = 0;
        for (int c = 0; c < C.L.nc; ++c) {
            n_valid += C.cnt(R)[c];
        }
        const float * m = C.mask_row(R);
        int32_t * wl = C.win(R);
        int32_t w0 = S, n_win = 0;
        // a negative count marks a stream whose rows run exact dense attention (see sparq_args)
        const int32_t dense_all = a->v_count[C.row_stream(R)] < 0.0f;
        const bool streaming = a->selector == SPARQ_SEL_STREAMING;
        if (n_valid > a->k && (a->l > 0 || streaming) && !dense_all) {
            if (a->win) {
                // the window cells are given (the l most recent positions): keep the valid ones
                const int32_t * src = (const int32_t *) ((const char *) a->win + (size_t) C.row_in_stream(R) * a->win_nb1 +
                                                         (size_t) C.row_stream(R) * a->win_nb2);
                // streaming: entries l..k-1 name the earliest positions' cells (the sinks)
                for (int i = 0; i < std::min(streaming ? a->k : a->l, a->win_n); ++i) {
                    const int32_t c = src[i];
                    if (c >= 0 && c < S && (!m || is_valid(m[c]))) {
                        wl[n_win++] = c;
                    }
                }
                std::sort(wl, wl + n_win);
                n_win = (int32_t) (std::unique(wl, wl + n_win) - wl);
            } else {
                // the most recent cells are the last valid ones
                for (int s = S - 1; s >= 0 && n_win < a->l; --s) {
                    if (!m || is_valid(m[s])) {
                        wl[n_win++] = s;
                        w0 = s;
                    }
                }
                std::reverse(wl, wl + n_win);
                if (streaming) {
                    // the sinks: the first k - l valid cells (disjoint from the window: n_valid > k)
                    int n_sink = 0;
                    for (int s = 0; s < S && n_sink < a->k - a->l; ++s) {
                        if (!m || is_valid(m[s])) {
                            wl[n_win++] = s;
                            n_sink++;
                        }
                    }
                    std::sort(wl, wl + n_win);
                }
            }
        }
        C.rinfo(R)->n_valid = n_valid;
        C.rinfo(R)->w0 = w0;
        C.rinfo(R)->n_win = n_win;
        C.rinfo(R)->dense_all = dense_all;
    }
}

// positions chosen by score (the window fills the rest of k)
static inline int row_kk(const sparq_args * a, const row_info * ri) {
    return a->k - ri->n_win;
}

// how many best-scoring cells a chunk must offer: with a given window list the window
// cells are not excluded while scanning, so up to n_win of the best may be window cells
static inline int row_kk_scan(const sparq_args * a, const row_info * ri) {
    const int kk = row_kk(a, ri);
    return a->win && kk > 0 ? kk + ri->n_win : kk;
}

// The candidates of one chunk: keys ck[0..n) of cells base.., of which the kk best
// are wanted. A lower bound t of the kk-th best key is the kk-th best of the maxima
// of G >= kk groups of cells (each such maximum is a key of the chunk); every cell
// with key >= t is a candidate, which are a few more than kk. Only vectorised passes
// touch all n keys; the selection proper (nth_element) sees ~4 kk group maxima and
// the candidates. Returns the number of candidates written to out (at most cap).
static int select_chunk(const ctx & C, int ith, const float * ck, int n, int base, int kk, cand * out) {
    if (n <= 0 || kk <= 0) {
        return 0;
    }
    const sparq_isa * isa = C.isa;
    int32_t * idx = (int32_t *) C.tbuf(ith, C.L.t_idx);
    float t = -INFINITY;
    // about 4 kk groups of a multiple of 16 cells when the chunk is long; a shorter
    // chunk halves the groups (down to single cells) until there are 4/3 kk of them
    int gs = (n / (4 * kk)) & ~15;
    if (gs < 16) {
        gs = 16;
        while (gs > 1 && (n + gs - 1) / gs < kk + kk / 3) {
            gs /= 2;
        }
    }
    const int G = (n + gs - 1) / gs;
    if (G >= kk) {
        float * gm = (float *) C.tbuf(ith, C.L.t_gm);
        for (int i = 0; i < G; ++i) {
            gm[i] = isa->max(ck + (size_t) i * gs, std::min(gs, n - i * gs));
        }
        std::nth_element(gm, gm + (kk - 1), gm + G, std::greater<float>());
        t = gm[kk - 1];
    }
    if (t != -INFINITY) {
        t = std::nextafter(t, -INFINITY); // filter_gt(t') selects key >= t
    }
    const int m = isa->filter_gt(ck, n, t, idx);
    cand * dst = m <= C.L.cap ? out : (cand *) C.tbuf(ith, C.L.t_big);
    for (int i = 0; i < m; ++i) {
        dst[i].key = ck[idx[i]];
        dst[i].idx = base + idx[i];
    }
    if (m <= C.L.cap) {
        return m;
    }
    // many ties at the bound: keep the kk best
    compact(dst, m, kk);
    memcpy(out, dst, (size_t) kk * sizeof(cand));
    return kk;
}

// The index selector's candidates in one chunk [s0, s1) of unit u: the cells of the probed lists,
// by their exact logit summed over the group (or each head's own, searching per query head).
// Three passes, so that only the probed cells' key rows are read:
//   1. every list id of the chunk: a valid cell in no list yet joins its nearest centroid's list
//      (this thread owns the chunk's cells), and the cells before the window whose list some
//      search probes are gathered, in cell order (the ISA's list_gather, vectorised);
//   2. the gathered cells' keys (rows prefetched ahead), masked cells dropped;
//   3. the selection over the gathered scores (cell order kept, so ties still go to the lower cell).
static void index_candidates(const ctx & C, int u, int w, int s0, int s1, int ith) {
    const sparq_args * a = C.a;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const row_info * ri = C.rinfo(R);
    const float * m = C.mask_row(R);
    const int ph = C.L.ph, nl = a->ivf_n_list, d = a->d;
    const float * cn2 = C.ivf_cn2(u);
    float * lists = C.ivf_lists(st, kvh);
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    float * kf = (float *) C.tbuf(ith, C.L.t_vec); // a key in f32 (3 * max(d, dv) floats)
    const int32_t * any = C.ivf_any(u); // the lists some search of the unit probes (phase A)
    int32_t * pc = (int32_t *) C.tbuf(ith, C.L.t_pc);
    // files a valid cell that is in no list yet: argmin |k - c|^2 = argmin |c|^2 - 2 k.c, ties to the lower list
    auto file = [&](int cell) -> int {
        if (m && !is_valid(m[cell])) {
            return -1;
        }
        const char * kr = C.K_row(st, kvh, cell);
        if (a->K_type == SPARQ_F16) {
            C.isa->f16_to_f32((const uint16_t *) kr, kf, d);
        } else {
            memcpy(kf, kr, (size_t) d * sizeof(float));
        }
        float best = INFINITY;
        int li = 0;
        for (int c = 0; c < nl; ++c) {
            const float dist = cn2[c] - 2.0f * C.isa->dot_f32(kf, C.ivf_centroid(st, kvh, c), d);
            if (dist < best) {
                best = dist;
                li = c;
            }
        }
        lists[cell] = (float) li;
        return li;
    };
    // pass 1: cells before the window are gathered; the window's cells are only filed
    const int e = std::max(s0, std::min(s1, (int) ri->w0));
    int n = 0;
    for (int pos = s0; pos < e;) {
        int stop = 0;
        n += C.isa->list_gather(lists + pos, e - pos, any, nl, pos, pc + n, &stop);
        pos += stop;
        if (pos < e) {
            const int li = file(pos); // in no list yet
            if (li >= 0 && any[li]) {
                pc[n++] = pos;
            }
            ++pos;
        }
    }
    for (int cell = e; cell < s1; ++cell) {
        const int li = (int) lists[cell];
        if ((unsigned) li >= (unsigned) nl) {
            file(cell);
        }
    }
    // pass 2: the gathered cells' logits (masked cells dropped; with per-head search a head's
    // unprobed lists give -inf, which the selection never takes)
    const size_t rb = (size_t) d * (a->K_type == SPARQ_F16 ? 2 : 4);
    constexpr int PF = 8; // rows ahead
    int n2 = 0;
    for (int i = 0; i < n; ++i) {
        if (i + PF < n) {
            const char * nx = C.K_row(st, kvh, pc[i + PF]);
            for (size_t o = 0; o < rb; o += 64) {
                __builtin_prefetch(nx + o);
            }
        }
        const int cell = pc[i];
        if (m && !is_valid(m[cell])) {
            continue;
        }
        const char * kr = C.K_row(st, kvh, cell);
        const int li = ph > 1 ? (int) lists[cell] : 0;
        for (int hs = 0; hs < ph; ++hs) {
            float x = -INFINITY;
            if (ph == 1 || C.ivf_probe(u, hs)[li] != 0.0f) {
                const float * qv = C.ivf_q(u, hs);
                x = (a->K_type == SPARQ_F16 ? C.isa->dot_f16(qv, (const uint16_t *) kr, d)
                                            : C.isa->dot_f32(qv, (const float *) kr, d)) * a->scale;
            }
            ck[(size_t) hs * C.L.chunk_max + n2] = x;
        }
        pc[n2++] = cell;
    }
    *C.ivf_n(w, ith) = n2;
    // pass 3: the chunk's best, as positions in the gathered list, then as cells
    for (int hs = 0; hs < ph; ++hs) {
        cand * out = C.cands(w, ith, hs);
        const int cnt = select_chunk(C, ith, ck + (size_t) hs * C.L.chunk_max, n2, 0, row_kk_scan(a, ri), out);
        for (int i = 0; i < cnt; ++i) {
            out[i].idx = pc[out[i].idx];
        }
        *C.ccount(w, ith, hs) = cnt;
    }
}

// ----- phase C: approximate logits, softmax statistics, candidates (g == 1) -----
static void phase_c(const ctx & C, int wb, int we, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, r = a->r, g = C.L.g;
    const size_t esz = a->KT_type == SPARQ_F16 ? 2 : 4;
    float * blk = (float *) C.tbuf(ith, C.L.t_blk);
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    const void ** rows = (const void **) C.tbuf(ith, C.L.t_rows);
    for (int u = wb; u < we; ++u) {
        const int w = u - wb;
        const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
        const row_info * ri = C.rinfo(R);
        float * stat = C.stat(w, ith);
        for (int h = 0; h < C.L.ph; ++h) {
            *C.ccount(w, ith, h) = 0;
        }
        for (int h = 0; h < g; ++h) {
            stat[2 * h] = -INFINITY;
            stat[2 * h + 1] = 0.0f;
        }
        if (ri->n_valid <= a->k || ri->dense_all || a->selector == SPARQ_SEL_STREAMING) {
            continue; // exact dense row, or the window list is the whole choice: no scores needed
        }
        int s0, s1;
        chunk_range(S, ith, C.L.nc, &s0, &s1);
        if (a->selector == SPARQ_SEL_INDEX) {
            index_candidates(C, u, w, s0, s1, ith);
            continue;
        }
        if (a->selector == SPARQ_SEL_H2O) {
            // candidates by accumulated attention (invalid cells never), cells before the window
            const float * hs = C.h2o_row(st, kvh);
            const float * m = C.mask_row(R);
            const int n = std::min(s1, (int) ri->w0) - s0;
            for (int s = 0; s < n; ++s) {
                ck[s] = m && !is_valid(m[s0 + s]) ? -INFINITY : hs[s0 + s];
            }
            *C.ccount(w, ith) = select_chunk(C, ith, ck, n, s0, row_kk_scan(a, ri), C.cands(w, ith));
            continue;
        }
        const int32_t * i1 = C.i1(u);
        const float * qs = C.qs(u);
        const float * m = C.mask_row(R);
        for (int b0 = s0; b0 < s1; b0 += C.L.B) {
            const int nb = std::min(C.L.B, s1 - b0);
            for (int j = 0; j < r; ++j) {
                rows[j] = C.KT_row(st, kvh, i1[j]) + (size_t) b0 * esz;
            }
            // g == 1: the keys of the chunk are kept for the selection; g > 1: a block buffer
            float * out = g == 1 ? ck + (b0 - s0) : blk;
            if (a->KT_type == SPARQ_F16) {
                C.isa->approx_f16((const uint16_t * const *) rows, r, qs, g, nb, out);
            } else {
                C.isa->approx_f32((const float * const *) rows, r, qs, g, nb, out);
            }
            for (int h = 0; h < g; ++h) {
                float * x = out + (size_t) h * nb;
                if (m) {
                    for (int s = 0; s < nb; ++s) {
                        x[s] += m[b0 + s];
                    }
                }
                const float bm = C.isa->max(x, nb);
                if (bm != -INFINITY) {
                    float & M = stat[2 * h];
                    float & Z = stat[2 * h + 1];
                    if (bm > M) {
                        Z = M == -INFINITY ? 0.0f : Z * expf(M - bm);
                        M = bm;
                    }
                    Z += C.isa->expsum(x, nb, M);
                }
                if (g > 1) {
                    memcpy(C.logits(w, h) + b0, x, nb * sizeof(float));
                }
            }
        }
        if (g == 1) {
            // candidates: cells before the local window
            const int n = std::min(s1, (int) ri->w0) - s0;
            *C.ccount(w, ith) = select_chunk(C, ith, ck, n, s0, row_kk_scan(a, ri), C.cands(w, ith));
        }
    }
}

// ----- phase D (GQA): group-summed normalised scores, candidates -----
static void phase_d(const ctx & C, int wb, int we, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, g = C.L.g;
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    float * Mh = (float *) C.tbuf(ith, C.L.t_gh);
    float * iZ = Mh + g;
    for (int u = wb; u < we; ++u) {
        const int w = u - wb;
        const int R = C.unit_row(u);
        const row_info * ri = C.rinfo(R);
        for (int h = 0; h < C.L.ph; ++h) {
            *C.ccount(w, ith, h) = 0;
        }
        const int kk = row_kk_scan(a, ri);
        if (ri->n_valid <= a->k || ri->dense_all || kk <= 0) {
            continue;
        }
        int s0, s1;
        chunk_range(S, ith, C.L.nc, &s0, &s1);
        s1 = std::min(s1, (int) ri->w0); // candidates: cells before the local window
        if (s1 <= s0) {
            continue;
        }
        if (C.L.ph > 1) {
            // per-head selection: each head's best cells by its own approximate logits
            // (masked cells hold -inf there, so they are never chosen)
            for (int h = 0; h < g; ++h) {
                *C.ccount(w, ith, h) = select_chunk(C, ith, C.logits(w, h) + s0, s1 - s0, s0, kk, C.cands(w, ith, h));
            }
            continue;
        }
        for (int h = 0; h < g; ++h) {
            float M = -INFINITY;
            for (int c = 0; c < C.L.nc; ++c) {
                M = std::max(M, C.stat(w, c)[2 * h]);
            }
            double Z = 0.0;
            for (int c = 0; c < C.L.nc; ++c) {
                const float * st = C.stat(w, c);
                if (st[2 * h] != -INFINITY) {
                    Z += st[2 * h + 1] * exp((double) st[2 * h] - M);
                }
            }
            Mh[h] = M;
            iZ[h] = Z > 0 ? (float) (1.0 / Z) : 0.0f;
        }
        const int n = s1 - s0;
        for (int s = 0; s < n; ++s) {
            ck[s] = 0.0f;
        }
        for (int h = 0; h < g; ++h) {
            C.isa->exp_acc(C.logits(w, h) + s0, n, Mh[h], iZ[h], ck);
        }
        // masked cells (key 0) must never be chosen
        const float * m = C.mask_row(R);
        if (m) {
            for (int s = 0; s < n; ++s) {
                if (!is_valid(m[s0 + s])) {
                    ck[s] = -INFINITY;
                }
            }
        }
        *C.ccount(w, ith) = select_chunk(C, ith, ck, n, s0, kk, C.cands(w, ith));
    }
}

// the exact logit of query q and cell s of (stream, KV head), mask included
static inline float exact_logit(const ctx & C, const float * q, int st, int kvh, int s, const float * m) {
    const sparq_args * a = C.a;
    const char * kr = C.K_row(st, kvh, s);
    const float e = a->K_type == SPARQ_F16 ? C.isa->dot_f16(q, (const uint16_t *) kr, a->d)
                                           : C.isa->dot_f32(q, (const float *) kr, a->d);
    return e * a->scale + (m ? m[s] : 0.0f);
}

// exact attention of one unit over every valid cell (a stream marked dense): one pass with
// a running maximum, no selection buffer
static void dense_row(const ctx & C, int u, int R, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, g = C.L.g, d = a->d, dv = a->dv;
    const int kvh = C.unit_kvh(u), st = C.row_stream(R);
    const float * m = C.mask_row(R);
    float * y = (float *) C.tbuf(ith, C.L.t_vec);
    for (int hh = 0; hh < g; ++hh) {
        const int h = kvh * g + hh;
        const float * q = C.q_row(R, h);
        float M = -INFINITY, P = 0.0f;
        for (int j = 0; j < dv; ++j) {
            y[j] = 0.0f;
        }
        for (int s = 0; s < S; ++s) {
            if (m && !is_valid(m[s])) {
                continue;
            }
            const float e = exact_logit(C, q, st, kvh, s, m);
            if (e > M) {
                const float f = M == -INFINITY ? 0.0f : expf(M - e);
                for (int j = 0; j < dv; ++j) {
                    y[j] *= f;
                }
                P *= f;
                M = e;
            }
            const float p = expf(e - M);
            P += p;
            const char * vr = C.V_row(st, kvh, s);
            if (a->V_type == SPARQ_F16) {
                C.isa->axpy_f16(y, (const uint16_t *) vr, p, dv);
            } else {
                C.isa->axpy_f32(y, (const float *) vr, p, dv);
            }
        }
        const float iP = P > 0.0f ? 1.0f / P : 0.0f;
        float * o = (float *) ((char *) a->out + (size_t) h * a->out_nb1 + (size_t) C.row_in_stream(R) * a->out_nb2 +
                               (size_t) st * a->out_nb3);
        for (int j = 0; j < dv; ++j) {
            o[j] = y[j] * iP;
        }
        if (a->selector == SPARQ_SEL_H2O) {
            // the weights need the final maximum and sum: a second pass over the logits
            float * part = C.h2o_part(ith, st, kvh);
            for (int s = 0; s < S; ++s) {
                if (m && !is_valid(m[s])) {
                    continue;
                }
                part[s] += expf(exact_logit(C, q, st, kvh, s, m) - M) * iP;
            }
        }
    }
    if (a->sel_out) {
        int32_t * so = a->sel_out + (size_t) u * a->sel_n;
        for (int t = 0; t < a->sel_n; ++t) {
            so[t] = -1; // every valid cell: not listed
        }
    }
}

// ----- phase E: final selection, exact attention, reallocation -----
static void phase_e(const ctx & C, int wb, int we, int ith, int nth) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, g = C.L.g, d = a->d, dv = a->dv, r = a->r;
    cand * merge = (cand *) C.tbuf(ith, C.L.t_merge);
    int32_t * sel = (int32_t *) C.tbuf(ith, C.L.t_sel);
    float * ex = (float *) C.tbuf(ith, C.L.t_ex);
    const int dmax = std::max(d, dv);
    float * y = (float *) C.tbuf(ith, C.L.t_vec);
    float * vbar = y + dmax;

    for (int u = wb + ith; u < we; u += nth) {
        const int w = u - wb;
        const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
        const row_info * ri = C.rinfo(R);
        const float * m = C.mask_row(R);
        const bool dense = ri->dense_all || ri->n_valid <= a->k;
        if (a->selector == SPARQ_SEL_INDEX && a->ivf_reads && C.row_in_stream(R) == a->n_rows - 1) {
            // what the stream's last row read: the key rows its chunks scored (-1: it ran dense)
            int32_t n = 0;
            for (int c = 0; c < C.L.nc; ++c) {
                n += *C.ivf_n(w, c);
            }
            *C.ivf_reads(st, kvh) = dense ? -1.0f : (float) n;
        }
        if (ri->dense_all) {
            dense_row(C, u, R, ith);
            continue;
        }
        int n_sel = 0, n_cand = 0;
        if (dense) {
            for (int s = 0; s < S && n_sel < a->k; ++s) {
                if (!m || is_valid(m[s])) {
                    sel[n_sel++] = s;
                }
            }
        } else {
            const int kk = row_kk(a, ri);
            const int32_t * wl = C.win(R);
            if (kk > 0) {
                // one list (group-shared) or one per query head, merged over the chunks
                for (int h = 0; h < C.L.ph; ++h) {
                    int n_m = 0;
                    for (int c = 0; c < C.L.nc; ++c) {
                        const int n_c = *C.ccount(w, c, h);
                        const cand * cc = C.cands(w, c, h);
                        for (int i = 0; i < n_c; ++i) {
                            // window cells are added below, not chosen by score
                            if (!a->win || !std::binary_search(wl, wl + ri->n_win, cc[i].idx)) {
                                merge[n_m++] = cc[i];
                            }
                        }
                    }
                    if (n_m > kk) {
                        compact(merge, n_m, kk);
                        n_m = kk;
                    }
                    for (int i = 0; i < n_m; ++i) {
                        sel[n_sel++] = merge[i].idx;
                    }
                }
                if (C.L.ph > 1) {
                    // the union of the heads' choices
                    std::sort(sel, sel + n_sel);
                    n_sel = (int) (std::unique(sel, sel + n_sel) - sel);
                }
                n_cand = n_sel;
            }
            for (int i = 0; i < ri->n_win; ++i) {
                sel[n_sel++] = wl[i];
            }
        }

        // the selected K and V rows are scattered: ask for all of them before using any
        {
            const size_t kb = (size_t) d * (a->K_type == SPARQ_F16 ? 2 : 4);
            const size_t vb = (size_t) dv * (a->V_type == SPARQ_F16 ? 2 : 4);
            for (int t = 0; t < n_sel; ++t) {
                const char * kr = C.K_row(st, kvh, sel[t]);
                const char * vr = C.V_row(st, kvh, sel[t]);
                for (size_t o = 0; o < kb; o += 64) {
                    __builtin_prefetch(kr + o);
                }
                for (size_t o = 0; o < vb; o += 64) {
                    __builtin_prefetch(vr + o);
                }
            }
        }

        // mean of V over the stream's cells
        const bool mean_v = !dense && !a->no_mean_v;
        float cnt = fabsf(a->v_count[st]);
        const float * vs = (const float *) ((const char *) a->v_sum + (size_t) kvh * a->v_sum_nb1 + (size_t) st * a->v_sum_nb2);
        for (int j = 0; j < dv; ++j) {
            vbar[j] = vs[j];
        }
        const int row = C.row_in_stream(R);
        if (mean_v && m && row + 1 < a->n_rows) {
            // several rows (all-rows evaluation): the sums hold the whole ubatch, so leave out
            // the cells this row may not see that the stream's last row sees (the later rows)
            const float * ml = C.mask_row(R + (a->n_rows - 1 - row));
            for (int c = 0; c < S; ++c) {
                if (is_valid(ml[c]) && !is_valid(m[c])) {
                    const char * vr = C.V_row(st, kvh, c);
                    if (a->V_type == SPARQ_F16) {
                        C.isa->axpy_f16(vbar, (const uint16_t *) vr, -1.0f, dv);
                    } else {
                        C.isa->axpy_f32(vbar, (const float *) vr, -1.0f, dv);
                    }
                    cnt -= 1.0f;
                }
            }
        }
        for (int j = 0; j < dv; ++j) {
            vbar[j] = cnt > 0.0f ? vbar[j] / cnt : 0.0f;
        }

        const int32_t * i1 = C.i1(u);
        const float * qs = C.qs(u);
        for (int hh = 0; hh < g; ++hh) {
            const int h = kvh * g + hh;
            const float * q = C.q_row(R, h);
            // exact logits over the selection
            float M = -INFINITY;
            for (int t = 0; t < n_sel; ++t) {
                ex[t] = exact_logit(C, q, st, kvh, sel[t], m);
                M = std::max(M, ex[t]);
            }
            for (int j = 0; j < dv; ++j) {
                y[j] = 0.0f;
            }
            float P = 0.0f;
            for (int t = 0; t < n_sel; ++t) {
                const float p = expf(ex[t] - M);
                P += p;
                const char * vr = C.V_row(st, kvh, sel[t]);
                if (a->V_type == SPARQ_F16) {
                    C.isa->axpy_f16(y, (const uint16_t *) vr, p, dv);
                } else {
                    C.isa->axpy_f32(y, (const float *) vr, p, dv);
                }
            }
            const float iP = P > 0.0f ? 1.0f / P : 0.0f;
            if (a->selector == SPARQ_SEL_H2O) {
                // the row's attention weights, added to the scores once every row has chosen
                float * part = C.h2o_part(ith, st, kvh);
                for (int t = 0; t < n_sel; ++t) {
                    part[sel[t]] += expf(ex[t] - M) * iP;
                }
            }

            // alpha: approximate softmax mass of the selection
            float alpha = 1.0f;
            if (mean_v) {
                float Ms = -INFINITY;
                double Z = 0.0;
                for (int c = 0; c < C.L.nc; ++c) {
                    Ms = std::max(Ms, C.stat(w, c)[2 * hh]);
                }
                for (int c = 0; c < C.L.nc; ++c) {
                    const float * stt = C.stat(w, c);
                    if (stt[2 * hh] != -INFINITY) {
                        Z += stt[2 * hh + 1] * exp((double) stt[2 * hh] - Ms);
                    }
                }
                double mass = 0.0;
                for (int t = 0; t < n_sel; ++t) {
                    const int i = sel[t];
                    float ap;
                    if (g > 1) {
                        ap = C.logits(w, hh)[i];
                    } else if (t < n_cand) {
                        ap = merge[t].key; // the candidate's approximate logit (+ mask)
                    } else {
                        // a window cell: its approximate logit from the r rows of K^T (the
                        // basis of the approximate scores)
                        ap = 0.0f;
                        for (int j = 0; j < r; ++j) {
                            const char * kt = C.KT_row(st, kvh, i1[j]);
                            const float kv = a->KT_type == SPARQ_F16 ? sparq_fp16_to_fp32(((const uint16_t *) kt)[i])
                                                                     : ((const float *) kt)[i];
                            ap += qs[hh * r + j] * kv;
                        }
                        ap += m ? m[i] : 0.0f;
                    }
                    mass += expf(ap - Ms);
                }
                alpha = Z > 0.0 ? (float) std::min(1.0, mass / Z) : 1.0f;
            }
            float * o = (float *) ((char *) a->out + (size_t) h * a->out_nb1 + (size_t) C.row_in_stream(R) * a->out_nb2 +
                                   (size_t) st * a->out_nb3);
            const float ay = alpha * iP, av = 1.0f - alpha;
            for (int j = 0; j < dv; ++j) {
                o[j] = ay * y[j] + av * vbar[j];
            }
        }
        if (a->sel_out) {
            int32_t * so = a->sel_out + (size_t) u * a->sel_n;
            std::sort(sel, sel + n_sel);
            for (int t = 0; t < a->sel_n; ++t) {
                so[t] = t < n_sel ? sel[t] : -1;
            }
        }
    }
}

} // namespace

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
    C.L = make_layout(a, nth);
    if (wsize < C.L.total) {
        fprintf(stderr, "sparq: work buffer of %zu bytes, %zu needed\n", wsize, C.L.total);
        abort();
    }
    C.base = (char *) (((uintptr_t) wdata + SPARQ_ALIGN - 1) & ~(uintptr_t) (SPARQ_ALIGN - 1));

    phase_a(C, ith, nth);
    barrier(barrier_ctx);
    phase_b(C, ith, nth);
    barrier(barrier_ctx);
    for (int wb = 0; wb < C.L.U; wb += C.L.wave) {
        const int we = std::min(C.L.U, wb + C.L.wave);
        phase_c(C, wb, we, ith);
        barrier(barrier_ctx);
        if (C.L.g > 1 && !sel_baseline(a)) {
            phase_d(C, wb, we, ith);
            barrier(barrier_ctx);
        }
        phase_e(C, wb, we, ith, nth);
        if (we < C.L.U) {
            barrier(barrier_ctx);
        }
    }
    if (a->selector == SPARQ_SEL_H2O) {
        // every row has chosen: add the threads' weights to the scores, a share of the cells each
        barrier(barrier_ctx);
        const int S = a->n_kv;
        for (int st = 0; st < a->n_stream; ++st) {
            for (int kvh = 0; kvh < a->n_head_kv; ++kvh) {
                int s0, s1;
                chunk_range(S, ith, nth, &s0, &s1);
                float * hs = C.h2o_row(st, kvh);
                for (int t = 0; t < nth; ++t) {
                    const float * part = C.h2o_part(t, st, kvh);
                    for (int s = s0; s < s1; ++s) {
                        hs[s] += part[s];
                    }
                }
            }
        }
    }
}
