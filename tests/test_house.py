"""The shape of the house, kept by tests (without a build): limits the tree promises about itself
that no numerical test would notice breaking. Each check reads the tracked sources as text and
has a self-test that it catches a planted case."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from test_docs import ROOT, rel, tracked

C_EXTS = (".c", ".cpp", ".h", ".cu", ".cuh")

# a function definition at the start of a line: its name before the parameter list and the body
_DEF = re.compile(r'^(?:(?:static|inline|extern "C")\s+)*[A-Za-z_][\w:<>,\s\*&]*?\b([a-z_][a-z0-9_]*)\s*\([^;{}]*\)\s*'
                  r'(?:const\s*)?\{', re.M)
_NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof"}


def function_definitions(texts: dict[str, str]) -> dict[str, set[str]]:
    """name -> the files (of texts: path -> source) that define a function of that name."""
    out: dict[str, set[str]] = defaultdict(set)
    for path, text in texts.items():
        for m in _DEF.finditer(text):
            if m.group(1) not in _NOT_NAMES and not m.group(1).startswith("__"):
                out[m.group(1)].add(path)
    return out


def twice_defined(defs: dict[str, set[str]]) -> dict[str, set[str]]:
    """The names defined in more than one file, but for one kernel per backend (a cpu/ and a cuda/
    file of the same step) and an entry point the experimental CUDA build defines in its own files
    instead of the default pipeline's (one cuda/experimental/ and one other cuda/ file)."""
    bad = {}
    for name, files in defs.items():
        backends = {f.split("/")[1] for f in files}
        experimental = {"/experimental/" in f for f in files}
        per_backend = len(files) == 2 and backends == {"cpu", "cuda"}
        per_build = len(files) == 2 and backends == {"cuda"} and experimental == {True, False}
        if len(files) > 1 and not (per_backend or per_build):
            bad[name] = files
    return bad


def test_definition_finder_catches_a_planted_twin():
    texts = {"ggml-sparq/op/a.c": "static bool sparq_cache_type_ok(enum ggml_type t) {\n    return true;\n}\n",
             "ggml-sparq/llama/b.cpp": "bool sparq_cache_type_ok(ggml_type t) {\n    return false;\n}\n",
             "ggml-sparq/cpu/c.cpp": "static void sparq_cut(int n) {\n}\n",
             "ggml-sparq/cuda/d.cuh": "static __device__ void sparq_cut(int n) {\n}\n",
             "ggml-sparq/cuda/e.cuh": "static void sparq_run(int n) {\n}\n",
             "ggml-sparq/cuda/experimental/f.cuh": "static void sparq_run(int n) {\n}\n",
             "ggml-sparq/cuda/g.cuh": "static void sparq_twice(int n) {\n}\n",
             "ggml-sparq/cuda/h.cuh": "static void sparq_twice(int n) {\n}\n"}
    assert set(twice_defined(function_definitions(texts))) == {"sparq_cache_type_ok", "sparq_twice"}


def test_no_function_is_defined_twice_in_ggml_sparq():
    """One meaning, one definition: a helper written again elsewhere (the cache types the op reads
    once had two definitions that disagreed) is shared from one place instead."""
    texts = {rel(p): p.read_text() for p in tracked("ggml-sparq") if p.suffix in C_EXTS}
    bad = twice_defined(function_definitions(texts))
    assert not bad, f"defined in several files: {bad}"


def test_the_op_parameter_layout_keeps_its_free_slots():
    """The layout's slots (op/ggml-sparq-params.c) leave GGML_SPARQ_PARAMS_MIN_FREE of ggml's 16 free
    (the native params check asserts the same at run time)."""
    c = (ROOT / "ggml-sparq/op/ggml-sparq-params.c").read_text()
    h = (ROOT / "ggml-sparq/include/ggml-sparq-params.h").read_text()
    used = int(re.search(r"SLOT_COUNT\s*=\s*(\d+)", c).group(1))
    total = int(re.search(r"#define GGML_SPARQ_PARAMS_SLOTS\s+(\d+)", h).group(1))
    min_free = int(re.search(r"#define GGML_SPARQ_PARAMS_MIN_FREE\s+(\d+)", h).group(1))
    assert min_free >= 4 and total - used >= min_free, (used, total, min_free)
    # no slot is shared between fields: every attention slot name has its own number
    attn = re.findall(r"SLOT_(\w+)\s*=\s*(\d+),", c[c.index("// attention"):c.index("// a sum's append")])
    numbers = [int(n) for _, n in attn]
    assert len(numbers) == len(set(numbers)), attn


# the environment variables a source reads: a getenv of a literal, or of a name a helper passes on
_ENV_NAME = re.compile(r'"((?:LLAMA_SPARQ|GGML_SPARQ|SPARQ)_[A-Z0-9_]+)"')
# what is not the default library: the experimental CUDA build's files, test-backend-ops' cases
_NOT_DEFAULT_LIBRARY = ("ggml-sparq/cuda/experimental/", "ggml-sparq/tools/test-backend-ops-sparq.h")
MAX_DEFAULT_SWITCHES = 3
MAX_KERNEL_LINES = 600


def environment_switches(texts: dict[str, str]) -> set[str]:
    """The environment variables named in the sources (path -> text) that call getenv."""
    out = set()
    for path, text in texts.items():
        if "getenv" in text and not path.startswith(_NOT_DEFAULT_LIBRARY):
            out |= set(_ENV_NAME.findall(text))
    return out


def test_switch_finder_sees_a_planted_switch_and_skips_the_experimental_build():
    texts = {"ggml-sparq/llama/a.cpp": 'const char * v = getenv("LLAMA_SPARQ_NEW_PATH");',
             "ggml-sparq/cuda/experimental/b.cuh": 'static int w = env_way("LLAMA_SPARQ_CUDA_X"); // getenv',
             "ggml-sparq/cpu/c.cpp": 'const char * name = "GGML_SPARQ_NOT_READ";'}
    assert environment_switches(texts) == {"LLAMA_SPARQ_NEW_PATH"}


def test_the_default_library_reads_at_most_three_environment_switches():
    """Experiments are not runtime switches of the product: the default build's sources read at most
    MAX_DEFAULT_SWITCHES variables (GGML_SPARQ_ISA, which tests use to run every CPU kernel on one
    machine); the CUDA variants no GPU has timed read theirs only in the experimental build."""
    texts = {rel(p): p.read_text() for p in tracked("ggml-sparq") if p.suffix in C_EXTS}
    found = environment_switches(texts)
    assert len(found) <= MAX_DEFAULT_SWITCHES, sorted(found)


def test_no_kernel_file_passes_600_lines():
    """One concern per kernel file: the CPU and CUDA kernels' files stay under MAX_KERNEL_LINES."""
    long = {rel(p): n for p in tracked("ggml-sparq/cpu") + tracked("ggml-sparq/cuda")
            if p.suffix in C_EXTS and (n := len(p.read_text().splitlines())) > MAX_KERNEL_LINES}
    assert not long, long
