// llama-sparq: llama_sparq_bench_fill, the synthetic fill of a plain KV cache (random K and V,
// cells 0..n-1 of sequence 0) that lets llama-bench time long contexts without a prefill.
#include "llama-sparq-messages.h"
#include "llama-sparq-parallel.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upkeep.h"
#include "llama-sparq-upstream.h"

#include "ggml-sparq.h"

#include "llama-kv-cache-iswa.h"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

// splitmix64: a fast, seedable stream for the synthetic fill
static inline uint64_t sparq_splitmix(uint64_t & x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// fills chunk c (1M values) of a K or V tensor with zero-mean, unit-variance values (triangular: the
// sum of two uniforms, rescaled); each (tensor, chunk) has its own seed, so the values do not depend
// on how many threads fill
constexpr size_t SPARQ_FILL_CHUNK = 1 << 20;

static void sparq_fill_chunk(ggml_tensor * t, uint64_t seed, size_t c) {
    const size_t n = ggml_nelements(t);
    const size_t i0 = c * SPARQ_FILL_CHUNK;
    const size_t m = std::min(SPARQ_FILL_CHUNK, n - i0);
    std::vector<float> f(m);
    uint64_t x = seed ^ (0xD1B54A32D192ED03ull * (c + 1));
    for (size_t i = 0; i < m; i += 2) { // two values per draw, each the sum of two 16-bit uniforms
        const uint64_t r = sparq_splitmix(x);
        const float u0 = (float) (r & 0xFFFF) + (float) ((r >> 16) & 0xFFFF);
        const float u1 = (float) ((r >> 32) & 0xFFFF) + (float) (r >> 48);
        f[i] = (u0 - 65535.0f) * (2.4494897f / 65535.0f); // unit variance: var(2 uniforms) = 1/6
        if (i + 1 < m) {
            f[i + 1] = (u1 - 65535.0f) * (2.4494897f / 65535.0f);
        }
    }
    if (ggml_is_quantized(t->type)) {
        // a quantized cache: the values in its blocks (a chunk is whole blocks: 1M values, rows of whole blocks)
        std::vector<uint8_t> q(ggml_row_size(t->type, (int64_t) m));
        ggml_get_type_traits(t->type)->from_float_ref(f.data(), q.data(), (int64_t) m);
        sparq_tensor_set(t, q.data(), ggml_row_size(t->type, (int64_t) i0), q.size());
    } else if (t->type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> h(m);
        ggml_fp32_to_fp16_row(f.data(), h.data(), (int64_t) m);
        sparq_tensor_set(t, h.data(), i0 * sizeof(ggml_fp16_t), m * sizeof(ggml_fp16_t));
    } else {
        sparq_tensor_set(t, f.data(), i0 * sizeof(float), m * sizeof(float));
    }
}

// one plain cache (every layer's K and V, seeds offset by seed_base) filled for sequence 0 with
// n_tokens positions: cells 0..n-1 hold the last n of them (n = n_tokens, or the cache size for a
// sliding-window cache, whose older positions would be masked anyway)
static int32_t sparq_fill_cache(llama_kv_cache * kv, int32_t n_tokens, bool window, uint64_t seed_base, char * err,
                                size_t err_size) {
    const uint32_t size = upstream::kv_size(kv);
    if (upstream::n_stream(kv) != 1) {
        sparq_err(err, err_size, "synthetic fill: the KV cache has %u streams; only one is supported", upstream::n_stream(kv));
        return -1;
    }
    if (!window && (uint32_t) n_tokens > size) {
        sparq_err(err, err_size, "synthetic fill: n_tokens is %d; allowed 1..%u (the KV cache size)", n_tokens, size);
        return -1;
    }
    const uint32_t n = window ? std::min((uint32_t) n_tokens, size) : (uint32_t) n_tokens;
    llama_kv_cells & cells = upstream::cells_mut(kv, 0);
    if (cells.get_used() != 0) {
        sparq_err(err, err_size, "synthetic fill: the KV cache holds %u cells; clear it first", cells.get_used());
        return -1;
    }
    for (size_t ikv = 0; ikv < upstream::n_layers(kv); ++ikv) {
        for (ggml_tensor * t : { upstream::layer_k(kv, ikv), upstream::layer_v(kv, ikv) }) {
            if (t && !ggml_sparq_cache_type_ok(t->type)) { // (no V: MLA's cache, whose V is in K's rows)
                sparq_err(err, err_size, "synthetic fill: cache tensor %s is %s; f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl are supported",
                          t->name, ggml_type_name(t->type));
                return -1;
            }
        }
    }
    // every (layer, K or V, chunk) a job, on all hardware threads (a 128K-cell fill of a 7B-shaped
    // model is 8.6 G values per 8 layers)
    struct job { ggml_tensor * t; uint64_t seed; size_t c; };
    std::vector<job> jobs;
    for (size_t ikv = 0; ikv < upstream::n_layers(kv); ++ikv) {
        for (size_t j = 0; j < 2; ++j) { // j = 0: K, 1: V (each tensor its own seed)
            ggml_tensor * t = j == 0 ? upstream::layer_k(kv, ikv) : upstream::layer_v(kv, ikv);
            if (!t) {
                continue;
            }
            const size_t n_chunks = ((size_t) ggml_nelements(t) + SPARQ_FILL_CHUNK - 1) / SPARQ_FILL_CHUNK;
            for (size_t c = 0; c < n_chunks; ++c) {
                jobs.push_back({ t, seed_base ^ (2 * ikv + j), c });
            }
        }
    }
    sparq_parallel((int) std::max(1u, std::thread::hardware_concurrency()), jobs.size(),
                   [&](size_t i) { sparq_fill_chunk(jobs[i].t, jobs[i].seed, jobs[i].c); });
    for (uint32_t i = 0; i < n; ++i) {
        cells.pos_set(i, (llama_pos) (n_tokens - (int32_t) n + (int32_t) i));
        cells.seq_add(i, 0);
    }
    upstream::set_head(kv, 0, n % size);
    // the writes done where the cache lives before the timed steps (an RPC host's are queued)
    for (size_t ikv = 0; ikv < upstream::n_layers(kv); ++ikv) {
        sparq_wait_written(upstream::layer_k(kv, ikv));
        if (upstream::layer_v(kv, ikv)) {
            sparq_wait_written(upstream::layer_v(kv, ikv));
        }
    }
    return 0; // the cells' new versions (pos_set) make the next step rebuild K^T and the V sums
}

int32_t llama_sparq_bench_fill(struct llama_context * ctx, int32_t n_tokens, uint32_t seed, char * err,
                               size_t err_size) {
    if (err && err_size) {
        err[0] = '\0';
    }
    if (!ctx) {
        sparq_err(err, err_size, "synthetic fill: ctx must not be NULL");
        return -1;
    }
    if (n_tokens < 1) {
        sparq_err(err, err_size, "synthetic fill: n_tokens is %d; it must be at least 1", n_tokens);
        return -1;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    llama_kv_cache * base = dynamic_cast<llama_kv_cache *>(mem);
    llama_kv_cache * swa = nullptr;
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        // sliding-window layers beside full-attention ones: the window cache holds the last cells
        base = iswa->get_base();
        swa = iswa->get_swa();
    }
    if (!base) {
        sparq_err(err, err_size, "synthetic fill: the model's memory is not a KV cache (plain or sliding-window "
                  "beside full attention); hybrid and recurrent models need a real prefill");
        return -1;
    }
    sparq_llama_sync(ctx);
    const uint64_t seed_hi = (uint64_t) seed << 32;
    if (sparq_fill_cache(base, n_tokens, false, seed_hi, err, err_size) != 0) {
        return -1;
    }
    // the window cache's layers seeded apart from the base cache's
    return swa ? sparq_fill_cache(swa, n_tokens, true, seed_hi ^ (1ull << 31), err, err_size) : 0;
}
