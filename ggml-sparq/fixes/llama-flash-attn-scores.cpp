// llama-sparq, a general llama.cpp fix (not SparQ): flash attention's scale and soft-cap for an
// architecture's scores (llama-flash-attn-scores.h).
#include "llama-flash-attn-scores.h"

#include "llama-hparams.h"

#include <cmath>

bool llama_flash_attn_scores(llm_arch arch, const llama_hparams & hp, float kq_scale, float & scale, float & softcap) {
    if (arch != LLM_ARCH_GROK) {
        scale = kq_scale;
        softcap = hp.attn_soft_cap ? hp.f_attn_logit_softcapping : 0.0f;
        return true;
    }
    // Grok: softmax(kq_scale * cap * tanh(kq * out_scale / cap)); flash attention scales before its cap only
    const float cap = hp.f_attn_logit_softcapping;
    if (kq_scale != 1.0f || hp.attn_soft_cap || !(std::isfinite(cap) && cap > 0.0f)) {
        return false;
    }
    scale = hp.f_attn_out_scale;
    softcap = cap;
    return true;
}
