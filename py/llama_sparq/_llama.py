"""``Llama``: llama-cpp-python's class on the fork's library."""

from __future__ import annotations

import os

from ._lib import setup_llama_cpp

setup_llama_cpp()

import llama_cpp  # noqa: E402  (after LLAMA_CPP_LIB_PATH is set)

GGUF_MAGIC = b"GGUF"


def check_model_file(model_path) -> str:
    """Raise a clear error naming the path unless it is a readable GGUF file."""
    path = os.fspath(model_path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"model path is not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ValueError(f"cannot read model file {path}: {e}") from e
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF model file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    return path


class Llama(llama_cpp.Llama):
    """llama-cpp-python's ``Llama`` (same methods and arguments) on the fork's libllama."""

    def __init__(self, model_path: str, *args, **kwargs):
        path = check_model_file(model_path)
        try:
            super().__init__(path, *args, **kwargs)
        except ValueError as e:
            # llama.cpp could not parse the file (truncated or corrupt)
            if path not in str(e):
                raise ValueError(f"{path}: {e}") from e
            raise

    def close(self) -> None:
        # also called from __del__ when __init__ failed before llama_cpp set anything up
        if hasattr(self, "_stack"):
            super().close()
