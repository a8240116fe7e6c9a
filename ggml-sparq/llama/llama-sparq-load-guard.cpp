// llama-sparq: assertions during a model load become load errors (see llama-sparq-load-guard.h).
#include "llama-sparq-load-guard.h"

#include "ggml.h"
#include "llama-hparams.h"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

extern "C" void ggml_print_backtrace(void); // ggml-impl.h (exported by ggml-base)

static thread_local int g_sparq_loading = 0;
static ggml_abort_callback_t g_sparq_prev_abort = nullptr;

// ggml_abort calls this with its message and aborts if it returns. ggml's C sources are built
// with -fexceptions (ggml-sparq/CMakeLists.txt), so the exception unwinds through ggml_abort.
static void sparq_abort_callback(const char * message) {
    if (g_sparq_loading > 0) {
        throw std::runtime_error(std::string("invalid model file: ") + message);
    }
    if (g_sparq_prev_abort) {
        g_sparq_prev_abort(message);
        return;
    }
    fprintf(stderr, "%s\n", message); // ggml's default: the message, then its backtrace
    ggml_print_backtrace();
}

llama_sparq_load_guard::llama_sparq_load_guard() {
    static std::once_flag once;
    std::call_once(once, [] { g_sparq_prev_abort = ggml_set_abort_callback(sparq_abort_callback); });
    ++g_sparq_loading;
}

llama_sparq_load_guard::~llama_sparq_load_guard() {
    --g_sparq_loading;
}

void llama_sparq_check_hparams(const llama_hparams & hp) {
    auto fail = [](const char * key, float v, const char * allowed) {
        char buf[256];
        snprintf(buf, sizeof(buf), "invalid model file: %s = %g; allowed %s", key, (double) v, allowed);
        throw std::runtime_error(buf);
    };
    auto non_negative = [&](const char * key, float v) {
        if (!std::isfinite(v) || v < 0.0f) {
            fail(key, v, "a finite number >= 0");
        }
    };
    auto positive = [&](const char * key, float v) {
        if (!std::isfinite(v) || v <= 0.0f) {
            fail(key, v, "a finite number > 0");
        }
    };
    auto finite = [&](const char * key, float v) {
        if (!std::isfinite(v)) {
            fail(key, v, "a finite number");
        }
    };
    non_negative("attention.layer_norm_epsilon", hp.f_norm_eps);
    non_negative("attention.layer_norm_rms_epsilon", hp.f_norm_rms_eps);
    positive("rope.freq_base", hp.rope_freq_base_train);
    positive("rope.scaling.factor (as the frequency scale)", hp.rope_freq_scale_train);
    finite("attn_logit_softcapping", hp.f_attn_logit_softcapping);
    finite("final_logit_softcapping", hp.f_final_logit_softcapping);
    finite("logit_scale", hp.f_logit_scale);
    finite("residual_scale", hp.f_residual_scale);
    finite("embedding_scale", hp.f_embedding_scale);
    finite("attention.scale", hp.f_attention_scale);
    finite("expert_weights_scale", hp.expert_weights_scale);
}
