// llama-sparq: test-backend-ops cases for GGML_OP_SPARQ_ATTN.
// Included by upstream's tests/test-backend-ops.cpp (patch 0003) after its own test cases;
// uses that file's test_case, VARS_TO_STR*, init_tensor_* helpers and test_flash_attn_ext.
//
// Eval mode compares another backend (CUDA) with the CPU on tie-proof inputs
// (tests/native/sparq-tie-proof.h):
// any difference in the cells chosen is a bug.
#pragma once

#include "ggml-sparq.h"
#include "sparq-tie-proof.h"

#include <cmath>
#include <random>

// f32 values into an f16 or f32 tensor
static void sparq_set_floats(ggml_tensor * t, const std::vector<float> & f) {
    if (t->type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> h(f.size());
        ggml_fp32_to_fp16_row(f.data(), h.data(), (int64_t) f.size());
        ggml_backend_tensor_set(t, h.data(), 0, h.size() * sizeof(ggml_fp16_t));
    } else {
        ggml_backend_tensor_set(t, f.data(), 0, f.size() * sizeof(float));
    }
}

struct test_sparq_attn : public test_case {
    const int64_t d, kv, nh, nh_kv, nr, ns;
    const int r, k, l;
    const ggml_type type_KV;
    const bool mask;    // a 0/-inf mask (causal over the rows, masked blocks); false: every cell valid
    const int sel;      // GGML_SPARQ_SEL_*
    const int flags;    // GGML_SPARQ_FLAG_*
    // 0 plain, 1 window list (src 7), 2 basis (q_sel, comp_w), 3 stream 0 dense (v_count < 0), 4 the
    // attention variants: soft-capping (2), ALiBi (max_bias 8: a valid cell's mask minus its distance
    // to the end, mod 16) and sinks (src 11)
    const int variant;
    // cov_p > 0: the calibrated k (the coverage target applied, at least k_min cells, each row's cap
    // k_frac of its valid cells)
    const float cov_p;
    const int k_min;
    const float k_frac;
    const bool kt8; // K^T in 8 bits (e5m2 in i8) of the keys
    const int buckets; // > 0: the approximate bucketed top-k (topk_buckets; a fixed k)

    std::string vars() override {
        return VARS_TO_STR17(d, kv, nh, nh_kv, nr, ns, r, k, l, type_KV, mask, sel, flags, variant, cov_p, k_min, k_frac) +
               "," + VAR_TO_STR(kt8) + (buckets > 0 ? "," + VAR_TO_STR(buckets) : ""); // (the others' names kept)
    }

    double max_nmse_err() override { return 5e-5; }

    test_sparq_attn(int64_t d = 128, int64_t kv = 1024, int64_t nh = 32, int64_t nh_kv = 32, int64_t nr = 1,
                    int64_t ns = 1, int r = 16, int k = 128, int l = 32, ggml_type type_KV = GGML_TYPE_F16,
                    bool mask = true, int sel = GGML_SPARQ_SEL_SPARQ, int flags = 0, int variant = 0, float cov_p = 0.0f,
                    int k_min = 0, float k_frac = 0.0f, bool kt8 = false, int buckets = 0)
        : d(d), kv(kv), nh(nh), nh_kv(nh_kv), nr(nr), ns(ns), r(r), k(k), l(l), type_KV(type_KV), mask(mask), sel(sel),
          flags(flags), variant(variant), cov_p(cov_p), k_min(k_min), k_frac(k_frac), kt8(kt8),
          buckets(buckets) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, nr, nh, ns);
        ggml_set_name(q, "q");
        ggml_tensor * K = ggml_new_tensor_4d(ctx, type_KV, d, kv, nh_kv, ns);
        ggml_set_name(K, "K");
        ggml_tensor * KT = ggml_new_tensor_4d(ctx, kt8 ? GGML_TYPE_I8 : type_KV, kv, d, nh_kv, ns);
        ggml_set_name(KT, "KT");
        ggml_tensor * V = ggml_new_tensor_4d(ctx, type_KV, d, kv, nh_kv, ns);
        ggml_set_name(V, "V");
        ggml_tensor * vs = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, nh_kv, ns);
        ggml_set_name(vs, "v_sum");
        ggml_tensor * vc = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ns);
        ggml_set_name(vc, "v_count");
        ggml_tensor * m = nullptr;
        if (mask) {
            m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, kv, nr, 1, ns);
            ggml_set_name(m, "m");
        }
        ggml_sparq_attn_srcs src = {};
        src.q = q; src.k = K; src.kt = KT; src.v = V; src.v_sum = vs; src.v_count = vc; src.mask = m;
        ggml_sparq_attn_params p = ggml_sparq_attn_params_default(r, k, l, 1.0f / sqrtf((float) d));
        p.selector = sel;
        p.flags = flags;
        if (cov_p > 0.0f) {
            p.cov_p = cov_p;
            p.k_min = k_min;
            p.cov_apply = true;
            p.k_frac = k_frac;
        }
        p.topk_buckets = buckets;
        if (variant == 1) {
            src.win = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, std::max(l, 1), nr, ns);
            ggml_set_name(src.win, "win");
        } else if (variant == 2) {
            src.sel[0] = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, nr, nh, ns);
            ggml_set_name(src.sel[0], "q_sel");
            src.sel[1] = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, nh_kv, ns);
            ggml_set_name(src.sel[1], "comp_w");
        } else if (variant == 4) {
            p.softcap = 2.0f;
            p.max_bias = 8.0f;
            src.sinks = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, nh);
            ggml_set_name(src.sinks, "sinks");
        }
        ggml_tensor * out = ggml_sparq_attn_ext(ctx, &src, &p);
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        std::mt19937 gen(0x5A17u + (uint32_t) (d * 131 + kv * 7 + nh * 3 + ns + r + k + l + variant));
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f), wdis(0.5f, 2.0f);
        const int rr = ggml_sparq_selector_row(sel)->every_component ? (int) d : r; // the components it ranks by
        const sparq_tie_proof tp((int) d, rr, gen);
        ggml_tensor * K = nullptr;
        ggml_tensor * KT = nullptr;
        std::vector<float> kf;
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            const std::string name = t->name;
            std::vector<float> f(ggml_nelements(t));
            if (name == "out") {
                continue;
            } else if (name == "q") {
                if (variant == 2) {
                    for (auto & x : f) {
                        x = uni(gen);
                    }
                } else {
                    tp.query(f, gen); // the query that steps 1-2 use is the robust one
                }
                sparq_set_floats(t, f);
            } else if (name == "q_sel") {
                tp.query(f, gen);
                sparq_set_floats(t, f);
            } else if (name == "comp_w") {
                for (auto & x : f) {
                    x = wdis(gen);
                }
                sparq_set_floats(t, f);
            } else if (name == "K") {
                tp.keys(f, gen); // [d, kv, nh_kv, ns]
                sparq_set_floats(t, f);
                K = t;
            } else if (name == "KT") {
                KT = t;
            } else if (name == "v_count") {
                for (int64_t s = 0; s < ns; ++s) {
                    f[s] = (float) kv;
                }
                if (variant == 3) {
                    f[0] = -(float) kv; // stream 0 runs exact dense attention
                }
                sparq_set_floats(t, f);
            } else if (name == "m") {
                // [kv, nr, 1, ns]: row i of a stream sees the cells < kv - (nr - 1 - i), minus
                // masked blocks of 32 cells (about a fifth of them)
                for (int64_t st = 0; st < ns; ++st) {
                    std::vector<char> blk((kv + 31) / 32);
                    for (auto & b : blk) {
                        b = (gen() % 5) == 0;
                    }
                    for (int64_t i = 0; i < nr; ++i) {
                        for (int64_t c = 0; c < kv; ++c) {
                            const bool valid = c < kv - (nr - 1 - i) && !blk[c / 32];
                            const float bias = variant == 4 ? -(float) ((kv - 1 - c) % 16) : 0.0f;
                            f[(st * nr + i) * kv + c] = valid ? bias : -INFINITY;
                        }
                    }
                }
                sparq_set_floats(t, f);
            } else if (name == "win") {
                // [w, nr, ns]: cells of "recent positions": distinct and repeated, masked, and -1
                std::vector<int32_t> w(ggml_nelements(t));
                for (size_t i = 0; i < w.size(); ++i) {
                    const uint32_t x = gen();
                    w[i] = (x % 11) == 0 ? -1 : (x % 7) == 0 && i > 0 ? w[i - 1] : (int32_t) (x % kv);
                }
                ggml_backend_tensor_set(t, w.data(), 0, w.size() * sizeof(int32_t));
            } else {
                for (auto & x : f) {
                    x = uni(gen);
                }
                sparq_set_floats(t, f);
            }
        }
        // K^T is the keys again, cell-contiguous (e5m2 of them with kt8)
        if (K && KT) {
            const size_t esz = ggml_type_size(K->type), tsz = ggml_type_size(KT->type);
            std::vector<uint8_t> src(ggml_nbytes(K)), dst(ggml_nbytes(KT));
            ggml_backend_tensor_get(K, src.data(), 0, src.size());
            for (int64_t b = 0; b < ns * nh_kv; ++b) {
                for (int64_t i = 0; i < kv; ++i) {
                    for (int64_t j = 0; j < d; ++j) {
                        const uint8_t * x = &src[((b * kv + i) * d + j) * esz];
                        uint8_t * y = &dst[((b * d + j) * kv + i) * tsz];
                        if (kt8) {
                            *y = ggml_sparq_f16_to_e5m2(esz == 2 ? *(const ggml_fp16_t *) x : ggml_fp32_to_fp16(*(const float *) x));
                        } else {
                            memcpy(y, x, esz);
                        }
                    }
                }
            }
            ggml_backend_tensor_set(KT, dst.data(), 0, dst.size());
        }
    }
};

// The 8-bit K^T's writes (ggml_sparq_kt_append): n rows of ne0 f32 or f16 values as e5m2 into the rows
// idx names of an i8 tensor of n_dst rows (a shuffled subset), or into its first n rows without idx;
// the values cover e5m2's range, its ties, saturation and subnormals
struct test_sparq_kt_append : public test_case {
    const ggml_type type_src;
    const int64_t ne0, n, n_dst;
    const bool with_idx;

    std::string vars() override { return VARS_TO_STR5(type_src, ne0, n, n_dst, with_idx); }

    test_sparq_kt_append(ggml_type type_src = GGML_TYPE_F32, int64_t ne0 = 1, int64_t n = 256, int64_t n_dst = 1024,
                         bool with_idx = true)
        : type_src(type_src), ne0(ne0), n(n), n_dst(n_dst), with_idx(with_idx) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * dst = ggml_new_tensor_2d(ctx, GGML_TYPE_I8, ne0, n_dst);
        ggml_set_name(dst, "dst");
        ggml_tensor * src = ggml_new_tensor_2d(ctx, type_src, ne0, n);
        ggml_set_name(src, "src");
        ggml_tensor * idx = nullptr;
        if (with_idx) {
            idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n);
            ggml_set_name(idx, "idx");
        } else {
            dst = ggml_view_2d(ctx, dst, ne0, n, dst->nb[1], 0);
        }
        ggml_tensor * out = ggml_sparq_kt_append(ctx, dst, src, idx);
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        std::mt19937 gen(0xE5u + (uint32_t) (ne0 * 7 + n));
        std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
        std::uniform_int_distribution<int> ex(-20, 17);
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            if (ggml_is_view_op(t->op) || t->op == GGML_OP_SPARQ_ATTN) {
                continue;
            }
            if (t->type == GGML_TYPE_I64) {
                init_set_rows_row_ids(t, (int) n_dst);
            } else if (t->type == GGML_TYPE_I8) {
                std::vector<uint8_t> b(ggml_nbytes(t));
                for (auto & x : b) {
                    x = (uint8_t) gen();
                }
                ggml_backend_tensor_set(t, b.data(), 0, b.size());
            } else {
                std::vector<float> f(ggml_nelements(t));
                for (auto & x : f) {
                    x = std::ldexp(mant(gen), ex(gen)); // 2^-21 .. 2^17: subnormals to beyond 57344
                }
                sparq_set_floats(t, f);
            }
        }
    }
};

// A ubatch's keys at its cells (ggml_sparq_cell_scatter): n tokens of E = e1 * e2 values, f32 or f16,
// into a [kv, e1, e2, ns] tensor of dst_type (f32, f16, or i8 as e5m2) at distinct (stream, cell)
// pairs given as upstream's K row index (stream * kv + cell); with w > 0 the cells also pushed into
// windows of w entries per stream (ggml_sparq_cell_scatter_set_window; a stream may come twice), which
// the output brings out after the cells (as f32, beside an f32 or f16 dst)
struct test_sparq_cell_scatter : public test_case {
    const ggml_type type_src, type_dst;
    const int64_t kv, e1, e2, ns, n, w;

    std::string vars() override { return VARS_TO_STR8(type_src, type_dst, kv, e1, e2, ns, n, w); }

    // named by the op under test, not by the concat that brings the windows out with it
    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "SPARQ_ATTN";
    }

    test_sparq_cell_scatter(ggml_type type_src = GGML_TYPE_F32, ggml_type type_dst = GGML_TYPE_F16, int64_t kv = 256,
                            int64_t e1 = 64, int64_t e2 = 2, int64_t ns = 2, int64_t n = 2, int64_t w = 0)
        : type_src(type_src), type_dst(type_dst), kv(kv), e1(e1), e2(e2), ns(ns), n(n), w(w) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * dst = ggml_new_tensor_4d(ctx, type_dst, kv, e1, e2, ns);
        ggml_set_name(dst, "dst");
        ggml_tensor * src = ggml_new_tensor_2d(ctx, type_src, e1 * e2, n);
        ggml_set_name(src, "src");
        ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n);
        ggml_set_name(idx, "idx");
        ggml_tensor * out = ggml_sparq_cell_scatter(ctx, dst, src, idx);
        if (w > 0) {
            GGML_ASSERT(type_dst != GGML_TYPE_I8);
            ggml_tensor * win = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, w, ns);
            ggml_set_name(win, "win");
            ggml_sparq_cell_scatter_set_window(out, win);
            // the cells first (a source of the concat before the windows' cast), so that the cast reads
            // the windows after the push
            ggml_tensor * cells = ggml_reshape_1d(ctx, ggml_cast(ctx, out, GGML_TYPE_F32), ggml_nelements(out));
            out = ggml_concat(ctx, cells, ggml_reshape_1d(ctx, ggml_cast(ctx, win, GGML_TYPE_F32), w * ns), 0);
        }
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        std::mt19937 gen(0xC5u + (uint32_t) (kv * 5 + n));
        std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
        std::uniform_int_distribution<int> ex(-20, 17);
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            if (ggml_is_view_op(t->op) || t->op != GGML_OP_NONE) {
                continue;
            }
            if (t->type == GGML_TYPE_I32) {
                std::vector<int32_t> b(ggml_nelements(t));
                for (auto & x : b) {
                    x = (int32_t) (gen() % (kv + 1)) - 1; // cells, and -1 for none
                }
                ggml_backend_tensor_set(t, b.data(), 0, b.size() * sizeof(int32_t));
            } else if (t->type == GGML_TYPE_I64) {
                init_set_rows_row_ids(t, (int) (kv * ns)); // distinct stream * kv + cell
            } else if (t->type == GGML_TYPE_I8) {
                std::vector<uint8_t> b(ggml_nbytes(t));
                for (auto & x : b) {
                    x = (uint8_t) gen();
                }
                ggml_backend_tensor_set(t, b.data(), 0, b.size());
            } else {
                std::vector<float> f(ggml_nelements(t));
                for (auto & x : f) {
                    x = std::ldexp(mant(gen), ex(gen)); // 2^-21 .. 2^17: f16's and e5m2's roundings
                }
                sparq_set_floats(t, f);
            }
        }
    }
};

// A decode step's sum append (ggml_sparq_sum_append): n values per stream rounded to the cache type
// (squared with squares) into per-stream rows of a wider tensor (a row stride of its own), Kahan-
// compensated with comp. The output puts the sums and, after them, the compensation written in place.
struct test_sparq_sum_append : public test_case {
    const ggml_type type;
    const int64_t n, ns;
    const bool with_comp, squares;

    std::string vars() override { return VARS_TO_STR5(type, n, ns, with_comp, squares); }

    // named by the op under test, not by the concat that brings the compensation out with it
    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return "SPARQ_ATTN";
    }

    test_sparq_sum_append(ggml_type type = GGML_TYPE_F16, int64_t n = 576, int64_t ns = 2, bool with_comp = true,
                          bool squares = false)
        : type(type), n(n), ns(ns), with_comp(with_comp), squares(squares) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * sum_all = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n + 8, ns);
        ggml_set_name(sum_all, "sum");
        ggml_tensor * sum = ggml_view_2d(ctx, sum_all, n, ns, sum_all->nb[1], 4 * sizeof(float));
        ggml_tensor * comp = nullptr;
        if (with_comp) {
            ggml_tensor * comp_all = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n + 8, ns);
            ggml_set_name(comp_all, "comp");
            comp = ggml_view_2d(ctx, comp_all, n, ns, comp_all->nb[1], 4 * sizeof(float));
        }
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, ns);
        ggml_set_name(x, "x");
        ggml_tensor * out = ggml_sparq_sum_append(ctx, sum, comp, x, type, squares);
        if (comp) {
            // after the append (a source of the concat), so that it reads the written compensation
            out = ggml_concat(ctx, ggml_cont(ctx, out), ggml_cont(ctx, ggml_view_2d(ctx, comp, n, ns, comp->nb[1], 0)), 0);
        }
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        std::mt19937 gen(0x5Au + (uint32_t) (n * 3 + ns));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            if (ggml_is_view_op(t->op) || t->op != GGML_OP_NONE) {
                continue;
            }
            std::vector<float> f(ggml_nelements(t));
            const bool is_sum = strcmp(t->name, "sum") == 0, is_comp = strcmp(t->name, "comp") == 0;
            for (auto & x : f) {
                // sums of about a thousand cells, compensations of a rounding's size, new values near 1
                x = is_sum ? 40.0f * nd(gen) : is_comp ? 1e-6f * nd(gen) : 1.7f * nd(gen);
            }
            sparq_set_floats(t, f);
        }
    }
};

static void sparq_add_test_cases(std::vector<std::unique_ptr<test_case>> & test_cases, bool perf) {
    // SPARQ_PERF_EVAL=1: the eval grid in perf mode too (builds and runs every case on one
    // backend, e.g. the CPU on a machine without a second backend to compare with)
    const char * pe = getenv("SPARQ_PERF_EVAL");
    if (perf && pe && atoi(pe) != 0) {
        sparq_add_test_cases(test_cases, false);
    }
    if (perf) {
        // Llama 2 7B attention shapes, batch 1 (the CPU perf run of the suite)
        for (int kv : { 4096, 16384 }) {
            test_cases.emplace_back(new test_sparq_attn(128, kv, 32, 32, 1, 1, 32, 128, 32, GGML_TYPE_F16, true));
        }
        // SPARQ_PERF_GPU=1: the GPU op microbenchmark: Llama 2 7B attention (32 heads, d = 128, f16
        // cache), S 4K..256K, batch (sequences) 1 and 8, r 16/32/64 at k = 128, k 64/256 at r = 32,
        // and the calibrated k (the defaults: r = 32, coverage 0.95, k_min 128, cap a quarter of the
        // cells), next to ggml's flash attention on the same shapes
        const char * gpu = getenv("SPARQ_PERF_GPU");
        if (gpu && atoi(gpu) != 0) {
            for (int ns : { 1, 8 }) {
                for (int kv : { 4096, 16384, 65536, 262144 }) {
                    if (ns == 8 && kv > 65536) {
                        continue; // 8 x 256K cells of K, K^T and V do not fit next to flash attention's
                    }
                    test_cases.emplace_back(new test_flash_attn_ext(128, 128, 32, { 1, ns }, kv, 1, true, false, 0.0f, 0.0f,
                                                                    GGML_PREC_F32, GGML_TYPE_F16, GGML_TYPE_F16));
                    for (int r : { 16, 32, 64 }) {
                        test_cases.emplace_back(new test_sparq_attn(128, kv, 32, 32, 1, ns, r, 128, 32, GGML_TYPE_F16, true));
                    }
                    for (int k : { 64, 256 }) {
                        test_cases.emplace_back(new test_sparq_attn(128, kv, 32, 32, 1, ns, 32, k, k / 4, GGML_TYPE_F16, true));
                    }
                    test_cases.emplace_back(new test_sparq_attn(128, kv, 32, 32, 1, ns, 32, kv / 4, 32, GGML_TYPE_F16, true,
                                                                GGML_SPARQ_SEL_SPARQ, 0, 0, 0.95f, 128, 0.25f));
                }
            }
        }
        return;
    }
    const int ORA = GGML_SPARQ_SEL_ORACLE, SPQ = GGML_SPARQ_SEL_SPARQ;
    const int PH = GGML_SPARQ_FLAG_PER_HEAD, NMV = GGML_SPARQ_FLAG_NO_MEAN_V;
    for (ggml_type t : { GGML_TYPE_F16, GGML_TYPE_F32 }) {
        // head sizes x GQA (1, 4, 8) x sequences; S = 1000 (not a multiple of 8: scalar K^T loads)
        // and 4096 (vector loads)
        for (int64_t d : { 64, 128, 256 }) {
            for (auto hh : { std::array<int64_t, 2>{ 8, 8 }, std::array<int64_t, 2>{ 8, 2 }, std::array<int64_t, 2>{ 16, 2 } }) {
                for (int64_t ns : { 1, 3 }) {
                    for (int64_t kv : { 1000, 4096 }) {
                        test_cases.emplace_back(new test_sparq_attn(d, kv, hh[0], hh[1], 1, ns, (int) d / 4, 128, 32, t));
                    }
                }
            }
        }
        // k >= S (dense over the valid cells), k == S, tiny S
        test_cases.emplace_back(new test_sparq_attn(128, 100, 8, 2, 1, 2, 16, 128, 32, t));
        test_cases.emplace_back(new test_sparq_attn(128, 128, 8, 2, 1, 2, 16, 128, 32, t, false));
        test_cases.emplace_back(new test_sparq_attn(64, 7, 4, 4, 1, 1, 8, 32, 8, t));
        // l = 0; l = k (only the window); r = d; exact scores (every component); no mask
        test_cases.emplace_back(new test_sparq_attn(128, 2048, 8, 2, 1, 2, 16, 64, 0, t));
        test_cases.emplace_back(new test_sparq_attn(128, 2048, 8, 2, 1, 2, 16, 64, 64, t));
        test_cases.emplace_back(new test_sparq_attn(128, 2048, 8, 8, 1, 1, 128, 64, 16, t));
        test_cases.emplace_back(new test_sparq_attn(128, 2048, 8, 2, 1, 2, 16, 64, 16, t, true, ORA));
        test_cases.emplace_back(new test_sparq_attn(128, 2048, 8, 2, 1, 2, 16, 64, 16, t, false));
        // several query rows per stream (all-rows evaluation: causal rows, mean-V leaves out later cells)
        test_cases.emplace_back(new test_sparq_attn(64, 1000, 4, 4, 3, 2, 8, 32, 8, t));
        test_cases.emplace_back(new test_sparq_attn(128, 3000, 8, 2, 4, 1, 32, 128, 32, t));
        // selection variants: per-head choice, no mean-V, both; window list; basis; a dense stream
        for (int fl : { PH, NMV, PH | NMV }) {
            test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 2, 32, 128, 32, t, true, SPQ, fl));
            test_cases.emplace_back(new test_sparq_attn(64, 4096, 16, 2, 1, 1, 16, 64, 16, t, true, SPQ, fl));
        }
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 2, 2, 32, 128, 32, t, true, SPQ, 0, 1));
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 2, 32, 128, 32, t, true, SPQ, PH, 1));
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 2, 32, 128, 32, t, true, SPQ, 0, 2));
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 3, 32, 128, 32, t, true, SPQ, 0, 3));
        // the attention variants: GQA shared over two streams, 6 heads per head with the calibrated k, dense rows
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 2, 32, 128, 32, t, true, SPQ, 0, 4));
        test_cases.emplace_back(new test_sparq_attn(64, 1024, 6, 2, 1, 1, 16, 256, 16, t, true, SPQ, PH, 4, 0.5f, 16, 0.25f));
        test_cases.emplace_back(new test_sparq_attn(128, 100, 8, 2, 1, 2, 16, 128, 32, t, true, SPQ, 0, 4));
        // odd head size, 16 heads per KV head, long contexts (S up to 64K, 1-4 sequences)
        test_cases.emplace_back(new test_sparq_attn(80, 2048, 16, 1, 1, 2, 20, 128, 32, t));
        test_cases.emplace_back(new test_sparq_attn(128, 16384, 32, 32, 1, 4, 32, 128, 32, t));
        test_cases.emplace_back(new test_sparq_attn(256, 32768, 8, 1, 1, 1, 64, 256, 64, t));
        test_cases.emplace_back(new test_sparq_attn(128, 65536, 8, 2, 1, 2, 32, 128, 32, t));
        test_cases.emplace_back(new test_sparq_attn(64, 65536, 4, 4, 1, 4, 16, 512, 128, t, true, SPQ, NMV));
        // the calibrated k: cuts inside (k_min, cap) on MHA, shared GQA, per-head with a window
        // list, several rows, and units found diffuse (coverage 0.95 on these inputs)
        test_cases.emplace_back(new test_sparq_attn(64, 2048, 4, 4, 1, 1, 16, 512, 32, t, true, SPQ, 0, 0, 0.4f, 64, 0.3f));
        test_cases.emplace_back(new test_sparq_attn(128, 1000, 8, 2, 1, 2, 16, 256, 16, t, true, SPQ, 0, 0, 0.3f, 8, 0.25f));
        test_cases.emplace_back(new test_sparq_attn(64, 1024, 8, 2, 1, 1, 16, 256, 16, t, true, SPQ, PH, 1, 0.5f, 16, 0.25f));
        test_cases.emplace_back(new test_sparq_attn(128, 3000, 8, 2, 4, 1, 32, 750, 32, t, true, SPQ, 0, 0, 0.5f, 64, 0.25f));
        test_cases.emplace_back(new test_sparq_attn(128, 1000, 8, 2, 1, 2, 16, 256, 16, t, true, SPQ, 0, 0, 0.95f, 16, 0.25f));
        test_cases.emplace_back(new test_sparq_attn(128, 65536, 8, 2, 1, 2, 32, 16384, 32, t, true, SPQ, 0, 0, 0.5f, 128, 0.25f));
        // K^T in 8 bits (e5m2): vector and scalar loads, GQA, per head, the calibrated k; its writes
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 2, 32, 128, 32, t, true, SPQ, 0, 0, 0.0f, 0, 0.0f, true));
        test_cases.emplace_back(new test_sparq_attn(64, 1000, 8, 8, 1, 1, 16, 64, 16, t, true, SPQ, 0, 0, 0.0f, 0, 0.0f, true));
        test_cases.emplace_back(new test_sparq_attn(64, 4096, 16, 2, 1, 1, 16, 64, 16, t, true, SPQ, PH, 0, 0.0f, 0, 0.0f, true));
        test_cases.emplace_back(new test_sparq_attn(128, 1000, 8, 2, 1, 2, 16, 256, 16, t, true, SPQ, 0, 0, 0.3f, 8, 0.25f, true));
        // the bucketed top-k: as many buckets as k (GQA shared, two streams), per-head with a window
        // list, exact scores over several selection tiles with a bucket's cells in each
        test_cases.emplace_back(new test_sparq_attn(128, 4096, 8, 2, 1, 2, 32, 128, 32, t, true, SPQ, 0, 0, 0.0f, 0, 0.0f, false, 128));
        test_cases.emplace_back(new test_sparq_attn(64, 4096, 16, 2, 1, 1, 16, 64, 16, t, true, SPQ, PH, 1, 0.0f, 0, 0.0f, false, 200));
        test_cases.emplace_back(new test_sparq_attn(128, 16384, 8, 8, 2, 1, 32, 128, 32, t, true, ORA, 0, 0, 0.0f, 0, 0.0f, false, 1000));
        test_cases.emplace_back(new test_sparq_kt_append(t, 1, 256, 1024, true));
        test_cases.emplace_back(new test_sparq_kt_append(t, 1000, 64, 64, false));
        test_cases.emplace_back(new test_sparq_sum_append(t, 576, 2, true, false));
        test_cases.emplace_back(new test_sparq_sum_append(t, 4096, 1, false, true));
        test_cases.emplace_back(new test_sparq_sum_append(t, 192, 3, true, true));
        // the appends' K^T writes at upstream's K row index, into each K^T type; a per-cell f32 tensor
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F16, 256, 128, 8, 1, 1));
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F32, 300, 64, 2, 3, 6));
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_I8, 1000, 64, 4, 2, 64));
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F32, 512, 4, 1, 2, 2));
        // with the local windows' pushes: one entry, a decode step's, over a block's width, a stream twice
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F16, 256, 64, 2, 1, 1, 1));
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F16, 300, 64, 4, 4, 4, 32));
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F32, 1000, 16, 2, 3, 3, 700));
        test_cases.emplace_back(new test_sparq_cell_scatter(t, GGML_TYPE_F32, 64, 4, 1, 2, 6, 5));
    }
}
