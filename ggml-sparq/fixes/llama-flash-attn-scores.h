// llama-sparq, a general llama.cpp fix (not SparQ): Grok runs flash attention (patch 0018).
// upstream's non-flash path caps Grok's scores as cap * tanh(kq * out_scale / cap) and its flash
// path ignores both, so llama_init_from_model forces flash attention off for Grok. ggml's flash
// attention computes softcap * tanh(scale * kq / softcap), which is Grok's score with scale =
// out_scale and softcap = cap wherever the logit scale after the cap (kq_scale) is 1, as Grok's
// graph passes it. build_attn_mha takes its flash attention's scale and soft-cap from here.
#pragma once

#include "llama-arch.h"

struct llama_hparams;

// The scale and soft-cap (0: none) with which ggml_flash_attn_ext computes the architecture's scores
// for a call with logit scale kq_scale; false where flash attention cannot (Grok with a kq_scale
// other than 1, a second soft-cap, or a cap that is not finite and > 0): build_attn_mha then builds
// its non-flash nodes, which read either cache layout.
bool llama_flash_attn_scores(llm_arch arch, const llama_hparams & hp, float kq_scale, float & scale, float & softcap);
