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


# ---------------------------------------------------------------- the llama layer's shape

def code_of(text: str) -> str:
    """C/C++ source with its comments blanked and its string and character literals emptied (line
    breaks kept), so that names are read from the code only."""
    def blank(m: re.Match) -> str:
        s = m.group(0)
        return re.sub(r"[^\n]", " ", s) if s.startswith("/") else s[0] * 2
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text, flags=re.S)


def includes_of(text: str) -> list[str]:
    """The quoted includes of a source, by the name written."""
    return re.findall(r'^\s*#\s*include\s*"([^"]+)"', text, re.M)


def include_cycles(texts: dict[str, str]) -> list[list[str]]:
    """The include cycles among texts (path -> source), includes resolved by the file's bare name
    (every folder of ggml-sparq/ is an include path): each cycle as its files, first repeated last."""
    by_name: dict[str, str] = {}
    for path in texts:
        assert Path(path).name not in by_name, f"two files named {Path(path).name}: includes are ambiguous"
        by_name[Path(path).name] = path
    graph = {p: [by_name[n] for n in includes_of(t) if n in by_name] for p, t in texts.items()}
    return graph_cycles(graph)


def graph_cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One cycle per back edge of a depth-first walk of graph (node -> its successors); none when the
    graph is acyclic."""
    found, state, stack = [], {}, []

    def walk(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in graph.get(u, []):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                walk(v)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            walk(u)
    return found


def _top_level(code: str) -> list[tuple[str, str | None]]:
    """The statements of code at brace depth 0: (head, body), body None for a statement ending in ';'."""
    out, depth, start, head = [], 0, 0, ""
    for i, c in enumerate(code):
        if c == "{":
            if depth == 0:
                head, body_start = code[start:i], i + 1
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                out.append((head, code[body_start:i]))
                start = i + 1
        elif c == ";" and depth == 0:
            out.append((code[start:i], None))
            start = i + 1
    return out


def header_names(text: str) -> set[str]:
    """The names a header gives its includers: its macros, types (struct, class, enum and its values,
    using), functions (declared or inline) and variables, at namespace scope. Forward declarations
    give nothing."""
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M))
    for head, body in _top_level(code_of(text)):
        h = " ".join(re.sub(r"^\s*#[^\n]*", "", head, flags=re.M).split())
        h = re.sub(r"^(?:;|\})\s*", "", h)
        if not h or h.startswith(('extern "', "namespace")):
            continue
        if m := re.match(r"^(?:template\s*<[^>]*>\s*)?(struct|class|union|enum(?:\s+class)?)\s+(\w+)\s*(?::[^{]*)?$", h):
            if body is not None:
                names.add(m.group(2))
                if m.group(1).startswith("enum"):
                    names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*(?:=[^,]*)?(?:,|$)", body.strip()))
            continue
        if m := re.match(r"^using\s+(\w+)\s*=", h):
            names.add(m.group(1))
        elif m := re.match(r"^[^=(]*?\b([A-Za-z_]\w*)\s*\(", h):  # a function
            if m.group(1) != "static_assert":
                names.add(m.group(1))
        elif m := re.match(r"^[^=(\[]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:=.*)?$", h):  # a variable
            names.add(m.group(1))
    return names


def include_what_you_use(texts: dict[str, str]) -> list[tuple[str, str, str]]:
    """(file, header, name) for each name of a header of texts (header_names) that another file of
    texts uses without including that header itself (a forward declaration of a type is enough to name
    it). Also ('', header, '') for a header that gives nothing of its own: one that only includes others."""
    owner: dict[str, str] = {}
    bad = []
    for path, text in texts.items():
        if path.endswith(".h"):
            names = header_names(text)
            if not names:
                bad.append(("", path, ""))
            for n in names:
                assert n not in owner, f"{n} is given by {owner[n]} and {path}"
                owner[n] = path
    for path, text in texts.items():
        code = code_of(text)
        used = set(re.findall(r"\b[A-Za-z_]\w*\b", code))
        used -= set(re.findall(r"^\s*(?:struct|class)\s+(\w+)\s*;", code, re.M))
        included = set(includes_of(text))
        for n in sorted(used):
            h = owner.get(n)
            if h and h != path and Path(h).name not in included:
                bad.append((path, h, n))
    return bad


def call_cycles(texts: dict[str, str]) -> list[list[str]]:
    """The cycles among the source files of texts of 'calls a function another file defines and a
    header declares': file A -> file B when A calls a function that B defines and some header of texts
    declares (the functions one source shares through its header). None: the calls go one way."""
    code = {p: code_of(t) for p, t in texts.items()}
    declared = set()
    for p, c in code.items():
        if p.endswith((".h", ".cuh")):
            declared |= {n for n in header_names(texts[p])}
    defs = function_definitions({p: c for p, c in code.items() if not p.endswith((".h", ".cuh"))})
    owner = {n: next(iter(f)) for n, f in defs.items() if n in declared and len(f) == 1}
    graph: dict[str, list[str]] = {}
    for p, c in code.items():
        if p.endswith((".h", ".cuh")):
            continue
        called = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", c))
        graph[p] = sorted({owner[n] for n in called if n in owner and owner[n] != p})
    return graph_cycles(graph)


def _sources(under: str) -> dict[str, str]:
    return {rel(p): p.read_text() for p in tracked(under) if p.suffix in C_EXTS}


def test_the_layout_checks_catch_what_they_should():
    a = '#pragma once\n#include "b.h"\nstruct sparq_a { int x; };\n'
    b = '#pragma once\n#include "a.h"\nvoid sparq_b(int n);\n'
    assert include_cycles({"g/x/a.h": a, "g/y/b.h": b}) == [["g/x/a.h", "g/y/b.h", "g/x/a.h"]]
    assert include_cycles({"g/x/a.h": a, "g/y/b.h": b.replace('#include "a.h"\n', "")}) == []

    # two sources that call each other through their headers, and three in a ring
    hdr = "#pragma once\nvoid f_one(int n);\nint f_two(void);\nint f_three(int a,\n            int b);\n"
    one = '#include "h.h"\nvoid f_one(int n) {\n    f_two();\n}\n'
    two = '#include "h.h"\nint f_two(void) {\n    f_one(1); // f_three(1, 2) in a comment is no call\n    return 0;\n}\n'
    three = '#include "h.h"\nint f_three(int a, int b) {\n    return f_two() + a + b;\n}\n'
    assert call_cycles({"l/h.h": hdr, "l/one.cpp": one, "l/two.cpp": two}) == [["l/one.cpp", "l/two.cpp", "l/one.cpp"]]
    assert call_cycles({"l/h.h": hdr, "l/one.cpp": one, "l/two.cpp": two.replace("f_one(1);", "")}) == []
    ring3 = {"l/h.h": hdr, "l/one.cpp": one, "l/two.cpp": two.replace("f_one(1);", "f_three(1, 2);"),
             "l/three.cpp": three.replace("f_two()", "0") + "static void g() {\n    f_one(3);\n}\n"}
    assert call_cycles(ring3) == [["l/one.cpp", "l/two.cpp", "l/three.cpp", "l/one.cpp"]]

    # a file that uses a header's names without including it; a header that only includes others
    state = "#pragma once\n#include <vector>\nstruct sparq_state { int n; };\nenum sparq_mode { SPARQ_ON = 0, SPARQ_OFF };\n"
    user = '#include "users.h"\nint g(const sparq_state & s) {\n    return s.n + SPARQ_OFF;\n}\n'
    fwd = '#pragma once\nstruct sparq_state;\nvoid sparq_use(const sparq_state * s);\n'
    hub = '#pragma once\n#include "state.h"\n#include "fwd.h"\n'
    got = include_what_you_use({"l/state.h": state, "l/user.cpp": user, "l/fwd.h": fwd, "l/hub.h": hub})
    assert got == [("", "l/hub.h", ""), ("l/user.cpp", "l/state.h", "SPARQ_OFF"),
                   ("l/user.cpp", "l/state.h", "sparq_state")], got
    assert header_names(state) == {"sparq_state", "sparq_mode", "SPARQ_ON", "SPARQ_OFF"}
    assert header_names(fwd) == {"sparq_use"}


def test_no_include_cycle_in_ggml_sparq():
    cycles = include_cycles(_sources("ggml-sparq"))
    assert not cycles, f"include cycles: {cycles}"


def test_the_llama_layer_calls_one_way():
    """No two files of ggml-sparq/llama/ call each other's functions through their headers, nor do
    longer rings: what several files ask (which rows run dense, the messages) lives in a file of its
    own that calls none of them."""
    cycles = call_cycles(_sources("ggml-sparq/llama"))
    assert not cycles, f"files that call each other: {cycles}"


def test_the_llama_layer_includes_what_it_uses():
    """Each file of ggml-sparq/llama/ includes the headers of that folder whose names it uses (no hub
    that every file includes), and each header there gives names of its own."""
    bad = include_what_you_use({p: t for p, t in _sources("ggml-sparq/llama").items() if p.endswith((".h", ".cpp"))})
    assert not bad, f"(file, header, name used without including it): {bad}"


# a selector by its name, as `grep -rliw NAME ggml-sparq` finds it (the index by its data's names)
SELECTOR_NAMED = {
    "h2o": re.compile(r"(?<![A-Za-z0-9_])h2o(?![A-Za-z0-9_])", re.I),
    "streaming": re.compile(r"(?<![A-Za-z0-9_])streaming(?![A-Za-z0-9_])", re.I),
    "oracle": re.compile(r"(?<![A-Za-z0-9_])oracle(?![A-Za-z0-9_])", re.I),
    "index": re.compile(r"ivf|sel(ector)?_index|index selector", re.I),
}
# the llama layer: a selector is named in its own files and the registry (its row, its name) only
LLAMA_SELECTOR_FILES = {
    "h2o": {"llama-sparq-select-h2o.cpp", "llama-sparq-selectors.cpp"},
    "streaming": {"llama-sparq-select-streaming.cpp", "llama-sparq-selectors.cpp"},
    "oracle": {"llama-sparq-select-sparq.cpp", "llama-sparq-selectors.cpp"},
    "index": {"llama-sparq-select-index.cpp", "llama-sparq-index.cpp", "llama-sparq-index.h",
              "llama-sparq-selectors.cpp"},
}
# all of ggml-sparq/: its own files, the registry rows (op, llama), the settings table and the public
# enums; the ceiling only falls
SELECTOR_FILES_MAX = {"h2o": 6, "streaming": 6, "oracle": 6, "index": 6}


def files_naming(under: str, pattern: re.Pattern) -> set[str]:
    return {rel(p) for p in tracked(under) if pattern.search(p.read_text(errors="replace"))}


def test_selectors_are_named_in_their_own_files():
    for name, pattern in SELECTOR_NAMED.items():
        llama = {Path(p).name for p in files_naming("ggml-sparq/llama", pattern)}
        assert llama <= LLAMA_SELECTOR_FILES[name], f"{name} named outside its files: {sorted(llama - LLAMA_SELECTOR_FILES[name])}"
        every = files_naming("ggml-sparq", pattern)
        assert len(every) <= SELECTOR_FILES_MAX[name], f"{name} is named in {len(every)} files: {sorted(every)}"


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
