// llama-sparq: an enum setting's value from its name, by the C API's name functions
// (llama_sparq_selector_name, llama_sparq_gqa_name, llama_sparq_basis_name), for the front ends
// that parse names (the common flags, llama-bench): the names live in the library only.
#pragma once

#include <cstdint>
#include <string>

// the index whose name is `value`, or -1 with `allowed` set to the names, comma-separated
inline int32_t sparq_enum_from_name(const std::string & value, const char * (*name_of)(int32_t), std::string & allowed) {
    allowed.clear();
    for (int32_t i = 0; name_of(i) != nullptr; ++i) {
        if (value == name_of(i)) {
            return i;
        }
        allowed += (i ? ", " : "") + std::string(name_of(i));
    }
    return -1;
}
