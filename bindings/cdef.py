"""From llama-sparq.h to the text cffi's ``ffi.cdef`` takes.

The header marks the region Python binds with two lines, ``// ---- cffi: begin ----`` and
``// ---- cffi: end ----``. Inside it the header promises plain C: declarations, comments,
and ``#define NAME <integer>`` (cffi reads those as integer constants); ``LLAMA_API`` is
dropped. Anything else on a preprocessor line is refused with the line, so a header edit
that cffi could not read fails here, loudly, instead of binding something else.

Upstream's types the region uses are declared opaque in ``PRELUDE`` (pointers only).
"""

from __future__ import annotations

import re

BEGIN = "// ---- cffi: begin ----"
END = "// ---- cffi: end ----"

# llama.h / ggml.h types the region refers to: opaque structs behind pointers, and the
# callback type of llama_sparq_debug_set_eval_callback (a function pointer, no layout)
PRELUDE = """
struct llama_context;
struct ggml_tensor;
typedef bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data);
"""

_DEFINE_INT = re.compile(r"#\s*define\s+[A-Za-z_]\w*\s+(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*(//.*)?$")


class HeaderError(ValueError):
    """llama-sparq.h cannot be bound: markers missing, or a line cffi cannot read."""


def region(text: str, name: str = "llama-sparq.h") -> str:
    """The lines between the markers (exactly one of each, BEGIN first)."""
    lines = text.splitlines()
    begins = [i for i, l in enumerate(lines) if l.strip() == BEGIN]
    ends = [i for i, l in enumerate(lines) if l.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise HeaderError(f"{name}: expected one {BEGIN!r} line and one {END!r} line after it, "
                          f"found {len(begins)} and {len(ends)}")
    return "\n".join(lines[begins[0] + 1:ends[0]])


def integer_defines(text: str, name: str = "llama-sparq.h") -> dict:
    """The region's ``#define NAME <integer>`` constants (cffi's ABI mode shows them only on a
    loaded library; the ABI check needs the header's before any library is loaded)."""
    out = {}
    for line in region(text, name).splitlines():
        m = re.match(r"\s*#\s*define\s+([A-Za-z_]\w*)\s+(0[xX][0-9a-fA-F]+|\d+)", line)
        if m:
            out[m.group(1)] = int(m.group(2), 0)
    return out


def cdef_source(text: str, name: str = "llama-sparq.h") -> str:
    """PRELUDE + the header's marked region, ready for ``ffi.cdef``."""
    body = region(text, name)
    out = []
    for no, line in enumerate(body.splitlines(), 1):
        s = line.strip()
        if s.startswith("#") and not _DEFINE_INT.match(s):
            raise HeaderError(f"{name}: line {no} of the cffi region is a preprocessor line cffi cannot read "
                              f"(only `#define NAME <integer>` is allowed there): {s!r}")
        out.append(re.sub(r"\bLLAMA_API\b\s*", "", line))
    return PRELUDE + "\n".join(out) + "\n"
