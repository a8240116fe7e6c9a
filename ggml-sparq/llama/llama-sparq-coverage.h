// llama-sparq: what the op reports of its choice, folded into the per-layer counters, and the guard of
// a fixed k (llama-sparq-coverage.cpp).
#pragma once

#include "llama-sparq-state.h"

// the last execution's reports into the counters, the guard's warning (the caller holds S.stats.mtx)
void sparq_count_reports(llama_sparq_ctx & S);
// the reports and the guard's state cleared (new settings or a reset)
void sparq_coverage_reset(llama_sparq_ctx & S);
