// llama-sparq: the counters (llama-sparq-stats.cpp).
#pragma once

#include "llama-sparq-state.h"

// what the last execution's calls reported once it has run (the rows their selectors read, the op's
// choice) into the counters; the caller holds S.stats.mtx
void sparq_count_last_execution(llama_sparq_ctx & S);
