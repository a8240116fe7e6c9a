#!/usr/bin/env python3
"""The main job on the default model: fetch Gemma 3 270M, generate with the fork's
Python Llama and with its llama-cli (and llama-completion)."""

from __future__ import annotations

import subprocess
import sys

from llama_sparq import Llama, tool_path
from llama_sparq.models import default_model_path

PROMPT = "The three primary colours are"


def main() -> int:
    model = default_model_path()
    print(f"model: {model}", flush=True)

    print("\n== Python: llama_sparq.Llama ==", flush=True)
    llm = Llama(str(model), n_ctx=2048, n_threads=2, verbose=False, seed=1)
    out = llm(PROMPT, max_tokens=24, temperature=0.0)
    print(PROMPT + out["choices"][0]["text"], flush=True)

    print("\n== llama-completion ==", flush=True)
    subprocess.run([str(tool_path("llama-completion")), "-m", str(model), "-p", PROMPT, "-n", "48",
                    "--temp", "0", "-no-cnv", "-t", "2", "--log-verbosity", "0"],
                   check=True, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    print("\n== llama-cli ==", flush=True)
    subprocess.run([str(tool_path("llama-cli")), "-m", str(model), "-p", "Name three primary colours.", "-n", "48",
                    "--temp", "0", "--single-turn", "--simple-io", "-t", "2", "--chat-template", "gemma"],
                   check=True, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
