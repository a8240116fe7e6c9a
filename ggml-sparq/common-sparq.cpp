// llama-sparq: applying the --sparq* flags to a context (see common-sparq.h).

#include "common-sparq.h"

#include "log.h"

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
    LOG_INF("%s: SparQ on: r = %d%s, k = %d, l = %d%s, dense below %d KV cells%s; %d layers, +%.2f MiB (K^T and V sums)\n",
            __func__, p.r, p.r == 0 ? " (head size / 8)" : "", p.k, p.l, p.l < 0 ? " (k / 4)" : "", p.min_kv,
            p.all_rows ? ", all rows" : "", st.n_layers, st.extra_bytes / 1048576.0);
    return true;
}
