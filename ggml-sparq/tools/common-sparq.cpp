// llama-sparq: applying the --sparq* flags to a context (see common-sparq.h).

#include "common-sparq.h"

#include "log.h"

void common_sparq_postprocess_params(common_params & params) {
    if (!params.sparq.enabled) {
        return;
    }
    if (params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED) {
        throw std::invalid_argument("--sparq needs the flash-attention KV layout (V not transposed): use -fa on or -fa auto");
    }
    // -fa auto could resolve to off (a backend without flash attention), leaving SparQ nothing to run on
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
}

bool common_sparq_apply(llama_context * ctx, const common_params & params) {
    if (!params.sparq.enabled) {
        return true;
    }
    if (params.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED) {
        LOG_ERR("%s: --sparq needs the flash-attention KV layout (V not transposed): use -fa on or -fa auto\n", __func__);
        return false;
    }
    char err[512];
    const int32_t rc = llama_sparq_set_params(ctx, &params.sparq, err, sizeof(err));
    if (rc != 0) {
        LOG_ERR("%s: %s\n", __func__, err);
        return false;
    }
    llama_sparq_params p = llama_sparq_default_params();
    llama_sparq_get_params(ctx, &p);
    llama_sparq_stats st;
    st.size = sizeof(st);
    llama_sparq_get_stats(ctx, &st);
    if (st.n_layers == 0) {
        LOG_ERR("%s: --sparq: no KV-cache layer of this context can run SparQ (flash attention off for this model, "
                "a K/V cache type SparQ does not read, or sliding-window layers only); refusing to run "
                "without it\n", __func__);
        return false;
    }
    if (params.kv_unified && params.n_parallel > 1) {
        LOG_WRN("%s: --sparq with a unified KV cache over %d sequences: decode steps run dense (reason shared_stream) "
                "whenever several sequences are in the cache; drop --kv-unified for one KV stream per sequence\n",
                __func__, params.n_parallel);
    }
    char kbuf[160];
    if (p.k == 0) {
        snprintf(kbuf, sizeof(kbuf), "0 (calibrated: the fewest cells holding %.2f of the estimated attention mass, "
                 "%d to %.0f %% of the cells)", (double) p.coverage, p.k_min, 100.0 * p.k_frac);
    } else {
        snprintf(kbuf, sizeof(kbuf), "%d", p.k);
    }
    LOG_INF("%s: SparQ on: r = %d%s, k = %s, l = %d%s, dense below %d KV cells%s; selector %s, gqa %s, basis %s, "
            "mean-V %s; %d layers, +%.2f MiB (K^T and V sums)\n",
            __func__, p.r, p.r == 0 ? " (head size / 4)" : "", kbuf, p.l,
            p.l < 0 ? (p.k == 0 ? " (k_min / 4)" : " (k / 4)") : "", p.min_kv,
            p.all_rows ? ", all rows" : "", llama_sparq_selector_name(p.selector), llama_sparq_gqa_name(p.gqa),
            llama_sparq_basis_name(p.basis), p.mean_v ? "on" : "off", st.n_layers, st.extra_bytes / 1048576.0);
    return true;
}
