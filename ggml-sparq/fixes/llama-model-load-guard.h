// llama-sparq, a general llama.cpp fix (not SparQ): a model file that breaks one of upstream's
// assertions while it loads is refused with an error, not a crash (patch 0013). upstream's loader checks much of a GGUF with
// GGML_ASSERT, which aborts the process: a corrupt vocabulary or tensor table brought down the
// program that asked to load it. While a guard lives on a thread, a failed GGML_ASSERT on that
// thread throws std::runtime_error (through ggml's abort callback) to llama_model_load's handler,
// which reports "error loading model: invalid model file: <the assertion>"; elsewhere, and on
// other threads, an assertion still aborts as before.
#pragma once

struct llama_hparams;

struct llama_model_load_guard {
    llama_model_load_guard();
    ~llama_model_load_guard();
    llama_model_load_guard(const llama_model_load_guard &) = delete;
    llama_model_load_guard & operator=(const llama_model_load_guard &) = delete;
};

// The hyperparameters a GGUF sets that ggml asserts on only when a graph runs (an assertion
// there would abort a decode, outside the guard): a norm epsilon below 0 (or NaN). Throws
// std::runtime_error naming the GGUF key and the value. Nothing for a vocab-only load.
void llama_model_check_hparams(const llama_hparams & hp);
