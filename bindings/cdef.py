"""From llama-sparq.h to the text cffi's ``ffi.cdef`` takes.

The header marks the region Python binds with two lines, ``// ---- cffi: begin ----`` and
``// ---- cffi: end ----``. Inside it the header promises plain C: declarations, comments,
and ``#define NAME <integer>`` (cffi reads those as integer constants); ``LLAMA_API`` is
dropped. One more form: ``struct llama_sparq_params``'s fields are the settings' table's rows,
expanded by the preprocessor (``#define LLAMA_SPARQ_SETTING(type, name, ...) type name;``, then
the ``#include "llama-sparq-settings.def"`` line): here the include line becomes one
``type name;`` per row (``settings.py``) and the ``#define`` (or an ``#undef`` of it) goes.
Anything else on a preprocessor line is refused with the line, so a header edit that cffi
could not read fails here, loudly, instead of binding something else.

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
_SETTING_MACRO = re.compile(r"#\s*(define\s+LLAMA_SPARQ_SETTING\(.*|undef\s+LLAMA_SPARQ_SETTING\s*)$")
_SETTINGS_INCLUDE = re.compile(r'#\s*include\s+"llama-sparq-settings\.def"\s*$')


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


def cdef_source(text: str, name: str = "llama-sparq.h", settings=None) -> str:
    """PRELUDE + the header's marked region, ready for ``ffi.cdef``; ``settings``: the table's rows
    for the struct's fields (default: the installed table, read when the region includes it)."""
    body = region(text, name)
    out = []
    for no, line in enumerate(body.splitlines(), 1):
        s = line.strip()
        if _SETTINGS_INCLUDE.match(s):
            if settings is None:
                from .settings import table

                settings = table()
            out.extend(f"    {row.ctype} {row.name};" for row in settings)
            continue
        if _SETTING_MACRO.match(s):
            continue
        if s.startswith("#") and not _DEFINE_INT.match(s):
            raise HeaderError(f"{name}: line {no} of the cffi region is a preprocessor line cffi cannot read "
                              f"(only `#define NAME <integer>` and the settings' expansion are allowed there): "
                              f"{s!r}")
        out.append(re.sub(r"\bLLAMA_API\b\s*", "", line))
    return PRELUDE + "\n".join(out) + "\n"
