// llama-sparq: SparQ attention on the CPU, independent of ggml.
//
// sparq_cpu_compute() runs one SparQ attention call (docs/algorithm.md) for every
// stream, query row and KV head group, split over nth threads that all call it
// with their index ith and meet at the given barrier between phases:
//
//   phase_components      per (row, cell chunk): mask to f32, count valid cells;
//                         per unit (stream, row, KV head): component selection i1
//   phase_windows         per row: number of valid cells, start of the local window
//   phase_scores          per (unit, cell chunk): approximate logits from r rows of K^T,
//                         softmax statistics, candidate positions of the chunk
//   phase_gqa_candidates  (GQA only) per (unit, cell chunk): group-summed scores, candidates
//   phase_select          per unit: merge candidates + window into i2, the mean of V, each
//                         head's alpha (the approximate mass of i2)
//   phase_attend          per (unit, query head), taken from a shared counter as each thread
//                         finishes phase_select (no barrier between: each waits for its unit's
//                         plan only): exact attention over i2, mean-value reallocation, output
//
// The ISA-specific primitives (sparq_isa) are the only SIMD code; everything
// else is shared, so every ISA makes exactly the same selection logic.
//
// Files: sparq-cpu.cpp (entry points, ISA choice, the phases' order), sparq-cpu-phases.h (the
// internal declarations), sparq-cpu-prepare.cpp (phase_components, phase_windows),
// sparq-cpu-scores.cpp (phase_scores, phase_gqa_candidates), sparq-cpu-attend.cpp (phase_select, phase_attend),
// sparq-cpu-selector.h (the selector interface the phases call), sparq-cpu-selectors.cpp (the
// selectors by id), sparq-cpu-select-<name>.cpp (each selector's hooks),
// sparq-cpu-candidates.cpp, sparq-cpu-layout.cpp, sparq-cpu-fp16.cpp; isa/sparq-cpu-<isa>.cpp on the
// vector layer isa/sparq-isa-simd.h.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ggml-sparq-kt4.h"

// SPARQ_E5M2: K^T only, one byte per value, the upper byte of its f16 (ggml-sparq.h). SPARQ_KT4: K^T
// only, q4_1 blocks of 32 cells along a K^T row (ggml-sparq-kt4.h). The block types (q8_0 and the 4-
// and 5-bit ones from SPARQ_Q4_0 on) are K and V rows only, whole blocks of SPARQ_QK
enum sparq_type {
    SPARQ_F32 = 0, SPARQ_F16 = 1, SPARQ_Q8_0 = 2, SPARQ_E5M2 = 3,
    SPARQ_Q4_0 = 4, SPARQ_Q4_1 = 5, SPARQ_Q5_0 = 6, SPARQ_Q5_1 = 7, SPARQ_IQ4_NL = 8,
    SPARQ_KT4 = 9,
};

// ggml's q8_0 block (K and V rows only; a row's length is a multiple of SPARQ_QK): value i is
// qs[i] * d, d an f16. 34 bytes, no padding, as ggml lays it out in the cache
#define SPARQ_QK 32
struct sparq_block_q8_0 {
    uint16_t d;
    int8_t qs[SPARQ_QK];
};

// bytes of a block of SPARQ_QK values of a block type as ggml lays it out (sparq-cpu-blocks.cpp has
// the 4- and 5-bit layouts); 0 for f32, f16 and e5m2
static inline size_t sparq_block_bytes(enum sparq_type t) {
    switch (t) {
        case SPARQ_Q8_0:   return sizeof(struct sparq_block_q8_0);
        case SPARQ_Q4_0:   return 18; // f16 d, 16 bytes of nibbles
        case SPARQ_Q4_1:
        case SPARQ_KT4:    return 20; // f16 d, f16 m, nibbles
        case SPARQ_Q5_0:   return 22; // f16 d, 4 bytes of fifth bits, nibbles
        case SPARQ_Q5_1:   return 24; // f16 d, f16 m, fifth bits, nibbles
        case SPARQ_IQ4_NL: return 18; // f16 d, nibbles indexing a fixed table
        default:           return 0;
    }
}

// bytes of a row of n values of type t (n a multiple of SPARQ_QK for a block type)
static inline size_t sparq_row_bytes(enum sparq_type t, int n) {
    const size_t bb = sparq_block_bytes(t);
    return bb ? (size_t) (n / SPARQ_QK) * bb : (size_t) n * (t == SPARQ_E5M2 ? 1 : t == SPARQ_F16 ? 2 : 4);
}

// where cell c's value starts in a row of type t (a K^T row): its element, or its block's start
static inline size_t sparq_cell_offset(enum sparq_type t, int64_t c) {
    return sparq_block_bytes(t) ? (size_t) (c / SPARQ_QK) * sparq_block_bytes(t) : (size_t) c * sparq_row_bytes(t, 1);
}

// One ISA's primitives. rows/x of type f16 are uint16_t IEEE half bits.
struct sparq_isa {
    const char * name;
    // out[h*n + s] = sum_{j<r} qs[h*r + j] * rows[j][s]   (h < g, s < n): from 0, fused multiply-adds
    // for j = 0..r-1 in turn, so every ISA gives the same bits
    void (*approx_f16)(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out);
    void (*approx_f32)(const float    * const * rows, int r, const float * qs, int g, int n, float * out);
    // the same over e5m2 rows (an 8-bit K^T: byte b is the f16 b << 8)
    void (*approx_e5m2)(const uint8_t * const * rows, int r, const float * qs, int g, int n, float * out);
    // the same over 4-bit K^T rows (q4_1 blocks of 32 cells, ggml-sparq-kt4.h), rows[j] at cell 0 and
    // s counted from cell c0: out[h*n + s] = sum_j qs[h*r + j] * value (c0 + s) of rows[j]
    void (*approx_kt4)(const uint8_t * const * rows, int c0, int r, const float * qs, int g, int n, float * out);
    // sum_i exp(x[i] - m); x may hold -INF (contributes 0)
    float (*expsum)(const float * x, int n, float m);
    // the same sum (bit for bit), with y[i] = exp(x[i] - m) stored
    float (*expsum_store)(const float * x, int n, float m, float * y);
    // y[i] += a * exp(x[i] - m)
    void (*exp_acc)(const float * x, int n, float m, float a, float * y);
    float (*max)(const float * x, int n);
    float (*dot_f16)(const float * a, const uint16_t * b, int n);
    float (*dot_f32)(const float * a, const float    * b, int n);
    // y[i] += a * x[i]
    void (*axpy_f16)(float * y, const uint16_t * x, float a, int n);
    void (*axpy_f32)(float * y, const float    * x, float a, int n);
    // the same over a row of q8_0 blocks (n a multiple of SPARQ_QK): a quantized K or V cache
    float (*dot_q8_0)(const float * a, const struct sparq_block_q8_0 * b, int n);
    void (*axpy_q8_0)(float * y, const struct sparq_block_q8_0 * x, float a, int n);
    void (*f16_to_f32)(const uint16_t * x, float * y, int n);
    // the exact attention over a selection, rows of n = d (dv) values at base + idx[t] * stride
    // bytes: out[t] = q . row(idx[t]) (t < n_sel), and y[j] += sum_t p[t] * row(idx[t])[j]
    void (*gather_dot_f16)(const float * q, const void * base, size_t stride, const int32_t * idx, int n_sel, int d,
                           float * out);
    void (*gather_dot_f32)(const float * q, const void * base, size_t stride, const int32_t * idx, int n_sel, int d,
                           float * out);
    void (*gather_axpy_f16)(float * y, const void * base, size_t stride, const int32_t * idx, const float * p,
                            int n_sel, int dv);
    void (*gather_axpy_f32)(float * y, const void * base, size_t stride, const int32_t * idx, const float * p,
                            int n_sel, int dv);
    // the same for g query heads of a KV head at once, each row read once for all of them:
    // out[h * ostride + t] = q[h] . row(idx[t]), and y[h * ystride + j] += sum_t p[h * pstride + t] *
    // row(idx[t])[j] (h < g). Per head the operations and their order are gather_dot's and
    // gather_axpy's, so the results are theirs, bit for bit.
    void (*gather_dot_g_f16)(const float * const * q, int g, const void * base, size_t stride, const int32_t * idx,
                             int n_sel, int d, float * out, size_t ostride);
    void (*gather_dot_g_f32)(const float * const * q, int g, const void * base, size_t stride, const int32_t * idx,
                             int n_sel, int d, float * out, size_t ostride);
    void (*gather_axpy_g_f16)(float * y, size_t ystride, int g, const void * base, size_t stride, const int32_t * idx,
                              const float * p, size_t pstride, int n_sel, int dv);
    void (*gather_axpy_g_f32)(float * y, size_t ystride, int g, const void * base, size_t stride, const int32_t * idx,
                              const float * p, size_t pstride, int n_sel, int dv);
    // indices i < n with x[i] > t, ascending, into idx; returns their number. idx needs 16
    // entries of room past the count (whole vectors are stored)
    int (*filter_gt)(const float * x, int n, float t, int32_t * idx);
    // A gather by list (a vector index's probe): the cells base + i (i < n, ascending) whose list id
    // ids[i] (an integer in f32) names a list with flag[id] != 0, into idx; returns their number. It stops at
    // the first id outside [0, n_list) (a cell in no list yet), setting *stop to its i (else n):
    // the caller files that cell and goes on after it. idx needs 16 entries of room past the count.
    int (*list_gather)(const float * ids, int n, const int32_t * flag, int n_list, int base, int32_t * idx, int * stop);
};

// list_gather without vectors (the scalar and NEON tables): branch-free but for the stop
static inline int sparq_list_gather_ref(const float * ids, int n, const int32_t * flag, int n_list, int base,
                                        int32_t * idx, int * stop) {
    int m = 0;
    for (int i = 0; i < n; ++i) {
        const int li = (int) ids[i];
        if (!(ids[i] >= 0.0f) || (unsigned) li >= (unsigned) n_list) {
            *stop = i;
            return m;
        }
        idx[m] = base + i;
        m += flag[li] != 0;
    }
    *stop = n;
    return m;
}

extern const struct sparq_isa sparq_isa_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const struct sparq_isa sparq_isa_avx2;
extern const struct sparq_isa sparq_isa_avx512;
#endif
#if defined(__aarch64__)
extern const struct sparq_isa sparq_isa_neon;
#endif

// The best ISA this CPU supports, unless the environment variable
// GGML_SPARQ_ISA (scalar, avx2, avx512, neon) names another; an unknown or
// unsupported name aborts with a message (never a silent fallback).
const struct sparq_isa * sparq_isa_select(void);
// By name; NULL when unknown or not supported by this CPU/build.
const struct sparq_isa * sparq_isa_by_name(const char * name);

float sparq_fp16_to_fp32(uint16_t h);
static inline float sparq_e5m2_to_fp32(uint8_t b) { return sparq_fp16_to_fp32((uint16_t) (b << 8)); }
// value c of a 4-bit K^T row (row at cell 0): q d + m, as ggml's q4_1 (exact: d is a power of two)
static inline float sparq_kt4_to_fp32(const uint8_t * row, int64_t c) {
    uint16_t d, m;
    const int q = ggml_sparq_kt4_q(row, c, &d, &m);
    return (float) q * sparq_fp16_to_fp32(d) + sparq_fp16_to_fp32(m);
}
uint16_t sparq_fp32_to_fp16(float f);

// The 4- and 5-bit block types (sparq-cpu-blocks.cpp). Their rows are read as f32, a few blocks at a
// time into the stack, with the ISA's f32 primitives: the values as ggml's dequantize_row_* makes them
typedef void (*sparq_dequant_fn)(const void * block, float * y); // SPARQ_QK values of one block
// the dequantizer of block type t; NULL for f32, f16, q8_0 (the ISAs read its blocks) and e5m2
sparq_dequant_fn sparq_dequant_of(enum sparq_type t);
// n values of a K or V row of any of their types as f32 into y
void sparq_row_to_f32(const struct sparq_isa * isa, enum sparq_type t, const void * row, float * y, int n);
// over a row of a 4- or 5-bit type: out[h * ostride] = q[h] . row (h < g); y[h * ystride + j] +=
// p[h * pstride] * row[j]. With g = 1 the single-query forms; the same per head, bit for bit
void sparq_dot_blocks_g(const struct sparq_isa * isa, enum sparq_type t, const float * const * q, int g,
                        const void * row, int n, float * out, size_t ostride);
void sparq_axpy_blocks_g(const struct sparq_isa * isa, enum sparq_type t, float * y, size_t ystride, int g,
                         const void * row, const float * p, size_t pstride, int n);

// The selector's own inputs (the op's sel[0] and sel[1], ggml-sparq.h): f32 blocks with their
// strides in bytes and their second dimension (ne1), read and written as the selector's file says.
struct sparq_sel_input {
    float * data;
    size_t nb1, nb2, nb3;
    int ne1;
};

struct sparq_args {
    int d, dv;           // head sizes of K and V
    int n_kv;            // cells (S) per stream
    int n_rows;          // query rows per stream
    int n_head, n_head_kv, n_stream;
    int r, k, l;
    float scale;
    int selector;        // how the cells are chosen (steps 1-3): a value of the op's enum ggml_sparq_selector,
                         // the row of sparq-cpu-selectors.cpp; steps 4-5 are shared by every selector
    int per_head;        // 1: each query head picks its own k - l cells, the group attends over their union
    int no_mean_v;       // 1: no mean-value reallocation (out = y)
    int all_dense;       // 1: every row attends over every valid cell (as a stream whose v_count is negative)

    // strides in bytes
    const float * q;  size_t q_nb1, q_nb2, q_nb3;            // [d, n_rows, n_head, n_stream]
    // K and V: f32, f16 or a block type; K^T: f32, f16 (a quantized cache keeps its dequantized keys in f16) or e5m2
    const void * K;   enum sparq_type K_type;  size_t K_nb1, K_nb2, K_nb3;    // [d, n_kv, n_head_kv, n_stream]
    const void * KT;  enum sparq_type KT_type; size_t KT_nb1, KT_nb2, KT_nb3; // [n_kv, d, n_head_kv, n_stream]
    const void * V;   enum sparq_type V_type;  size_t V_nb1, V_nb2, V_nb3;    // [dv, n_kv, n_head_kv, n_stream]
    const float * v_sum; size_t v_sum_nb1, v_sum_nb2;         // [dv, n_head_kv, n_stream]
    // [n_stream] the number of cells in the V sums; a negative entry -n marks a stream whose rows
    // run exact dense attention over all their valid cells (no selection, no mean-V)
    const float * v_count;
    const void * mask; enum sparq_type mask_type; size_t mask_nb1, mask_nb3; int mask_ne3; // NULL: all valid
    float * out; size_t out_nb1, out_nb2, out_nb3;            // [dv, n_head, n_rows, n_stream]
    // optional: the local window's cells per row (the l most recent positions; -1 = none),
    // instead of the last valid cells by index; [win_n, n_rows, n_stream] i32
    const int32_t * win; size_t win_nb1, win_nb2; int win_n;

    // optional: the query in the basis K^T is stored in (a rotation of the keys), used by
    // steps 1-2 instead of q; [d, n_rows, n_head, n_stream] like q
    const float * q_sel; size_t q_sel_nb1, q_sel_nb2, q_sel_nb3;
    // optional: weights of the components in step 1 (the keys' spread per component of
    // that basis), per KV head and stream
    const float * comp_w; size_t comp_w_nb1, comp_w_nb2;       // [d, n_head_kv, 1 or n_stream] (nb2 0: shared)
    int comp_w_sq;       // 1: comp_w holds the sums of k^2, the weights are their square roots
    // optional: the step's append (ggml_sparq_attn_srcs::cells; one query row per stream). In
    // phase_components the thread of each unit (stream s, KV head h) first writes stream s's new cell
    // cells[s] % kv_size into K^T's column, v_sum (compensated with v_comp) and k_sq of head h and,
    // for head 0, v_count and the window's push: KT, v_sum, v_count and win are written then, and
    // read only after that phase's barrier (a selector's prepare hook reads none of them)
    const int64_t * cells; int64_t kv_size;
    float * k_sq; size_t k_sq_nb1, k_sq_nb2;
    float * v_comp; size_t v_comp_nb1, v_comp_nb2;

    // a selector that does not rank scores: its inputs (NULL data where it takes none) and its own
    // parameters, the lists it probes (n_probe) and whether it reports the key rows it read (sel_reads)
    struct sparq_sel_input sel_in[2];
    int n_probe;
    int sel_reads;

    // optional, the selectors that rank scores: the coverage target (estimated attention mass) cov_p > 0.
    // The op ranks the k_rank = max(k, k_scan) best cells and finds the fewest of them which, with
    // the window, hold cov_p of the approximate softmax mass (step 2's weights; GQA: the mean over
    // the group's heads; per head: each head's own). cov_apply = 1: that is the selection (at
    // least k_min, at most k cells); 0: the selection stays the k best and the count is measured.
    float cov_p; int cov_apply; int k_min; int k_scan;
    // optional with cov_apply: k_frac > 0 makes the cap a row's own, min(k, max(k_min, ceil(k_frac *
    // n_valid))) over its stream's valid cells, so that a row's choice does not depend on the other
    // streams of the call (k, the most cells, follows the longest: it sizes the scratch)
    float k_frac;
    // optional, the selectors that rank scores, with a fixed k: topk_buckets > 0 ranks by the approximate
    // bucketed top-k: a cell's bucket is its index mod topk_buckets, each bucket offers its best cell
    // outside the window (ties to the lower cell), the k - l best of those are chosen; 0: exact
    int topk_buckets;
    // optional: what the stream's last row did, per (stream, KV head): 4 floats {cells attended
    // (-1: the row ran dense), its estimated coverage (mean over the group's heads), cells that
    // reach cov_p (window included; -1 without cov_p), 1 if the ranked cells reached cov_p else 0}
    float * report;

    // optional, the attention variants, in every logit (approximate and exact) of every selector's
    // step 4 and of the ranking selectors' steps 1-3: softcap > 0 caps a logit x (scale included) to
    // softcap * tanh(x / softcap) before the mask; max_bias > 0 adds the mask times query head h's
    // ALiBi slope (ggml's soft_max_ext) instead of the mask; sinks ([n_head]) a logit per query head
    // with a zero value row, in every softmax's denominator (the approximate mass alpha counts it);
    // kq_b ([n_kv, n_rows, n_head, 1 or n_stream], rows contiguous) a bias: scale * kq_b is added after
    // the cap, before the mask
    float softcap, max_bias;
    const float * sinks;
    const float * kq_b; size_t kq_b_nb1, kq_b_nb2, kq_b_nb3; int kq_b_ne3;

    // optional, for tests: the selected cells per (stream, row, kv head), ascending,
    // -1 padded; sel_n entries each (k, or g*(k-l)+l with per_head); [sel_n, n_head_kv, n_rows, n_stream]
    int32_t * sel_out; int sel_n;
};

// The driver's selectors: how many, and each value's name (NULL out of range), which the glue checks
// against the op's rows (ggml_sparq_selector_row).
int sparq_cpu_selector_count(void);
const char * sparq_cpu_selector_name(int id);

// Entries per (row, KV head) of sel_out: the most cells a selection can hold.
int sparq_sel_max(const struct sparq_args * a);

// Bytes of scratch sparq_cpu_compute needs with nth threads.
size_t sparq_cpu_work_size(const struct sparq_args * a, int nth);

typedef void (*sparq_barrier_fn)(void * ctx);

// Called by every thread ith in [0, nth) with the same arguments and scratch.
void sparq_cpu_compute(const struct sparq_args * a, const struct sparq_isa * isa,
                       void * wdata, size_t wsize, int ith, int nth,
                       sparq_barrier_fn barrier, void * barrier_ctx);
