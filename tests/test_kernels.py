"""GGML_OP_SPARQ_ATTN and its CPU kernels against the NumPy reference.

- every ISA this CPU has (scalar, AVX2, AVX-512 forced in turn) over the grid of
  tests/sparq_cases.py, through the kernel layer with 1 and 2 threads;
- the op through ggml's graph and CPU backend (threads split the S axis);
- NEON: the kernels cross-compiled with Debian's aarch64 compiler, run under qemu-user;
- AddressSanitizer + UndefinedBehaviorSanitizer: the kernels built with both, on a grid;
- ThreadSanitizer: the ISA choice by many threads at once, and the kernels on 4 threads.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_sparq import tool_path
from sparq_cases import Case, check, generate, grid, run

ROOT = Path(__file__).resolve().parent.parent
SPARQ_DIR = ROOT / "ggml-sparq"
CPU_DIR = SPARQ_DIR / "cpu"
ISA_DIR = CPU_DIR / "isa"
# every folder of ggml-sparq/ whose headers the kernel layer includes by bare name
INCLUDE_DIRS = [SPARQ_DIR / "include", SPARQ_DIR / "op", CPU_DIR, ISA_DIR]


def kernel_sources(*isas: str) -> list[Path]:
    """The CPU kernel layer without ggml: the driver (cpu/*.cpp less ggml's glue), the scalar
    ISA and the named ones (cpu/isa/sparq-cpu-<isa>.cpp), as ggml-sparq/CMakeLists.txt builds it."""
    driver = sorted(p for p in CPU_DIR.glob("*.cpp") if p.name != "ggml-sparq-cpu.cpp")
    return driver + [ISA_DIR / f"sparq-cpu-{isa}.cpp" for isa in ("scalar", *isas)]
BUILD = ROOT / "build" / "tests"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = cpu_flags()
ISAS = {
    "scalar": True,
    "avx2": {"avx2", "fma", "f16c"} <= FLAGS,
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c", "fma"} <= FLAGS,
}
GRID = grid()
QUICK = grid(quick=True)


@pytest.fixture(scope="module")
def prog():
    return tool_path("sparq-op-test")


def test_isa_auto_picks_the_best(prog):
    out = subprocess.run([str(prog), "isa"], capture_output=True, text=True, check=True).stdout.strip()
    best = "avx512" if ISAS["avx512"] else "avx2" if ISAS["avx2"] else "scalar"
    assert out == best


def test_isa_unknown_is_refused(prog, tmp_path):
    c = QUICK[0]
    env = dict(os.environ, GGML_SPARQ_ISA="sse9")
    res = subprocess.run([str(prog), "isa"], capture_output=True, text=True, env=env)
    assert res.returncode != 0
    assert "GGML_SPARQ_ISA=sse9" in res.stderr and "allowed" in res.stderr


def test_op_parameters_are_typed_and_every_backend_honours_or_refuses_each_part(prog):
    """The op's one parameter layout (ggml-sparq-params.h), through ggml: the constructor's values come
    back from the decoder and from a byte copy (an RPC server's view), every field in a slot (the pairs
    no node sets together share one);
    the layout leaves GGML_SPARQ_PARAMS_MIN_FREE slots free; a node no backend may run is refused by
    ggml_sparq_attn_check with its reason; each optional part sets its feature
    bit; the CPU backend's supports_op honours every part and CUDA's support check (host code) exactly
    those it declares; a part unknown to this build (a field a newer constructor added) and another
    layout version are refused by both, so no backend can ignore a parameter it does not know."""
    res = subprocess.run([str(prog), "params-check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "params-check: OK: 21 parts" in res.stdout, res.stdout
    # CUDA honours 13: the oracle, per-head, no mean-V, window, basis, the calibrated k (2), the report,
    # the bucketed top-k and the attention variants (soft-capping, ALiBi, sinks, a KQ bias); not the
    # step's append
    assert "as declared by CUDA (13 of them)" in res.stdout, res.stdout
    assert "unknown parts and another layout refused by both" in res.stdout
    free = int(re.search(r"(\d+) of 16 op_params slots free", res.stdout).group(1))
    assert free >= 4, res.stdout


def isa_check(cmd: list, isa: str, mode: str, expect: str) -> None:
    """sparq-op-test's MODE-check of one ISA (cmd: the program, under qemu for NEON): exit 0 and
    its summary line."""
    if not ISAS.get(isa, True):
        pytest.skip(f"this CPU has no {isa}")
    res = subprocess.run([*map(str, cmd), mode, isa], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert expect in res.stdout


@pytest.mark.parametrize("isa", list(ISAS))
def test_list_gather_equals_its_reference(prog, isa):
    """The index selector's vectorised gather of the probed lists' cells, against the scalar loop:
    every hit, in order, and the stop at a cell in no list yet (or an id out of range)."""
    isa_check([prog], isa, "gather-check", "cases equal to the reference")


@pytest.mark.parametrize("isa", list(ISAS))
def test_approximate_scores_equal_the_scalar_isas(prog, isa):
    """Step 1's approximate scores of every ISA (f32, f16, e5m2 and 4-bit K^T rows) against the
    scalar ISA's: the same bits, over head counts, row counts, lengths around the vector widths and
    register tiles, 4-bit blocks cut by the range; and the kept exponentials (expsum_store) against
    expsum and exp_acc."""
    isa_check([prog], isa, "scores-check", "cases equal to the scalar ISA's")


@pytest.mark.parametrize("isa", list(ISAS))
def test_head_gathers_equal_one_head_at_a_time(prog, isa):
    """The exact attention's g-head gathers (each K or V row read once for a KV head's query heads)
    against the one-head gathers run per head: the same bits, over head counts, row lengths, f16
    and f32 rows."""
    isa_check([prog], isa, "heads-check", "cases equal to one head at a time")


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_kernel_isa(prog, tmp_path, isa, case):
    if not ISAS[isa]:
        pytest.skip(f"this CPU has no {isa}")
    a = generate(case)
    out, sel = run(prog, "direct", case, a, tmp_path, isa=isa, threads=1)
    check(case, a, out, sel)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("case", QUICK, ids=lambda c: c.id)
def test_kernel_threads(prog, tmp_path, threads, case):
    a = generate(case)
    out, sel = run(prog, "direct", case, a, tmp_path, threads=threads)
    check(case, a, out, sel)


# SmolLM2's shape (3 KV heads of 64, 9 query heads): units that do not divide among the threads,
# so the exact attention is shared per (unit, query head); with the calibrated k, heads that
# reach the target and diffuse ones that attend over every valid cell
SPLIT = [
    Case(d=64, S=3000, r=16, k=750, l=32, n_head=9, n_head_kv=3, mask="holes", win="random", coverage=0.95,
         k_min=128, seed=901),
    Case(d=64, S=3000, r=16, k=750, l=32, n_head=9, n_head_kv=3, mask="holes", win="random", coverage=0.3,
         k_min=64, seed=902),
    Case(d=64, S=2000, r=8, k=100, l=16, n_head=9, n_head_kv=3, mask="pad", seed=903),
    Case(d=64, S=2000, r=8, k=100, l=16, n_rows=2, n_head=6, n_head_kv=3, mask="causal", kv_type="q8_0", seed=904),
    Case(d=64, S=2000, r=8, k=100, l=16, n_head=9, n_head_kv=3, mask="holes", selector="h2o", seed=905),
    # chunks shorter than the cap, part padding (at the cap a chunk offers every valid cell)
    Case(d=64, S=900, r=16, k=400, l=16, n_head=9, n_head_kv=3, mask="pad", coverage=0.9, k_min=32, seed=906),
]


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("case", SPLIT, ids=lambda c: c.id)
def test_kernel_threads_share_heads(prog, tmp_path, threads, case):
    a = generate(case)
    out, sel = run(prog, "direct", case, a, tmp_path, threads=threads)
    check(case, a, out, sel)
    one, sel1 = run(prog, "direct", case, a, tmp_path, threads=1)
    assert abs(out - one).max() <= 1e-5 * max(1.0, abs(one).max())
    if sel is not None:
        assert (sel == sel1).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", QUICK, ids=lambda c: c.id)
def test_ggml_op(prog, tmp_path, threads, case):
    a = generate(case)
    out, _ = run(prog, "ggml", case, a, tmp_path, threads=threads)
    check(case, a, out, None)


def test_ggml_op_threads_agree(prog, tmp_path):
    # the S split changes only which thread finds a candidate, not the result
    c = Case(d=128, S=5000, r=16, k=128, l=32, n_head=8, n_head_kv=2, mask="holes", seed=7)
    a = generate(c)
    o1, _ = run(prog, "ggml", c, a, tmp_path, threads=1)
    o2, _ = run(prog, "ggml", c, a, tmp_path, threads=2)
    assert abs(o1 - o2).max() <= 1e-5 * max(1.0, abs(o1).max())


ISA_FLAGS = {
    "sparq-cpu-avx2.cpp": ["-mavx2", "-mfma", "-mf16c"],
    "sparq-cpu-avx512.cpp": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}


def _build_standalone(out: Path, cxx: str, extra: list[str], sources: list[Path], link: list[str] = ()) -> Path:
    """Compile the kernel layer + the test driver without ggml (each ISA file with its flags)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    headers = [h for d in INCLUDE_DIRS for h in d.glob("*.h")]
    newest = max(p.stat().st_mtime for p in sources + headers)
    if out.exists() and out.stat().st_mtime > newest:
        return out
    objs = []
    for src in sources:
        obj = out.parent / (src.name + ".o")
        cmd = [cxx, "-std=c++17", "-O2", "-g", *(f"-I{d}" for d in INCLUDE_DIRS), *extra, *ISA_FLAGS.get(src.name, []),
               "-c", str(src), "-o", str(obj)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
        objs.append(str(obj))
    cmd = [cxx, *extra, *objs, "-o", str(out), "-pthread", *link]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return out


@pytest.fixture(scope="module")
def neon_prog():
    cxx = shutil.which("aarch64-linux-gnu-g++")
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not cxx or not qemu:
        pytest.fail("NEON tests need aarch64-linux-gnu-g++ and qemu-aarch64 (make deps-system installs them)")
    srcs = kernel_sources("neon") + [ROOT / "tests" / "native" / "sparq-op-test.cpp"]
    exe = _build_standalone(BUILD / "aarch64" / "sparq-op-test", cxx, ["-march=armv8-a"], srcs, link=["-static"])
    return exe, qemu


def test_neon_head_gathers(neon_prog):
    exe, qemu = neon_prog
    isa_check([qemu, exe], "neon", "heads-check", "cases equal to one head at a time")


def test_neon_approximate_scores(neon_prog):
    exe, qemu = neon_prog
    isa_check([qemu, exe], "neon", "scores-check", "cases equal to the scalar ISA's")


def test_neon_is_selected(neon_prog):
    exe, qemu = neon_prog
    out = subprocess.run([qemu, str(exe), "isa"], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "neon"


@pytest.mark.parametrize("case", QUICK, ids=lambda c: c.id)
def test_kernel_neon(neon_prog, tmp_path, case):
    exe, qemu = neon_prog
    a = generate(case)
    out, sel = run(exe, "direct", case, a, tmp_path, isa="neon", threads=2, prefix=[qemu])
    check(case, a, out, sel)


@pytest.fixture(scope="module")
def sanitized_prog():
    cxx = shutil.which("g++")
    srcs = kernel_sources("avx2", "avx512") + [ROOT / "tests" / "native" / "sparq-op-test.cpp"]
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    return _build_standalone(BUILD / "asan" / "sparq-op-test", cxx, flags, srcs)


@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("case", QUICK, ids=lambda c: c.id)
def test_kernel_sanitizers(sanitized_prog, tmp_path, isa, case):
    if not ISAS[isa]:
        pytest.skip(f"this CPU has no {isa}")
    a = generate(case)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    out, sel = run(sanitized_prog, "direct", case, a, tmp_path, isa=isa, threads=2, env=env)
    check(case, a, out, sel)


@pytest.fixture(scope="module")
def tsan_prog():
    cxx = shutil.which("g++")
    srcs = kernel_sources("avx2", "avx512") + [ROOT / "tests" / "native" / "sparq-op-test.cpp"]
    flags = ["-fsanitize=thread", "-fno-omit-frame-pointer"]
    return _build_standalone(BUILD / "tsan" / "sparq-op-test", cxx, flags, srcs)


TSAN_ENV = dict(os.environ, TSAN_OPTIONS="halt_on_error=1:exitcode=66")


def test_isa_choice_is_race_free(tsan_prog):
    """The op's worker threads choose the ISA at once on the first step: no data race."""
    for _ in range(3):
        res = subprocess.run([str(tsan_prog), "isa-threads", "8"], capture_output=True, text=True, env=TSAN_ENV)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.strip() in ISAS


@pytest.mark.parametrize("case", QUICK[:6] + SPLIT, ids=lambda c: c.id)
def test_kernel_threads_tsan(tsan_prog, tmp_path, case):
    """The kernels on 4 threads under ThreadSanitizer (chunked scores, merges, barriers, the units'
    hand-off from the selection to the attention)."""
    a = generate(case)
    out, sel = run(tsan_prog, "direct", case, a, tmp_path, threads=4, env=TSAN_ENV)
    check(case, a, out, sel)


def test_backend_ops_has_the_sparq_case():
    """test-backend-ops knows the op: its perf cases run on the CPU backend. (Its correctness
    mode compares other backends against the CPU, so on a CPU-only machine it has nothing to
    compare and skips the CPU backend.)"""
    exe = tool_path("test-backend-ops")
    res = subprocess.run([str(exe), "perf", "-o", "SPARQ_ATTN", "-b", "CPU"], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "SPARQ_ATTN(" in res.stdout and "us/run" in res.stdout
    res = subprocess.run([str(exe), "test", "-o", "SPARQ_ATTN"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0
