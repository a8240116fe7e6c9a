"""The fork's extra C API (``ggml-sparq/include/llama-sparq.h``) as seen from Python.

Bound with cffi (ABI mode) from the header itself: ``cdef.py`` takes the header's region
between its ``// ---- cffi: begin ----`` and ``// ---- cffi: end ----`` lines, ``capi.py``
feeds it to ``ffi.cdef`` and opens the fork's ``libllama`` with ``ffi.dlopen``, checking its
version, ABI and struct sizes at load. No struct layout is written down in Python: the
params and stats structs, the enums and their counts, the name functions all come from
the header that is installed with the package (``llama_sparq/include/llama-sparq.h``).

Installed as ``llama_sparq.bindings``. llama-cpp-python keeps its own ctypes bindings of
upstream's ``llama.h``; a ``llama_context`` pointer from it is passed here with
``capi.ctx_ptr()``.
"""

from .capi import DEFINES, HEADER_ABI, BindingError, check_library, ctx_ptr, enum_names, ffi, header_path, open_library, params_fields
from .cdef import HeaderError, cdef_source

__all__ = ["DEFINES", "HEADER_ABI", "BindingError", "HeaderError", "check_library", "cdef_source", "ctx_ptr", "enum_names", "ffi", "header_path",
           "open_library", "params_fields"]
