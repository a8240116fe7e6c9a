"""pip builds llama.cpp once: `pip wheel .` with build isolation (no Makefile), then the
wheel installed into a fresh virtual environment, gives a working llama_sparq.Llama.

llama-cpp-python is not a dependency any more: its pure-Python layer (llama_cpp) comes
from the pinned sdist with our wheel, so pip neither downloads nor builds it (and never
compiles its copy of llama.cpp). The build reuses the persistent build folder
(build/<wheel tag>, with ccache) and the sdist cache (.upstream/sdist), so a warm run
takes about a minute or two; the log, the timings and the evidence are written to
build/pip-install-test/ for the record.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import llama_sparq

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "build" / "pip-install-test"
LAB = ROOT / "dev" / "sparq_lab"  # the research helpers: outside the wheel


def _env() -> dict:
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"),
               CCACHE_BASEDIR=str(ROOT), CCACHE_NOHASHDIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               OMP_WAIT_POLICY="PASSIVE")
    # this test process points llama_cpp at the development install; the fresh venv must find its own
    for k in ("LLAMA_SPARQ_LIB_DIR", "LLAMA_CPP_LIB_PATH", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(k, None)
    return env


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=_env(), **kw)


def test_pip_wheel_builds_llama_cpp_once_and_installs_elsewhere(tmp_path, tiny_model):
    RECORD.mkdir(parents=True, exist_ok=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"

    # 1. pip wheel . (build isolation on: pip installs the build requirements, scikit-build-core
    #    runs CMake once for this project)
    t0 = time.time()
    res = _run([py, "-m", "pip", "wheel", "-v", "--no-deps", "-w", tmp_path / "wheels", ROOT], cwd=tmp_path)
    t_wheel = time.time() - t0
    log = res.stdout + res.stderr
    (RECORD / "pip-wheel.log").write_text(log)
    assert res.returncode == 0, log[-4000:]
    wheels = sorted((tmp_path / "wheels").glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["llama_sparq"], wheels   # no llama_cpp_python wheel
    # pip never collected, downloaded or built llama-cpp-python (the upstream sdist is fetched by
    # scripts/upstream.py, once, into .upstream/sdist, and only unpacked)
    assert not re.search(r"(Collecting|Downloading|Building wheel for|Created wheel for) llama[-_]cpp[-_]python", log,
                         re.I), log[-4000:]
    assert "Installing build dependencies" in log                                   # isolation was on
    cmake_projects = log.count("llama-sparq: upstream tree")
    libllama_links = log.count("Linking CXX shared library bin/libllama.so")
    assert cmake_projects == 1, "expected one CMake configure of llama-sparq in the build log"
    assert libllama_links <= 1

    names = zipfile.ZipFile(wheels[0]).namelist()
    for need in ("llama_sparq/lib/libllama.so", "llama_sparq/include/llama-sparq.h", "llama_sparq/bindings/capi.py",
                 "llama_sparq/bindings/cdef.py", "llama_cpp/llama.py", "llama_cpp/llama_cpp.py", "llama_cpp/LICENSE.md",
                 "llama_sparq/lib/llama-cli"):
        assert need in names, need
    assert [n for n in names if n.endswith("libllama.so")] == ["llama_sparq/lib/libllama.so"]
    research = {f"llama_sparq/{p.name}" for p in LAB.glob("*.py") if p.name not in ("__init__.py", "models.py")}
    assert not [n for n in names if n in research or n.startswith("sparq_lab/")], names

    # 2. the wheel into the fresh venv (its dependencies from the index / pip's cache)
    t0 = time.time()
    res = _run([py, "-m", "pip", "install", wheels[0]], cwd=tmp_path)
    t_install = time.time() - t0
    (RECORD / "pip-install.log").write_text(res.stdout + res.stderr)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    installed = _run([py, "-m", "pip", "list", "--format=json"], cwd=tmp_path)
    dists = {d["name"].lower().replace("_", "-") for d in json.loads(installed.stdout)}
    assert "llama-sparq" in dists and "llama-cpp-python" not in dists and "cffi" in dists

    # 3. it works there, on its own copy of the library, with the same version/ABI checks
    code = ("import llama_sparq, llama_cpp, sys\n"
            "from llama_sparq import Llama\n"
            "print(llama_sparq.check_library())\n"
            "print(llama_cpp.__file__)\n"
            "print(llama_cpp.llama_cpp._lib._name)\n"
            "llm = Llama(sys.argv[1], n_ctx=512, verbose=False, sparq=True, sparq_k=8, sparq_r=4, sparq_min_kv=0)\n"
            "out = llm('hello', max_tokens=8, temperature=0)\n"
            "print(llm.sparq_stats()['n_sparq'])\n"
            "try:\n"
            "    Llama(sys.argv[1], n_ctx=256, verbose=False, sparq_k=-1)\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    res = _run([py, "-c", code, tiny_model], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    version, llama_cpp_file, lib_name, n_sparq, err = res.stdout.strip().splitlines()[-5:]
    assert version == llama_sparq.check_library()
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert Path(llama_cpp_file).is_relative_to(site)
    assert Path(lib_name).resolve() == (site / "llama_sparq" / "lib" / "libllama.so").resolve()
    assert int(n_sparq) > 0
    assert err.startswith("SparQ: k = -1 is out of range")
    libs = sorted(str(p.relative_to(site)) for p in site.rglob("libllama.so"))
    assert libs == ["llama_sparq/lib/libllama.so"], libs

    (RECORD / "result.json").write_text(json.dumps(dict(
        wheel=wheels[0].name, wheel_mb=round(wheels[0].stat().st_size / 1e6, 1), pip_wheel_s=round(t_wheel, 1),
        pip_install_s=round(t_install, 1), cmake_configures_of_llama_sparq=cmake_projects,
        libllama_links_in_log=libllama_links, llama_cpp_python_collected=False, version=version,
        libllama_in_venv=libs), indent=2) + "\n")


def _wheel_sources() -> list[Path]:
    """The Python files of the folders pyproject.toml's wheel.packages puts in the wheel."""
    line = next(ln for ln in (ROOT / "pyproject.toml").read_text().splitlines() if ln.startswith("wheel.packages"))
    folders = re.findall(r'=\s*"([^"]+)"', line.split("=", 1)[1])
    assert "py/llama_sparq" in folders, line
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _top_level_defs(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_wheel_ships_no_research_modules():
    """The wheel's packages neither import the research helpers (dev/sparq_lab) nor carry them: no
    module of the same name (models.py is the package's real models), no public function or class
    sparq_lab defines. Read from the source, so it needs no build."""
    sources = _wheel_sources()
    assert ROOT / "py" / "llama_sparq" / "_llama.py" in sources   # the folders were found
    imports = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            imports += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "sparq_lab"]
    assert not imports, imports

    lab = sorted(LAB.glob("*.py"))
    assert LAB / "reference.py" in lab
    shipped = {p.name for p in sources}
    clash = shipped & ({p.name for p in lab} - {"__init__.py", "models.py"})
    assert not clash, clash
    # main: every command-line module has its own
    lab_defs = {n for p in lab for n in _top_level_defs(p) if not n.startswith("_")} - {"main"}
    assert {"sparq_attention", "make_tiny_llama", "Capture", "compression"} <= lab_defs
    copies = [f"{p.relative_to(ROOT)}: {n}" for p in sources for n in _top_level_defs(p) & lab_defs]
    assert not copies, copies
