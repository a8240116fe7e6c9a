// llama-sparq, a general llama.cpp fix: assertions during a model load become load errors (see
// llama-model-load-guard.h).
#include "llama-model-load-guard.h"

#include "ggml.h"
#include "llama-hparams.h"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

extern "C" void ggml_print_backtrace(void); // ggml-impl.h (exported by ggml-base)

static thread_local int g_loading = 0;
static ggml_abort_callback_t g_prev_abort = nullptr;

// ggml_abort calls this with its message and aborts if it returns. ggml's C sources are built
// with -fexceptions (ggml-sparq/CMakeLists.txt), so the exception unwinds through ggml_abort.
static void load_guard_abort_callback(const char * message) {
    if (g_loading > 0) {
        throw std::runtime_error(std::string("invalid model file: ") + message);
    }
    if (g_prev_abort) {
        g_prev_abort(message);
        return;
    }
    fprintf(stderr, "%s\n", message); // ggml's default: the message, then its backtrace
    ggml_print_backtrace();
}

llama_model_load_guard::llama_model_load_guard() {
    static std::once_flag once;
    std::call_once(once, [] { g_prev_abort = ggml_set_abort_callback(load_guard_abort_callback); });
    ++g_loading;
}

llama_model_load_guard::~llama_model_load_guard() {
    --g_loading;
}

void llama_model_check_hparams(const llama_hparams & hp) {
    if (hp.vocab_only) {
        return; // no graph will run (and load_hparams leaves most values unset)
    }
    // ggml_norm and ggml_rms_norm assert eps >= 0 when they run
    for (const auto & kv : { std::make_pair("attention.layer_norm_epsilon", hp.f_norm_eps),
                             std::make_pair("attention.layer_norm_rms_epsilon", hp.f_norm_rms_eps) }) {
        if (std::isnan(kv.second) || kv.second < 0.0f) {
            char buf[256];
            snprintf(buf, sizeof(buf), "invalid model file: %s = %g; allowed a number >= 0", kv.first,
                     (double) kv.second);
            throw std::runtime_error(buf);
        }
    }
}
