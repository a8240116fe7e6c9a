"""Research helpers of llama-sparq, kept out of the wheel: the NumPy reference of the op
(``reference``), the cost model of docs/algorithm.md (``cost``), the capture of SparQ calls'
tensors from a running graph (``capture``) and the synthetic GGUF models (``models``).

The tests (tests/conftest.py) and the benchmarks (bench/benchlib.py) put ``dev/`` on
``sys.path``. These modules import ``llama_sparq``; nothing in ``llama_sparq`` imports them.
"""
