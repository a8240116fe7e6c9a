"""Finding and checking the fork's native library.

The wheel ships llama.cpp's shared libraries and tools in ``llama_sparq/lib``.
``LLAMA_SPARQ_LIB_DIR`` names another folder (a development build, say). Before
llama-cpp-python's Python layer (``llama_cpp``) is imported, ``LLAMA_CPP_LIB_PATH`` is
pointed at that folder so its ``Llama`` runs on the fork's ``libllama``. The library is
opened through the cffi bindings of the fork's C API (``llama_sparq.bindings``, bound
from the installed ``llama-sparq.h``) and checked first: the version string's ABI and
``llama_sparq_abi_version()`` must equal this package's (``ABI_VERSION``: the installed
header's ``LLAMA_SPARQ_ABI_VERSION``), and the size of ``struct llama_sparq_params`` the
header's, so a missing or mismatched library is reported at import with what was found
and what to do, instead of failing later with undefined symbols or a wrong struct layout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

PACKAGE_VERSION = "0.1.0"

_REINSTALL = ("rebuild and reinstall the package from the repository root with `make install` "
              "(or `pip install .`)")


class LibraryError(ImportError):
    """The fork's native library is missing or does not match this Python package."""


def _package_abi() -> int | None:
    """The ABI this package was built with: LLAMA_SPARQ_ABI_VERSION of the header installed with it
    (the one place the number is written); None when the header is missing (check_library says so)."""
    from .bindings.settings import SettingsError, abi_version

    try:
        return abi_version()
    except (SettingsError, OSError, KeyError):
        return None


ABI_VERSION = _package_abi()


def lib_dir() -> Path:
    env = os.environ.get("LLAMA_SPARQ_LIB_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "lib"


def lib_path() -> Path:
    return lib_dir() / "libllama.so"


def tool_path(name: str) -> Path:
    """Path of one of the fork's programs (llama-cli, llama-bench, ...)."""
    p = lib_dir() / name
    if not p.is_file():
        raise LibraryError(f"{p}: the fork's {name} is not installed; {_REINSTALL}")
    return p


_checked: str | None = None
_lib = None


def _bindings():
    try:
        from . import bindings
        from .bindings import capi  # noqa: F401  (the cffi bindings, built from the header now)
    except ImportError as e:  # BindingError included: the header is missing or unreadable
        raise LibraryError(f"llama-sparq: the C API bindings cannot be set up: {e}; {_REINSTALL}") from e
    return bindings


def check_library(path: Path | None = None) -> str:
    """Load libllama through the cffi bindings and check it (version string, ABI, struct
    size); return the version string."""
    global _checked, _lib
    if _checked is not None and path is None:
        return _checked
    p = Path(path) if path else lib_path()
    if not p.is_file():
        raise LibraryError(f"llama-sparq: native library not found at {p}; {_REINSTALL}"
                           + (" (LLAMA_SPARQ_LIB_DIR is set to "
                              f"{os.environ['LLAMA_SPARQ_LIB_DIR']})" if "LLAMA_SPARQ_LIB_DIR" in os.environ else ""))
    b = _bindings()
    try:
        lib = b.open_library(p)
    except b.BindingError as e:
        raise LibraryError(f"llama-sparq: {e}; {_REINSTALL}") from e
    try:
        fn = lib.llama_sparq_version
    except AttributeError:
        raise LibraryError(f"llama-sparq: {p} is not the llama-sparq fork (no llama_sparq_version(): "
                           f"an upstream libllama?); {_REINSTALL}") from None
    version = b.ffi.string(fn()).decode()
    m = re.match(r"llama-sparq (\S+) abi (\d+) llama\.cpp ([0-9a-f]+)", version)
    if not m:
        raise LibraryError(f"llama-sparq: {p} reports an unreadable version {version!r}; {_REINSTALL}")
    if int(m.group(2)) != ABI_VERSION:
        raise LibraryError(f"llama-sparq: {p} has ABI {m.group(2)} ({version}), this Python package needs "
                           f"ABI {ABI_VERSION} (llama-sparq {PACKAGE_VERSION}); {_REINSTALL}")
    try:
        b.check_library(lib, p)
    except (b.BindingError, AttributeError) as e:
        raise LibraryError(f"llama-sparq: {e}; {_REINSTALL}") from e
    if path is None:
        _checked, _lib = version, lib
    return version


def library():
    """The checked library (cffi, ``llama_sparq.bindings.ffi``): the fork's C API functions."""
    check_library()
    return _lib


def setup_llama_cpp() -> None:
    """Check the library and point llama-cpp-python at it (before importing llama_cpp)."""
    check_library()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir())
