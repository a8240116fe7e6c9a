"""Console scripts that start the fork's llama.cpp programs from the installed package."""

from __future__ import annotations

import os
import sys

from ._lib import LibraryError, check_library, tool_path


def _exec(name: str) -> None:
    try:
        check_library()
        path = tool_path(name)
    except LibraryError as e:
        print(str(e), file=sys.stderr)
        sys.exit(2)
    os.execv(str(path), [str(path), *sys.argv[1:]])


def cli() -> None:
    _exec("llama-cli")


def completion() -> None:
    _exec("llama-completion")


def server() -> None:
    _exec("llama-server")


def bench() -> None:
    _exec("llama-bench")


def perplexity() -> None:
    _exec("llama-perplexity")


def batched_bench() -> None:
    _exec("llama-batched-bench")


def rpc_server() -> None:
    _exec("ggml-rpc-server")
