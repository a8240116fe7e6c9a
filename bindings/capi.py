"""cffi bindings of llama-sparq.h: the ffi built from the header, loading and checking the library."""

from __future__ import annotations

import ctypes
from pathlib import Path

import cffi

from . import settings as _settings
from .cdef import HeaderError, cdef_source, integer_defines


class BindingError(ImportError):
    """The header or the library cannot be bound (message says what was found)."""


def header_path() -> Path:
    try:
        return _settings.include_dir() / _settings.HEADER
    except _settings.SettingsError as e:
        raise BindingError(str(e)) from None


def _make_ffi():
    path = header_path()
    text = path.read_text()
    f = cffi.FFI()
    try:
        rows = _settings.table(path.parent / _settings.TABLE)
        f.cdef(cdef_source(text, str(path), rows))
        return f, integer_defines(text, str(path))
    except (HeaderError, _settings.SettingsError) as e:
        raise BindingError(str(e)) from e
    except cffi.CDefError as e:
        raise BindingError(f"{path}: cffi cannot read the header's cffi region: {e}") from e


ffi, DEFINES = _make_ffi()

# the ABI the header describes (its LLAMA_SPARQ_ABI_VERSION)
HEADER_ABI: int = DEFINES["LLAMA_SPARQ_ABI_VERSION"]


def open_library(path) -> object:
    """dlopen the fork's libllama (RTLD_GLOBAL, as llama-cpp-python opens it: one copy in the process).
    Symbols are looked up on first use; a missing one raises AttributeError."""
    try:
        return ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
    except OSError as e:
        raise BindingError(f"cannot load {path}: {e}") from e


def check_library(lib, path) -> None:
    """After the version string's ABI matched: the library's ABI number and struct sizes equal the header's."""
    abi = lib.llama_sparq_abi_version()
    if abi != HEADER_ABI:
        raise BindingError(f"{path} has ABI {abi}, the header {header_path()} says {HEADER_ABI}")
    size = lib.llama_sparq_default_params().size
    if size != ffi.sizeof("struct llama_sparq_params"):
        raise BindingError(f"{path}: sizeof(struct llama_sparq_params) is {size} in the library, "
                           f"{ffi.sizeof('struct llama_sparq_params')} from the header {header_path()}")
    # (struct llama_sparq_stats: llama_sparq_get_stats refuses another size than its own at every call)


def ctx_ptr(ctx):
    """A ``struct llama_context *`` from llama-cpp-python's ctypes pointer (c_void_p), an int
    address or a cffi pointer."""
    if isinstance(ctx, ffi.CData):
        return ffi.cast("struct llama_context *", ctx)
    addr = ctx if isinstance(ctx, int) else ctypes.cast(ctx, ctypes.c_void_p).value
    if not addr:
        raise ValueError("the llama_context pointer is NULL (the Llama was closed?)")
    return ffi.cast("struct llama_context *", addr)


def enum_names(lib, enum: str) -> tuple:
    """The names of an enum's values from ``llama_sparq_<enum>_name(i)``, i = 0, 1, ... until NULL:
    enum is "selector", "gqa", "basis" or "dense_reason"."""
    fn = getattr(lib, f"llama_sparq_{enum}_name")
    names = []
    while len(names) < 256:
        s = fn(len(names))
        if s == ffi.NULL:
            return tuple(names)
        names.append(ffi.string(s).decode())
    raise BindingError(f"llama_sparq_{enum}_name never returns NULL")


def params_fields(lib) -> dict:
    """The settings of ``struct llama_sparq_params`` in header order (``size`` left out), each
    "bool", "int", "float" or "enum": the table's rows, checked against the struct cffi bound and
    the library's names functions."""
    rows = _settings.table(header_path().parent / _settings.TABLE)
    bound = [name for name, _ in ffi.typeof("struct llama_sparq_params").fields if name != "size"]
    if bound != [r.name for r in rows]:
        raise BindingError(f"struct llama_sparq_params has the fields {bound}, the settings' table {[r.name for r in rows]}")
    declared = set(dir(lib))
    for r in rows:
        if r.kind == "enum" and f"llama_sparq_{r.name}_name" not in declared:
            raise BindingError(f"setting {r.name} is an enum without llama_sparq_{r.name}_name in the library")
    return {r.name: r.kind for r in rows}
