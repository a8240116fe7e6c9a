// llama-sparq, a general llama.cpp fix (not SparQ): state files written whole or not at all
// (patch 0012). upstream's savers write
// straight to the path through a buffered FILE and never check the final flush, so a full disk
// or a file-size limit could leave a truncated file behind, reported as saved, over the previous
// good one. llama_state_save_file and llama_state_seq_save_file call their saver through this.
#pragma once

#include <cstddef>
#include <functional>

// Runs save(tmp) with tmp a temporary file next to path; save returns the bytes it wrote (0:
// failed; it may throw, the temporary is removed either way). The temporary must hold exactly
// `expected` bytes on disk (0: the count save returned) before it is renamed over path. On
// failure path is untouched, the temporary is removed, and the reason is logged; returns the
// bytes written, or 0.
size_t llama_state_save_whole(const char * fn, const char * path, size_t expected,
                              const std::function<size_t(const char * tmp)> & save);
