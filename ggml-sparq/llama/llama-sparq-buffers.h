// llama-sparq: the data's tensors and buffers (llama-sparq-buffers.cpp): the full-attention cache
// found, K^T, the sums, the counts, the reports and the device windows allocated per layer (or the
// reason a layer has none), and the one list of the attention variants SparQ does not compute.
#pragma once

#include "llama-sparq-state.h"
#include "llama-sparq.h"

#include "llama-arch.h"
#include "llama-hparams.h"
#include "llama-kv-cache.h"
#include "llama-memory.h"
#include "llama-model.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

// the full-attention cache of a context's memory (plain, iSWA or hybrid), or NULL
llama_kv_cache * sparq_find_cache(llama_memory_t mem);
// allocate the tensors of each buffer type in one zeroed buffer (kept in bufs, counted as SparQ's memory)
bool sparq_alloc_buffers(llama_sparq_ctx & S, const std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> & by_buft,
                         std::vector<ggml_backend_buffer_ptr> & bufs, const char * what, char * err, size_t err_size);
// allocate K^T (of kt_bits) and the V sums for the layers of the cache that can use them
bool sparq_alloc(llama_sparq_ctx & S, const llama_model & model, int32_t kt_bits, char * err, size_t err_size);
// K^T of every SparQ layer again, of kt_bits' type (the old one freed; the caller has the streams rebuilt)
bool sparq_alloc_kt(llama_sparq_ctx & S, int32_t kt_bits, char * err, size_t err_size);
// the device windows' length for settings p (k_min resolved): the local window l where the selector's
// window is the l most recent cells, else 0 (a whole choice's earliest cells come with the host's input)
int32_t sparq_window_cap(const llama_sparq_params & p);
// every SparQ layer's device window of cap entries per stream (none for 0), the old ones freed; every
// stream's window to be uploaded before its next use
bool sparq_alloc_win(llama_sparq_ctx & S, int32_t cap, char * err, size_t err_size);

// what one layer or attention call brings that the model alone does not say: its graph inputs (NULL:
// none) and its head sizes
struct sparq_attn_call {
    const ggml_tensor * kq_b = nullptr;  // a bias added to the attention scores
    const ggml_tensor * sinks = nullptr; // attention sinks
    const ggml_tensor * v_mla = nullptr; // MLA's V projection
    int64_t dk = 0, dv = 0;              // K's and V's head sizes
    int64_t n_head_kv = 0, k_row = 0;    // with n_head_kv > 0: a K cache row holds n_head_kv heads of dk (k_row values)
    int64_t n_head = 0;                  // the query heads (0: unknown)
    int64_t n_kv = 0, n_tokens = 0;      // with n_kv > 0: the call's cells and the ubatch's tokens (kq_b's rows)
    float kq_scale = 1.0f;               // the call's logit scale (1 where the layer alone is asked)
};
// the attention variant SparQ does not compute (a cap or scale the op cannot take, soft-capping after a
// logit scale other than 1, Grok's cap with a second one, K rows that are not the KV heads side by side),
// as a phrase for the log, or NULL: of the model alone (call NULL), or of one layer or call
const char * sparq_attn_variant(llm_arch arch, const llama_hparams & hp, const sparq_attn_call * call);
