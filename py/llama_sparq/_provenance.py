"""Where a result came from: the machine's CPU and the code's commit, shared by the eval suite
(``llama_sparq.eval``) and the benchmarks (``bench/benchlib.py``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The CPU's name with its family/model and vector extensions: a name such as "AMD EPYC"
    alone does not tell a Zen 3 (AVX2) from a Zen 5 (AVX-512), and results differ."""
    info, flags = {}, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu family", "model") and key not in info:
                    info[key] = val.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine() or "unknown"
    extra = []
    if "cpu family" in info:
        extra.append(f"family {info['cpu family']} model {info.get('model', '?')}")
    if flags:
        isa = [x for x in ("avx512f", "avx2", "fma", "f16c", "asimd", "fphp") if x in flags]
        extra.append(" ".join(isa) if isa else "no SIMD extension the kernels use")
    return f"{name} ({'; '.join(extra)})" if extra else name


def git_commit(root: str | Path) -> str:
    """HEAD of the checkout at root, '-dirty' when tracked files other than bench/results/ are
    modified (results being written do not make the code dirty). Where root is not a git checkout
    (a copy of the tree on another machine, whose .git may be stale or absent), $LLAMA_SPARQ_COMMIT
    names the commit it was copied from and is used as it is."""
    env = os.environ.get("LLAMA_SPARQ_COMMIT")
    if env:
        return env + " (copied tree; $LLAMA_SPARQ_COMMIT)"
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        st = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                            text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    dirty = any(line and not line.startswith("??") and not line[3:].startswith("bench/results/")
                for line in st.splitlines())
    return head + ("-dirty" if dirty else "")
