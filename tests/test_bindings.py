"""The cffi bindings of the fork's C API (bindings/, installed as llama_sparq.bindings) and
the one source of truth for SparQ's settings: declarations from llama-sparq.h, struct
layouts equal to the C compiler's, names and validation from the library, the same
message from every front end, the same keywords in the constructor and the setter."""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import llama_sparq
from llama_sparq import LibraryError, check_library, tool_path

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "ggml-sparq" / "include" / "llama-sparq.h"


def bindings():
    from llama_sparq import bindings as b

    return b


def lib():
    from llama_sparq._lib import library

    return library()


# ---------------------------------------------------------------------------
# the header -> cdef step
# ---------------------------------------------------------------------------

def test_installed_header_is_the_source_header():
    b = bindings()
    assert b.header_path().read_text() == HEADER.read_text()
    assert b.header_path().parent.name == "include"   # llama_sparq/include/llama-sparq.h in the wheel
    # and its settings' table beside it (the struct's fields)
    table = HEADER.parent / "llama-sparq-settings.def"
    assert (b.header_path().parent / table.name).read_text() == table.read_text()


def test_cdef_region_holds_the_whole_api():
    from llama_sparq.bindings.cdef import cdef_source

    src = cdef_source(HEADER.read_text())
    assert "LLAMA_API" not in src and "#include" not in src and "extern" not in src
    declared = set(re.findall(r"\b(llama_sparq_\w+)\s*\(", re.sub(r"//[^\n]*", "", HEADER.read_text())))
    b = bindings()
    names = set(dir(lib()))
    assert declared and declared <= names, declared - names
    for struct in ("struct llama_sparq_params", "struct llama_sparq_stats"):
        assert b.ffi.sizeof(struct) > 0


@pytest.mark.parametrize("text,message", [
    ("int a;\n", "expected one"),
    ("// ---- cffi: begin ----\nint a;\n", "expected one"),
    ("// ---- cffi: end ----\n// ---- cffi: begin ----\n", "expected one"),
    ("// ---- cffi: begin ----\n#include <x.h>\n// ---- cffi: end ----\n", "line 1 of the cffi region"),
    ("// ---- cffi: begin ----\n#define X (1 << 2)\n// ---- cffi: end ----\n", "only `#define NAME <integer>`"),
])
def test_cdef_refuses_what_cffi_cannot_read(text, message):
    from llama_sparq.bindings.cdef import HeaderError, cdef_source

    with pytest.raises(HeaderError, match=re.escape(message)):
        cdef_source(text)


def test_cdef_keeps_integer_defines_and_drops_llama_api():
    from llama_sparq.bindings.cdef import cdef_source

    src = cdef_source("// ---- cffi: begin ----\n#define N 16777216 // 2^24\nLLAMA_API int f(void);\n"
                      "// ---- cffi: end ----\n")
    assert "#define N 16777216" in src and "\nint f(void);" in src


# ---------------------------------------------------------------------------
# layouts: cffi (from the header) against the C compiler
# ---------------------------------------------------------------------------

def _upstream_includes() -> list[str]:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "upstream.py"), "prepare"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    tree = Path(res.stdout.strip())
    return [f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}"]


def test_struct_layouts_and_constants_equal_the_c_compilers(tmp_path):
    """A C program printing sizeof/offsetof of every field cffi knows, every enum value and
    integer #define, compiled against the real header and llama.h: cffi agrees with all."""
    b = bindings()
    ffi = b.ffi
    lines, want = [], []
    for struct in ("struct llama_sparq_params", "struct llama_sparq_stats"):
        lines.append(f'printf("%zu\\n", sizeof({struct}));')
        want.append(ffi.sizeof(struct))
        for name, _ in ffi.typeof(struct).fields:
            lines.append(f'printf("%zu\\n", offsetof({struct}, {name}));')
            want.append(ffi.offsetof(struct, name))
    enums = [t for t in ("enum llama_sparq_dense_reason", "enum llama_sparq_selector", "enum llama_sparq_gqa",
                         "enum llama_sparq_basis")]
    for e in enums:
        for value, name in ffi.typeof(e).elements.items():
            lines.append(f'printf("%lld\\n", (long long) {name});')
            want.append(value)
    for name in ("LLAMA_SPARQ_ABI_VERSION", "LLAMA_SPARQ_MAX_CELLS"):
        lines.append(f'printf("%lld\\n", (long long) {name});')
        want.append(b.DEFINES[name])
    src = tmp_path / "layout.c"
    src.write_text('#include "llama-sparq.h"\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n'
                   + "\n".join("    " + l for l in lines) + "\n    return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", f"-I{HEADER.parent}", *_upstream_includes(), str(src), "-o", str(exe)],
                   check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == want
    assert len(ffi.typeof("struct llama_sparq_stats").fields) >= 8 and len(enums) == 4


def test_library_agrees_with_the_header():
    b, L = bindings(), lib()
    assert L.llama_sparq_default_params().size == b.ffi.sizeof("struct llama_sparq_params")
    assert L.llama_sparq_abi_version() == b.HEADER_ABI == llama_sparq.ABI_VERSION
    # a stats struct of another size is refused (-1), so a layout drift cannot go unnoticed
    s = b.ffi.new("struct llama_sparq_stats *")
    s.size = b.ffi.sizeof("struct llama_sparq_stats") - 8
    assert L.llama_sparq_get_stats(b.ffi.NULL, s) == -1


def test_library_with_another_struct_layout_is_refused(tmp_path):
    """Right version string and ABI number, wrong sizeof(struct llama_sparq_params): refused at load."""
    b = bindings()
    n = b.ffi.sizeof("struct llama_sparq_params")
    abi = llama_sparq.ABI_VERSION
    src = tmp_path / "fake.c"
    src.write_text(f'#include <stddef.h>\n'
                   f'const char * llama_sparq_version(void) {{ return "llama-sparq 0.1.0 abi {abi} llama.cpp abc"; }}\n'
                   f'int llama_sparq_abi_version(void) {{ return {abi}; }}\n'
                   f'struct p {{ size_t size; char rest[{n - 8}]; }};\n'
                   f'struct p llama_sparq_default_params(void) {{ struct p x = {{0}}; x.size = {n - 8}; return x; }}\n')
    out = tmp_path / "libllama.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    with pytest.raises(LibraryError) as e:
        check_library(out)
    assert f"sizeof(struct llama_sparq_params) is {n - 8} in the library, {n} from the header" in str(e.value)


def test_no_ctypes_bindings_of_the_sparq_api_remain():
    """The fork's API is bound through cffi only: no ctypes Structure for its structs, no
    restype/argtypes or ctypes.CDLL for its functions anywhere in the package or bindings."""
    offenders = []
    for path in [*(ROOT / "py" / "llama_sparq").rglob("*.py"), *(ROOT / "bindings").rglob("*.py")]:
        text = path.read_text()
        for pat in (r"class\s+llama_sparq\w*\s*\(\s*ctypes\.", r"\.llama_sparq_\w+\.(restype|argtypes)",
                    r"ctypes\.CDLL"):
            for m in re.finditer(pat, text):
                offenders.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not offenders, offenders
    assert "import ctypes" not in (ROOT / "py" / "llama_sparq" / "_sparq.py").read_text()
    assert "import ctypes" not in (ROOT / "py" / "llama_sparq" / "_lib.py").read_text()


def test_ctx_pointer_from_ctypes(tiny_model):
    from llama_sparq import Llama

    b = bindings()
    llm = Llama(str(tiny_model), n_ctx=256, verbose=False, sparq=True)
    raw = llm._ctx.ctx            # llama-cpp-python's llama_context_p (ctypes c_void_p; read back as an int)
    addr = raw if isinstance(raw, int) else raw.value
    assert addr
    p = b.ctx_ptr(raw)
    assert b.ffi.typeof(p) is b.ffi.typeof("struct llama_context *")
    assert int(b.ffi.cast("uintptr_t", p)) == addr
    assert b.ctx_ptr(ctypes.c_void_p(addr)) == p == b.ctx_ptr(p)
    # the pointer reaches the library: the context's settings come back
    assert bindings_get_k(b, p) == 0  # the calibrated k, the default
    with pytest.raises(ValueError, match="NULL"):
        b.ctx_ptr(ctypes.c_void_p(None))


def bindings_get_k(b, p) -> int:
    out = b.ffi.new("struct llama_sparq_params *")
    out.size = b.ffi.sizeof("struct llama_sparq_params")
    assert lib().llama_sparq_get_params(p, out) == 0
    return out.k


# ---------------------------------------------------------------------------
# one source of truth: names and validation in C, the same keywords everywhere
# ---------------------------------------------------------------------------

def test_names_come_from_the_library():
    from llama_sparq import _sparq

    L = lib()
    for attr, prefix, count in (("DENSE_REASONS", "LLAMA_SPARQ_DENSE_", "LLAMA_SPARQ_DENSE_COUNT"),
                                ("SELECTORS", "LLAMA_SPARQ_SELECTOR_", "LLAMA_SPARQ_SELECTOR_COUNT"),
                                ("GQA_MODES", "LLAMA_SPARQ_GQA_", "LLAMA_SPARQ_GQA_COUNT"),
                                ("BASES", "LLAMA_SPARQ_BASIS_", "LLAMA_SPARQ_BASIS_COUNT")):
        names = getattr(_sparq, attr)
        assert len(names) == getattr(L, count)
        # the enum constant of each name (LLAMA_SPARQ_DENSE_SWA for "swa") indexes it
        for i, n in enumerate(names):
            assert getattr(L, prefix + n.upper()) == i, (attr, n)
    # no Python copy of the lists
    src = "\n".join(p.read_text() for p in (ROOT / "py" / "llama_sparq").rglob("*.py"))
    for copy in ('"prefill", "short"', '"shared", "per_head"', '"model", "scaled", "pca"', '"sparq", "oracle"'):
        assert copy not in src, copy


def test_constructor_setter_and_getter_use_the_same_keywords(tiny_model):
    from llama_sparq import Llama, _sparq
    from llama_sparq._llama import sparq_keyword

    want = {sparq_keyword(f) for f in _sparq.fields()}
    assert want == {"sparq", "sparq_r", "sparq_k", "sparq_l", "sparq_min_kv", "sparq_all_rows", "sparq_selector",
                    "sparq_gqa", "sparq_mean_v", "sparq_basis", "sparq_index_lists", "sparq_index_probe",
                    "sparq_coverage", "sparq_k_min", "sparq_k_frac", "sparq_kt_bits", "sparq_topk_buckets"}
    ctor = {p for p in inspect.signature(Llama.__init__).parameters if p.startswith("sparq")}
    assert ctor == want
    llm = Llama(str(tiny_model), n_ctx=256, verbose=False, sparq_r=4, sparq_k=32, sparq_basis="pca")
    got = llm.sparq_params()
    assert set(got) == want and (got["sparq"], got["sparq_r"], got["sparq_k"], got["sparq_basis"]) == (True, 4, 32, "pca")
    llm.set_sparq(sparq_r=8, sparq_gqa="per_head", sparq_mean_v=False)
    got2 = llm.sparq_params()
    assert (got2["sparq_r"], got2["sparq_gqa"], got2["sparq_mean_v"], got2["sparq_k"]) == (8, "per_head", False, 32)
    # what one gives back, the other takes
    llm.set_sparq(**got)
    assert llm.sparq_params() == got
    other = Llama(str(tiny_model), n_ctx=256, verbose=False, **got2)
    assert other.sparq_params() == got2
    # the struct's own names are not keywords, with a pointer to the right one
    with pytest.raises(ValueError, match=r"unknown SparQ setting 'r' \(the keyword is 'sparq_r'"):
        llm.set_sparq(r=8)
    with pytest.raises(ValueError, match="unknown SparQ setting 'sparq_q'"):
        llm.set_sparq(sparq_q=8)
    with pytest.raises(ValueError, match=r"unknown SparQ setting 'sparq_enabled'"):
        llm.set_sparq(sparq_enabled=False)
    with pytest.raises(ValueError, match=r"unknown SparQ setting 'enabled' \(the keyword is 'sparq'"):
        llm.set_sparq(enabled=False)


def _c_message(stderr: str) -> str:
    m = re.search(r"SparQ: [^\n]*", stderr)
    assert m, stderr[-2000:]
    return m.group(0).strip()


@pytest.mark.parametrize("kw,flags", [
    (dict(sparq_k=-4), ["--sparq-k", "-4"]),
    (dict(sparq_coverage=1.5), ["--sparq-coverage", "1.5"]),
    (dict(sparq_k_min=-1), ["--sparq-k-min", "-1"]),
    (dict(sparq_k_frac=2.0), ["--sparq-k-frac", "2"]),
    (dict(sparq_r=-2), ["--sparq-r", "-2"]),
    (dict(sparq_r=99), ["--sparq-r", "99"]),
    (dict(sparq_l=40, sparq_k=32), ["--sparq-l", "40", "--sparq-k", "32"]),
    (dict(sparq_min_kv=-2), ["--sparq-min-kv", "-2"]),
])
def test_every_front_end_reports_the_same_c_message(tiny_model, kw, flags):
    """Python, the common flags (llama-completion) and llama-bench report llama_sparq_set_params's
    message word for word, and exit non-zero / raise."""
    from llama_sparq import Llama

    with pytest.raises(ValueError) as e:
        Llama(str(tiny_model), n_ctx=256, verbose=False, **kw)
    msg = str(e.value)
    assert msg.startswith("SparQ: ") and "allowed" in msg
    res = subprocess.run([str(tool_path("llama-completion")), "-m", str(tiny_model), "-p", "hi", "-n", "1", "-no-cnv",
                          "-t", "1", "-c", "256", *flags], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert res.returncode != 0
    assert _c_message(res.stderr + res.stdout) == msg
    res = subprocess.run([str(tool_path("llama-bench")), "-m", str(tiny_model), "-p", "0", "-n", "1", "-r", "1",
                          "-t", "1", *flags], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert res.returncode != 0
    assert _c_message(res.stderr) == msg
