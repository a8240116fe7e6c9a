// llama-sparq: test-backend-ops cases for GGML_OP_SPARQ_ATTN.
// Included by tests/test-backend-ops.cpp (patch 0003) after its own test cases;
// uses that file's test_case, VARS_TO_STR*, init_tensor_* helpers.
#pragma once

struct test_sparq_attn : public test_case {
    const int64_t d, kv, nh, nh_kv, nr, ns;
    const int r, k, l;
    const ggml_type type_KV;

    std::string vars() override {
        return VARS_TO_STR10(d, kv, nh, nh_kv, nr, ns, r, k, l, type_KV);
    }

    double max_nmse_err() override { return 5e-4; }

    test_sparq_attn(int64_t d = 128, int64_t kv = 1024, int64_t nh = 32, int64_t nh_kv = 32, int64_t nr = 1,
                    int64_t ns = 1, int r = 16, int k = 128, int l = 32, ggml_type type_KV = GGML_TYPE_F16)
        : d(d), kv(kv), nh(nh), nh_kv(nh_kv), nr(nr), ns(ns), r(r), k(k), l(l), type_KV(type_KV) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, nr, nh, ns);
        ggml_set_name(q, "q");
        ggml_tensor * K = ggml_new_tensor_4d(ctx, type_KV, d, kv, nh_kv, ns);
        ggml_set_name(K, "K");
        ggml_tensor * KT = ggml_new_tensor_4d(ctx, type_KV, kv, d, nh_kv, ns);
        ggml_set_name(KT, "KT");
        ggml_tensor * V = ggml_new_tensor_4d(ctx, type_KV, d, kv, nh_kv, ns);
        ggml_set_name(V, "V");
        ggml_tensor * vs = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, nh_kv, ns);
        ggml_set_name(vs, "v_sum");
        ggml_tensor * vc = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ns);
        ggml_set_name(vc, "v_count");
        ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, kv, nr, 1, ns);
        ggml_set_name(m, "m");
        ggml_tensor * out = ggml_sparq_attn(ctx, q, K, KT, V, vs, vc, m, r, k, l, 1.0f / sqrtf((float) d));
        ggml_set_name(out, "out");
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        ggml_tensor * K = nullptr;
        ggml_tensor * KT = nullptr;
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            if (strcmp(t->name, "m") == 0) {
                init_tensor_kq_mask(t);
            } else if (strcmp(t->name, "v_count") == 0) {
                std::vector<float> c(ggml_nelements(t), (float) kv);
                ggml_backend_tensor_set(t, c.data(), 0, ggml_nbytes(t));
            } else {
                init_tensor_uniform(t);
                if (strcmp(t->name, "K") == 0) K = t;
                if (strcmp(t->name, "KT") == 0) KT = t;
            }
        }
        // K^T is the keys again, cell-contiguous
        if (K && KT) {
            const size_t esz = ggml_type_size(K->type);
            std::vector<uint8_t> src(ggml_nbytes(K)), dst(ggml_nbytes(KT));
            ggml_backend_tensor_get(K, src.data(), 0, src.size());
            for (int64_t b = 0; b < ns * nh_kv; ++b) {
                for (int64_t i = 0; i < kv; ++i) {
                    for (int64_t j = 0; j < d; ++j) {
                        memcpy(&dst[((b * d + j) * kv + i) * esz], &src[((b * kv + i) * d + j) * esz], esz);
                    }
                }
            }
            ggml_backend_tensor_set(KT, dst.data(), 0, dst.size());
        }
    }
};

static void sparq_add_test_cases(std::vector<std::unique_ptr<test_case>> & test_cases, bool perf) {
    if (perf) {
        // Llama 2 7B attention shapes, batch 1
        for (int kv : { 4096, 16384 }) {
            test_cases.emplace_back(new test_sparq_attn(128, kv, 32, 32, 1, 1, 32, 128, 32, GGML_TYPE_F16));
        }
        return;
    }
    for (ggml_type t : { GGML_TYPE_F16, GGML_TYPE_F32 }) {
        for (int64_t kv : { 7, 256, 1000 }) {
            test_cases.emplace_back(new test_sparq_attn(128, kv, 8, 2, 1, 1, 16, 64, 16, t));
            test_cases.emplace_back(new test_sparq_attn(64, kv, 4, 4, 3, 2, 8, 32, 8, t));
        }
        test_cases.emplace_back(new test_sparq_attn(256, 2048, 4, 1, 1, 1, 32, 128, 32, t));
    }
}
