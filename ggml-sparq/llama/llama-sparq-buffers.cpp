// llama-sparq: the SparQ data's tensors and buffers: the full-attention cache found, K^T, the V sums,
// the counts, the reports and the device windows allocated per layer (or the reason a layer has none).
#include "llama-sparq-buffers.h"

#include "llama-sparq-elems.h"
#include "llama-sparq-messages.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "ggml-alloc.h"
#include "ggml-sparq.h"
#include "llama-impl.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

llama_kv_cache * sparq_find_cache(llama_memory_t mem) {
    if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        return kv;
    }
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return iswa->get_base();
    }
    if (auto * hyb = dynamic_cast<llama_memory_hybrid *>(mem)) {
        return hyb->get_mem_attn();
    }
    return nullptr;
}

// allocate the tensors of each buffer type in one zeroed buffer (kept in bufs, counted as SparQ's memory)
bool sparq_alloc_buffers(llama_sparq_ctx & S,
                         const std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> & by_buft,
                         std::vector<ggml_backend_buffer_ptr> & bufs, const char * what, char * err,
                         size_t err_size) {
    for (const auto & [buft, tensors] : by_buft) {
        size_t total = 0;
        for (ggml_tensor * t : tensors) {
            total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), ggml_backend_buft_get_alignment(buft));
        }
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, total + ggml_backend_buft_get_alignment(buft));
        if (!buf) {
            sparq_err(err, err_size, "SparQ: cannot allocate %.1f MiB for %s in %s", total / 1048576.0, what,
                      ggml_backend_buft_name(buft));
            return false;
        }
        ggml_tallocr ta = ggml_tallocr_new(buf);
        for (ggml_tensor * t : tensors) {
            ggml_tallocr_alloc(&ta, t);
        }
        ggml_backend_buffer_clear(buf, 0);
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        S.mem.extra_bytes += ggml_backend_buffer_get_size(buf);
        bufs.emplace_back(buf);
    }
    return true;
}

// The one list of the attention variants SparQ's op does not compute: the model's, known before any
// graph (so that a context with no other layer is refused), and, with `call`, one layer's or one
// attention call's at graph build. Soft-capping, ALiBi, sinks and a KQ bias are the op's
// (ggml_sparq_attn_params, ggml_sparq_attn_srcs::sinks and kq_b): soft-capping as flash attention caps (the scale first), which is the
// other dense path's only with a logit scale of 1. Grok's cap * tanh(q.k * out_scale / cap) is the
// op's soft-cap with the logit scale times out_scale (sparq_logit_scale), again only with a logit
// scale of 1 (its graph's). K and V head sizes may differ, and MLA's absorbed
// decode (one latent KV head, V the first dv values of each K row, then the v_mla projection) is GQA
// with every query head in one group
const char * sparq_attn_variant(llm_arch arch, const llama_hparams & hp, const sparq_attn_call * call) {
    if (arch == LLM_ARCH_GROK && !(std::isfinite(hp.f_attn_logit_softcapping) && hp.f_attn_logit_softcapping > 0.0f)) {
        return "Grok's attention with a soft-cap that is not finite and > 0";
    }
    if (arch == LLM_ARCH_GROK && !(std::isfinite(hp.f_attn_out_scale) && hp.f_attn_out_scale > 0.0f)) {
        return "Grok's attention with an output scale that is not finite and > 0";
    }
    if (arch == LLM_ARCH_GROK && hp.attn_soft_cap) {
        return "Grok's attention with a second soft-cap";
    }
    if (hp.attn_soft_cap && !(std::isfinite(hp.f_attn_logit_softcapping) && hp.f_attn_logit_softcapping > 0.0f)) {
        return "attention logit soft-capping by a value that is not finite and > 0";
    }
    if (hp.f_max_alibi_bias < 0.0f || !std::isfinite(hp.f_max_alibi_bias)) {
        return "ALiBi with a max_bias that is not finite and >= 0";
    }
    if (!call) {
        return nullptr;
    }
    if (call->kq_b && (call->kq_b->type != GGML_TYPE_F32 || call->kq_b->nb[0] != sizeof(float) || call->kq_b->ne[3] != 1 ||
                       (call->n_kv > 0 && (call->kq_b->ne[0] != call->n_kv || call->kq_b->ne[1] != call->n_tokens)) ||
                       (call->n_head > 0 && call->kq_b->ne[2] != call->n_head))) {
        return "a bias added to the attention scores that is not f32 [n_kv, n_tokens, n_head]";
    }
    if (hp.attn_soft_cap && call->kq_scale != 1.0f) {
        return "attention logit soft-capping with a logit scale other than 1 (upstream's two dense paths differ)";
    }
    if (arch == LLM_ARCH_GROK && call->kq_scale != 1.0f) {
        return "Grok's attention with a logit scale other than 1 (upstream's two dense paths differ)";
    }
    if (call->sinks && (call->sinks->type != GGML_TYPE_F32 || !ggml_is_contiguous(call->sinks) ||
                        (call->n_head > 0 && ggml_nelements(call->sinks) != call->n_head))) {
        return "attention sinks that are not f32, one per query head";
    }
    if (call->n_head_kv > 0 && call->dk * call->n_head_kv != call->k_row) {
        return "K rows that are not the KV heads side by side";
    }
    return nullptr;
}

// where the host reads each layer's report (sparq_report_entries), every entry SPARQ_REPORT_TAKEN
static void sparq_alloc_reports(llama_sparq_ctx & S) {
    bool said = false;
    for (sparq_layer & L : S.layers) {
        sparq_report_entries & E = L.report.entries;
        E = sparq_report_entries();
        ggml_tensor * t = L.data.report;
        if (!t) {
            continue;
        }
        E.n = (size_t) ggml_nelements(t);
        if (ggml_backend_buffer_is_host(t->buffer)) {
            E.host = (float *) t->data;
        } else {
            // a device's report: read through a page-locked copy (none on an RPC host, whose device has no
            // host buffer type: its op is asked for no report)
            ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
            ggml_backend_buffer_type_t hbt = dev ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
            ggml_backend_buffer_t buf = hbt && ggml_backend_buft_is_host(hbt) ?
                                            ggml_backend_buft_alloc_buffer(hbt, E.n * sizeof(float)) : nullptr;
            // (a host buffer type may fall back to pageable memory, into which a copy would wait)
            if (buf && ggml_backend_buffer_get_type(buf) != hbt) {
                ggml_backend_buffer_free(buf);
                buf = nullptr;
            }
            if (!buf) {
                if (hbt && !said) {
                    said = true;
                    LLAMA_LOG_WARN("%s: no page-locked host memory for the op's report on %s (layer %d): the counters "
                                   "count its estimate there\n", __func__, ggml_backend_dev_name(dev), L.il);
                }
                continue;
            }
            E.mirror_buf.reset(buf, ggml_backend_buffer_free);
            E.host = (float *) ggml_backend_buffer_get_base(buf);
        }
        std::fill(E.begin(), E.end(), SPARQ_REPORT_TAKEN);
    }
}

// allocate K^T (of kt_bits) and the V sums for the layers of the cache that can use them
bool sparq_alloc(llama_sparq_ctx & S, const llama_model & model, int32_t kt_bits, char * err, size_t err_size) {
    const llama_kv_cache * kv = S.kv;
    const char * variant = sparq_attn_variant(model.arch, model.hparams, nullptr);
    const uint32_t n_stream = upstream::n_stream(kv);
    const size_t nl = upstream::n_layers(kv);
    S.layers.assign(nl, sparq_layer());
    S.streams.assign(n_stream, sparq_stream_state());

    ggml_init_params ip = { (nl * 7 + 1) * ggml_tensor_overhead(), nullptr, true };
    S.mem.ctx.reset(ggml_init(ip));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    // upstream's Hadamard rotation of q and k (a quantized K cache): one copy per buffer type
    S.hadamard.n = upstream::k_rot_n(kv);
    std::map<ggml_backend_buffer_type_t, ggml_tensor *> hrot;
    for (size_t ikv = 0; ikv < nl; ++ikv) {
        const uint32_t il = upstream::layer_il(kv, ikv);
        ggml_tensor * k = upstream::layer_k(kv, ikv);
        ggml_tensor * v = upstream::layer_v(kv, ikv);
        sparq_layer & L = S.layers[ikv];
        // a cache without V (MLA's: V is the first dv values of each K row, as upstream's graph views it)
        const bool v_in_k = v == nullptr;
        L.il = (int32_t) il;
        if (model.hparams.is_swa(il)) {
            L.reason = LLAMA_SPARQ_DENSE_SWA;
            continue;
        }
        if (variant) {
            L.reason = LLAMA_SPARQ_DENSE_ATTN_VARIANT;
            L.variant = variant;
            continue;
        }
        const int64_t dk = model.hparams.n_embd_head_k(il), dv = model.hparams.n_embd_head_v(il);
        L.type_k = k->type;
        L.type_v = v_in_k ? k->type : v->type;
        if (!ggml_sparq_cache_type_ok(k->type) || !ggml_sparq_cache_type_ok(L.type_v) || dk % ggml_blck_size(k->type) != 0 ||
            dv % ggml_blck_size(L.type_v) != 0) {
            L.reason = LLAMA_SPARQ_DENSE_CACHE_TYPE;
            continue;
        }
        if (upstream::v_trans(kv) && !v_in_k) {
            L.reason = LLAMA_SPARQ_DENSE_V_TRANS;
            continue;
        }
        const int64_t hkv = model.hparams.n_head_kv(il);
        L.n_head = model.hparams.n_head(il);
        if (v_in_k && (hkv != 1 || dv > dk)) {
            // upstream's K-only caches are MLA's, one latent head whose first dv values are V
            L.reason = LLAMA_SPARQ_DENSE_ATTN_VARIANT;
            L.variant = "a cache without V for several KV heads, or V wider than K";
            continue;
        }
        sparq_attn_call layer_shape;
        layer_shape.dk = dk;
        layer_shape.dv = dv;
        layer_shape.n_head_kv = hkv;
        layer_shape.k_row = k->ne[0];
        // the tensors a layer's calls pass to build_attn: its sinks and T5's relative position bias (layer
        // 0's where the layer has none, as upstream's graph takes it), both the op's; the bias is the
        // graph's, checked at graph build. A layer that runs dense at every step gets no data, and its
        // graphs no appends
        const llama_layer & ml = model.layers[il];
        layer_shape.sinks = ml.attn_sinks;
        layer_shape.n_head = L.n_head;
        if ((L.variant = sparq_attn_variant(model.arch, model.hparams, &layer_shape)) != nullptr) {
            L.reason = LLAMA_SPARQ_DENSE_ATTN_VARIANT;
            continue;
        }
        const bool grok = model.arch == LLM_ARCH_GROK;
        L.softcap = model.hparams.attn_soft_cap || grok ? model.hparams.f_attn_logit_softcapping : 0.0f;
        L.logit_mul = grok ? model.hparams.f_attn_out_scale : 1.0f;
        L.max_bias = model.hparams.f_max_alibi_bias;
        L.sinks = ml.attn_sinks != nullptr;
        L.kq_b = (ml.attn_rel_b ? ml.attn_rel_b : model.layers[0].attn_rel_b) != nullptr;
        // the layer's V as the op, the appends and the rebuilds read it: upstream's, or a view of K's rows
        L.data.v = v;
        if (v_in_k) {
            L.data.v = ggml_view_3d(S.mem.ctx.get(), k, dv * hkv, k->ne[1], k->ne[2], k->nb[1], k->nb[2], 0);
            ggml_format_name(L.data.v, "sparq_v_of_k_l%u", il);
            ggml_backend_view_init(L.data.v);
        }
        L.data.vsum = ggml_new_tensor_3d(S.mem.ctx.get(), GGML_TYPE_F32, dv, hkv, n_stream);
        L.data.ksq = ggml_new_tensor_3d(S.mem.ctx.get(), GGML_TYPE_F32, dk, hkv, n_stream);
        ggml_format_name(L.data.ksq, "sparq_ksq_l%u", il);
        L.data.vcomp = ggml_new_tensor_3d(S.mem.ctx.get(), GGML_TYPE_F32, dv, hkv, n_stream);
        ggml_format_name(L.data.vsum, "sparq_vsum_l%u", il);
        ggml_format_name(L.data.vcomp, "sparq_vcomp_l%u", il);
        L.data.vcount = ggml_new_tensor_1d(S.mem.ctx.get(), GGML_TYPE_F32, n_stream);
        ggml_format_name(L.data.vcount, "sparq_vcount_l%u", il);
        L.data.report = ggml_new_tensor_3d(S.mem.ctx.get(), GGML_TYPE_F32, 4, hkv, n_stream);
        ggml_format_name(L.data.report, "sparq_report_l%u", il);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(k->buffer);
        by_buft[buft].push_back(L.data.vsum);
        by_buft[buft].push_back(L.data.ksq);
        by_buft[buft].push_back(L.data.vcomp);
        by_buft[buft].push_back(L.data.vcount);
        by_buft[buft].push_back(L.data.report);
        if (S.hadamard.n > 0 && !v_in_k) {
            // (upstream's graph rotates q and k only for a cache with V: a K-only cache's keys are stored as they are)
            ggml_tensor *& h = hrot[buft];
            if (!h) {
                h = ggml_new_tensor_2d(S.mem.ctx.get(), GGML_TYPE_F32, S.hadamard.n, S.hadamard.n);
                ggml_set_name(h, "sparq_hrot");
                by_buft[buft].push_back(h);
            }
            L.data.hrot = h;
        }
        S.mem.kv_bytes += ggml_nbytes(k) + (v_in_k ? 0 : ggml_nbytes(v));
        S.n_layers++;
    }
    if (!sparq_alloc_buffers(S, by_buft, S.mem.bufs, "the V sums", err, err_size) ||
        !sparq_alloc_kt(S, kt_bits, err, err_size)) {
        return false;
    }
    if (S.hadamard.n > 0) {
        S.hadamard.matrix_host = upstream::k_rot_matrix(kv, S.hadamard.n);
        for (const auto & [buft, h] : hrot) {
            sparq_tensor_set(h, S.hadamard.matrix_host.data(), 0, ggml_nbytes(h));
        }
    }
    sparq_alloc_reports(S);
    LLAMA_LOG_INFO("%s: SparQ data for %d of %zu KV-cache layers: K^T + V sums = %.2f MiB "
                   "(+%.0f%% of those layers' K and V, %.2f MiB)\n", __func__, S.n_layers, nl,
                   S.mem.extra_bytes / 1048576.0, S.mem.kv_bytes ? 100.0 * S.mem.extra_bytes / S.mem.kv_bytes : 0.0,
                   S.mem.kv_bytes / 1048576.0);
    return true;
}

bool sparq_alloc_kt(llama_sparq_ctx & S, int32_t kt_bits, char * err, size_t err_size) {
    const uint32_t kv_size = upstream::kv_size(S.kv);
    if (kt_bits == 4 && kv_size % GGML_SPARQ_KT4_CELLS != 0) {
        sparq_err(err, err_size, "SparQ: kt_bits 4 needs a KV cache size that is a multiple of %d (its blocks of "
                  "cells), got %u", GGML_SPARQ_KT4_CELLS, kv_size);
        return false;
    }
    ggml_init_params ip = { (S.layers.size() + 1) * ggml_tensor_overhead(), nullptr, true };
    ggml_context_ptr ctx(ggml_init(ip));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    std::vector<ggml_tensor *> kt(S.layers.size(), nullptr);
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        const sparq_layer & L = S.layers[ikv];
        if (!L.data.ksq) {
            continue; // no SparQ data in this layer
        }
        // the shape of the sums of k^2: [d, n_head_kv, n_stream]
        kt[ikv] = ggml_new_tensor_4d(ctx.get(), sparq_kt_type(L.type_k, kt_bits), kv_size, L.data.ksq->ne[0],
                                     L.data.ksq->ne[1], L.data.ksq->ne[2]);
        ggml_format_name(kt[ikv], "sparq_kt_l%d", L.il);
        by_buft[ggml_backend_buffer_get_type(upstream::layer_k(S.kv, ikv)->buffer)].push_back(kt[ikv]);
    }
    std::vector<ggml_backend_buffer_ptr> bufs;
    if (!sparq_alloc_buffers(S, by_buft, bufs, "K^T", err, err_size)) {
        for (auto & b : bufs) {
            S.mem.extra_bytes -= ggml_backend_buffer_get_size(b.get());
        }
        return false; // the K^T kept so far stays
    }
    for (auto & b : S.mem.kt_bufs) {
        S.mem.extra_bytes -= ggml_backend_buffer_get_size(b.get());
    }
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        S.layers[ikv].data.kt = kt[ikv];
    }
    S.mem.kt_bufs = std::move(bufs);
    S.mem.kt_ctx = std::move(ctx);
    S.mem.kt_bits = kt_bits;
    return true;
}

int32_t sparq_window_cap(const llama_sparq_params & p) {
    const sparq_selector & sel = sparq_selector_of(p.selector);
    if (sel.window_choice || sel.window) {
        return 0;
    }
    const bool calibrated = p.k == 0 && sel.ranks_scores;
    // the graph hook's l (sparq_attn_build), before its min with the graph's k: the calibrated k's
    // cap may be smaller at a short context, where the op reads the windows' first entries
    return std::max<int32_t>(0, p.l >= 0 ? p.l : (calibrated ? p.k_min : p.k) / 4);
}

bool sparq_alloc_win(llama_sparq_ctx & S, int32_t cap, char * err, size_t err_size) {
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    std::vector<ggml_tensor *> win(S.layers.size(), nullptr);
    ggml_context_ptr ctx;
    if (cap > 0) {
        ggml_init_params ip = { (S.layers.size() + 1) * ggml_tensor_overhead(), nullptr, true };
        ctx.reset(ggml_init(ip));
        for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
            const sparq_layer & L = S.layers[ikv];
            if (!L.data.kt) {
                continue;
            }
            win[ikv] = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_I32, cap, L.data.kt->ne[3]);
            ggml_format_name(win[ikv], "sparq_win_l%d", L.il);
            // beside K^T: on the device that runs the op and its appends
            by_buft[ggml_backend_buffer_get_type(L.data.kt->buffer)].push_back(win[ikv]);
        }
    }
    std::vector<ggml_backend_buffer_ptr> bufs;
    if (!sparq_alloc_buffers(S, by_buft, bufs, "the local windows", err, err_size)) {
        for (auto & b : bufs) {
            S.mem.extra_bytes -= ggml_backend_buffer_get_size(b.get());
        }
        return false; // the windows kept so far stay
    }
    for (auto & b : S.mem.win_bufs) {
        S.mem.extra_bytes -= ggml_backend_buffer_get_size(b.get());
    }
    S.mem.win_layers = 0;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        S.layers[ikv].data.win = win[ikv];
        S.mem.win_layers += win[ikv] != nullptr;
    }
    S.mem.win_bufs = std::move(bufs);
    S.mem.win_ctx = std::move(ctx);
    S.mem.win_cap = cap;
    for (auto & st : S.streams) {
        st.win_valid = false;
    }
    return true;
}
