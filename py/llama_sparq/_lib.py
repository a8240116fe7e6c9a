"""Finding and checking the fork's native library.

The wheel ships llama.cpp's shared libraries and tools in ``llama_sparq/lib``.
``LLAMA_SPARQ_LIB_DIR`` names another folder (a development build, say). Before
llama-cpp-python is imported, ``LLAMA_CPP_LIB_PATH`` is pointed at that folder so
its ``Llama`` runs on the fork's ``libllama``; the fork's version function is
checked first, so a missing or mismatched library is reported at import with
what was found and what to do, instead of failing later with undefined symbols.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

# Must equal LLAMA_SPARQ_ABI in CMakeLists.txt / LLAMA_SPARQ_ABI_VERSION in llama-sparq.h.
ABI_VERSION = 4
PACKAGE_VERSION = "0.1.0"

_REINSTALL = ("rebuild and reinstall the package from the repository root with `make install` "
              "(or `pip install --no-build-isolation .`)")


class LibraryError(ImportError):
    """The fork's native library is missing or does not match this Python package."""


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


def check_library(path: Path | None = None) -> str:
    """Load libllama, check ``llama_sparq_version()``; return the version string."""
    global _checked
    if _checked is not None and path is None:
        return _checked
    p = Path(path) if path else lib_path()
    if not p.is_file():
        raise LibraryError(f"llama-sparq: native library not found at {p}; {_REINSTALL}"
                           + (" (LLAMA_SPARQ_LIB_DIR is set to "
                              f"{os.environ['LLAMA_SPARQ_LIB_DIR']})" if "LLAMA_SPARQ_LIB_DIR" in os.environ else ""))
    try:
        lib = ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise LibraryError(f"llama-sparq: cannot load {p}: {e}; {_REINSTALL}") from e
    try:
        fn = lib.llama_sparq_version
    except AttributeError:
        raise LibraryError(f"llama-sparq: {p} is not the llama-sparq fork (no llama_sparq_version(): "
                           f"an upstream libllama?); {_REINSTALL}") from None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    version = fn().decode()
    m = re.match(r"llama-sparq (\S+) abi (\d+) llama\.cpp ([0-9a-f]+)", version)
    if not m:
        raise LibraryError(f"llama-sparq: {p} reports an unreadable version {version!r}; {_REINSTALL}")
    if int(m.group(2)) != ABI_VERSION:
        raise LibraryError(f"llama-sparq: {p} has ABI {m.group(2)} ({version}), this Python package needs "
                           f"ABI {ABI_VERSION} (llama-sparq {PACKAGE_VERSION}); {_REINSTALL}")
    if path is None:
        _checked = version
    return version


def setup_llama_cpp() -> None:
    """Check the library and point llama-cpp-python at it (before importing llama_cpp)."""
    check_library()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir())
