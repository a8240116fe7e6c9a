#!/usr/bin/env python3
"""Recipe: write the tiny random llama GGUF used by the tests.

    python models/tiny.py OUT.gguf [--n-layer N --n-head-kv N --weight-type f16 ...]

Same as `python -m llama_sparq.models tiny ...`; see models/README.md.
"""
import sys
from pathlib import Path

try:
    import llama_sparq.models  # noqa: F401
except ImportError:  # not installed: use the checkout's py/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from llama_sparq.models import main

if __name__ == "__main__":
    sys.exit(main(["tiny", *sys.argv[1:]]))
