// llama-sparq: upstream's private members as SparQ reaches them: the friend of llama_context,
// llama_kv_cache, llama_kv_cache_context and llama_kv_cells (patches 0005, 0009), so that
// ggml-sparq/llama/ needs no new upstream accessors.
#pragma once

#include "llama-sparq-cells.h"

#include "llama-context.h"
#include "llama-kv-cache.h"

#include <cmath>
#include <cstdint>
#include <vector>

struct llama_sparq_access {
    static llama_cparams & cparams(llama_context * c) { return c->cparams; }
    static const llama_batch_allocr * balloc(llama_context * c) { return c->balloc.get(); }
    static void need_reserve(llama_context * c) { c->sched_need_reserve = true; }
    static const llama_model & model(const llama_context * c) { return c->model; }
    static const std::vector<ggml_backend_ptr> & backends(llama_context * c) { return c->backends; }
    // the graph of the context's last computation (NULL before the first or after a reset)
    static llm_graph_result * last_graph(llama_context * c) { return c->gf_res_prev_active; }

    static uint32_t kv_size(const llama_kv_cache * kv) { return kv->get_size(); }
    static uint32_t n_stream(const llama_kv_cache * kv) { return kv->n_stream; }
    static bool v_trans(const llama_kv_cache * kv) { return kv->v_trans; }
    static size_t n_layers(const llama_kv_cache * kv) { return kv->layers.size(); }
    static uint32_t layer_il(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].il; }
    static ggml_tensor * layer_k(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].k; }
    static ggml_tensor * layer_v(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].v; }
    // upstream's Walsh-Hadamard rotation of q and k for a quantized K cache (llama_kv_cache's attn_rot_k):
    // its size, as build_input_k_rot takes it (the largest power of 2 >= 64 dividing the head size), or 0
    static int64_t k_rot_n(const llama_kv_cache * kv) {
        if (!kv->attn_rot_k || kv->n_embd_head_k_all <= 0) {
            return 0;
        }
        int64_t n = 64;
        while (kv->n_embd_head_k_all % (2 * n) == 0) {
            n *= 2;
        }
        return n;
    }
    // its matrix (n x n, row-major, symmetric: its own inverse); a cache that shares another's cells
    // keeps no copy: then the same construction as upstream's (Sylvester's, entries +-1/sqrt(n))
    static std::vector<float> k_rot_matrix(const llama_kv_cache * kv, int64_t n) {
        const auto it = kv->attn_rot_hadamard.find(n);
        if (it != kv->attn_rot_hadamard.end()) {
            return it->second;
        }
        std::vector<float> h((size_t) n * n);
        h[0] = (float) (1.0 / sqrtf((float) n));
        for (int64_t s = 1; s < n; s *= 2) {
            for (int64_t i = 0; i < s; ++i) {
                for (int64_t j = 0; j < s; ++j) {
                    const float x = h[i * n + j];
                    h[(i + s) * n + j] = x;
                    h[i * n + j + s] = x;
                    h[(i + s) * n + j + s] = -x;
                }
            }
        }
        return h;
    }
    static int32_t ikv_of(const llama_kv_cache * kv, int32_t il) {
        auto it = kv->map_layer_ids.find(il);
        return it == kv->map_layer_ids.end() ? -1 : it->second;
    }
    static const llama_kv_cells & cells(const llama_kv_cache * kv, uint32_t strm) { return kv->v_cells[strm]; }
    // the cells' content versions (patch 0009, llama-sparq-cells.h)
    static uint64_t cells_hash(const llama_kv_cells & c) { return c.sparq_ver.hash; }
    static uint64_t cell_ver_hash(const llama_kv_cells & c, uint32_t i) {
        return llama_sparq_cell_versions::mix(i, c.sparq_ver.ver[i]);
    }
    static llama_kv_cells & cells_mut(llama_kv_cache * kv, uint32_t strm) { return kv->v_cells[strm]; }
    static void set_head(llama_kv_cache * kv, uint32_t strm, uint32_t h) { kv->v_heads[strm] = h; }

    static const llama_kv_cache * cache(const llama_kv_cache_context * m) { return m->kv; }
    static const llama_kv_cache::slot_info & sinfo(const llama_kv_cache_context * m) { return m->sinfos[m->i_cur]; }
    static uint32_t n_kv(const llama_kv_cache_context * m) { return m->n_kv; }
};

// upstream's private members, as SparQ reaches them
using upstream = llama_sparq_access;
