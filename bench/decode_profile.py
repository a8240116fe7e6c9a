#!/usr/bin/env python3
"""A steady decode loop on real text to put under a profiler (``perf record``).

Prefills a real model with the Python documentation (as ``real_text_speed.py``), keeps the state
in ``--state-dir`` for the next run, then decodes ``--steps`` greedy tokens from it, SparQ's
defaults or dense, and prints tokens/s and the fork's counters. The prefill is skipped when the
state is kept, so a profiler started with a delay sees only decode steps:

    python bench/decode_profile.py --model smollm2 --tokens 8000 --steps 1      # prefill once
    perf record -D 2500 -F 2000 -g -o sparq.data \\
        python bench/decode_profile.py --model smollm2 --tokens 8000 --steps 400
    perf report -i sparq.data --no-children --sort pid,symbol -g none

It writes no result file: a profile is read, and what it finds is written up by hand
(``results/profile_smollm2_8k.md``); speed is measured by ``real_text_speed.py``.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_text_speed import python_docs  # noqa: E402

from llama_sparq import Llama  # noqa: E402
from llama_sparq.models import resolve_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a GGUF path (default smollm2)")
    ap.add_argument("--tokens", type=int, default=8000, help="prompt tokens of the Python documentation")
    ap.add_argument("--steps", type=int, default=300, help="decode steps timed (default 300)")
    ap.add_argument("--mode", choices=("sparq", "dense"), default="sparq")
    ap.add_argument("--flash-attn", type=int, choices=(0, 1), default=1,
                    help="dense only: upstream's flash attention (1, the layout SparQ uses) or its other path (0)")
    ap.add_argument("--cache-type", choices=("f16", "q8_0"), default="f16", help="K and V cache type")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/llama_sparq_profile"),
                    help="where the prefilled state is kept between runs")
    args = ap.parse_args(argv)
    if args.tokens < 16 or args.steps < 1:
        ap.error("--tokens must be >= 16 and --steps >= 1")
    if args.mode == "sparq" and args.flash_attn == 0:
        ap.error("--flash-attn 0 is a dense path: SparQ runs on flash attention's cache layout")

    from llama_sparq.cost import cache_type_id

    model = resolve_model(args.model)
    fa = bool(args.flash_attn)
    ti = cache_type_id(args.cache_type)
    llm = Llama(str(model), n_ctx=args.tokens + args.steps + 64, n_batch=512, n_threads=args.threads,
                verbose=False, flash_attn=fa, type_k=ti, type_v=ti, **({"sparq": True} if fa else {}))
    toks = llm.tokenize(python_docs().encode())[:args.tokens]
    args.state_dir.mkdir(parents=True, exist_ok=True)
    # one state per cache layout: -fa 0 keeps V transposed
    state_path = args.state_dir / f"{Path(model).stem}_{args.tokens}_{args.cache_type}_fa{args.flash_attn}.pkl"
    if state_path.exists():
        state = pickle.loads(state_path.read_bytes())
    else:
        if fa:
            llm.set_sparq(sparq=False)
        t = time.perf_counter()
        llm.eval(toks[:-1])
        print(f"prefill of {len(toks) - 1} tokens: {time.perf_counter() - t:.1f} s", flush=True)
        state = llm.save_state()
        state_path.write_bytes(pickle.dumps(state))
    llm.load_state(state)
    if fa:
        llm.set_sparq(sparq=args.mode == "sparq")
    llm.reset_sparq_stats()
    n_vocab = llm.n_vocab()
    tok = toks[-1]
    t = time.perf_counter()
    for _ in range(args.steps):
        llm.eval([tok])
        tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
    dt = time.perf_counter() - t
    s = llm.sparq_stats()
    label = "sparq" if args.mode == "sparq" else f"dense_{args.cache_type}_fa{args.flash_attn}"
    print(f"{label}: {args.steps / dt:.2f} tokens/s over {args.steps} steps; SparQ calls {s['n_sparq']}, "
          f"dense calls {s['n_dense']}, compression {s['compression']:.4f}")
    if args.mode == "sparq" and s["n_sparq"] == 0:
        print("error: no SparQ call ran", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
