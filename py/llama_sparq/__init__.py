"""llama-sparq: llama.cpp with SparQ attention.

``from llama_sparq import Llama`` gives llama-cpp-python's ``Llama`` running on the
fork's libllama (checked at import, see ``_lib``). The NumPy reference and the cost model of
docs/algorithm.md are research helpers outside the wheel (``dev/sparq_lab`` in the repository).
"""

import os as _os

from ._lib import ABI_VERSION, PACKAGE_VERSION, LibraryError, check_library, lib_dir, tool_path

# llama-cpp-python's Python layer (llama_cpp, installed with this package from the pinned
# sdist) loads libllama from LLAMA_CPP_LIB_PATH: point it at the fork's library now, so
# `import llama_sparq, llama_cpp` works (importing llama_cpp alone finds no libllama)
_os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir())

__version__ = PACKAGE_VERSION
__all__ = ["Llama", "ABI_VERSION", "LibraryError", "check_library", "lib_dir", "tool_path", "__version__"]


def __getattr__(name):
    # imported lazily: importing the package needs no native library (the NumPy reference and
    # the cost model in dev/ import parts of it)
    if name == "Llama":
        from ._llama import Llama

        return Llama
    raise AttributeError(f"module 'llama_sparq' has no attribute {name!r}")
