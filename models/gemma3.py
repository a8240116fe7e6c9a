#!/usr/bin/env python3
"""Recipe: fetch/assemble Gemma 3 270M Q4_K_M and print its path.

    python models/gemma3.py [--no-install]

Same as `python -m llama_sparq.models gemma3`; see models/README.md.
"""
import sys
from pathlib import Path

try:
    import llama_sparq.models  # noqa: F401
except ImportError:  # not installed: use the checkout's py/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from llama_sparq.models import main

if __name__ == "__main__":
    sys.exit(main(["gemma3", *sys.argv[1:]]))
