// llama-sparq: the CPU driver's selectors by their sparq_args::selector value (sparq-cpu-selector.h).

#include "sparq-cpu-selector.h"

#include <cstdio>
#include <cstdlib>

namespace sparq_cpu {

const selector & selector_of(int id) {
    static const selector * const table[] = { &sel_sparq, &sel_oracle, &sel_streaming, &sel_h2o, &sel_index };
    static_assert(sizeof(table) / sizeof(table[0]) == SPARQ_SEL_INDEX + 1, "a selector without its row");
    if (id < 0 || id > SPARQ_SEL_INDEX) {
        fprintf(stderr, "sparq: unknown selector %d\n", id);
        abort();
    }
    return *table[id];
}

} // namespace sparq_cpu
