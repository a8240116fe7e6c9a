"""The fork's extra C API (``ggml-sparq/include/llama-sparq.h``) as seen from Python.

Bound with cffi (ABI mode) from the header itself: ``cdef.py`` takes the header's region
between its ``// ---- cffi: begin ----`` and ``// ---- cffi: end ----`` lines, ``capi.py``
feeds it to ``ffi.cdef`` and opens the fork's ``libllama`` with ``ffi.dlopen``, checking its
version, ABI and struct sizes at load. No struct layout is written down in Python: the
params and stats structs, the enums and their counts, the name functions all come from
the header that is installed with the package (``llama_sparq/include/llama-sparq.h``), and the
settings' fields from its table (``llama-sparq-settings.def``, read by ``settings.py``).

Installed as ``llama_sparq.bindings``. llama-cpp-python keeps its own ctypes bindings of
upstream's ``llama.h``; a ``llama_context`` pointer from it is passed here with
``capi.ctx_ptr()``. The cffi part (``capi``) is loaded on first use, so the table and the
header's ABI number (``settings``) are read without it.
"""

from .cdef import HeaderError, cdef_source

_CAPI = ("DEFINES", "HEADER_ABI", "BindingError", "check_library", "ctx_ptr", "enum_names", "ffi", "header_path",
         "open_library", "params_fields")

__all__ = [*_CAPI, "HeaderError", "cdef_source"]


def __getattr__(name):
    if name in _CAPI:
        from . import capi

        return getattr(capi, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
