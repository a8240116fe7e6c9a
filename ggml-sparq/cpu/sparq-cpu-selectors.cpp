// llama-sparq: the CPU driver's selectors by their sparq_args::selector value (sparq-cpu-selector.h),
// one row each in the order of the op's enum ggml_sparq_selector (the glue checks the order by name).

#include "sparq-cpu-selector.h"

#include <cstdio>
#include <cstdlib>

namespace sparq_cpu {

extern const selector select_sparq, select_oracle, select_streaming, select_h2o, select_index;

static const selector * const selector_rows[] = {
    &select_sparq, &select_oracle, &select_streaming, &select_h2o, &select_index,
};
static constexpr int N_SELECTORS = (int) (sizeof(selector_rows) / sizeof(selector_rows[0]));

const selector & selector_of(int id) {
    if (id < 0 || id >= N_SELECTORS) {
        fprintf(stderr, "sparq: unknown selector %d\n", id);
        abort();
    }
    return *selector_rows[id];
}

} // namespace sparq_cpu

int sparq_cpu_selector_count(void) {
    return sparq_cpu::N_SELECTORS;
}

const char * sparq_cpu_selector_name(int id) {
    return id >= 0 && id < sparq_cpu::N_SELECTORS ? sparq_cpu::selector_rows[id]->name : nullptr;
}
