#!/usr/bin/env python3
"""Recipe: write the tiny random llama GGUF used by the tests.

    python models/tiny.py OUT.gguf [--n-layer N --n-head-kv N --weight-type f16 ...]

Same as `python -m sparq_lab.models tiny ...` (with dev/ on sys.path); see models/README.md.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the generator is a research helper in dev/ (not in the wheel); it needs llama_sparq.models
sys.path.insert(0, str(ROOT / "dev"))
try:
    import llama_sparq.models  # noqa: F401
except ImportError:  # not installed: use the checkout's py/
    sys.path.insert(0, str(ROOT / "py"))

from sparq_lab.models import main

if __name__ == "__main__":
    sys.exit(main(["tiny", *sys.argv[1:]]))
