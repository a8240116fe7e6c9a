"""docs/coverage.md, the coverage table of the pinned llama.cpp's architectures: the committed file is the
one scripts/coverage_table.py generates from the prepared upstream tree and ggml-sparq/; the refusals it
applies are read from sparq_attn_variant (a refusal added to the C++ list changes its rows; a
condition the script does not know stops it); and every row that names a tiny GGUF (PROOFS in
dev/sparq_lab/arch_models.py) holds on that model: it loads, and with SparQ asked for either decode runs
SparQ on every full-attention layer (the sliding-window ones dense, counted `swa`) or SparQ is refused
naming the row's cause."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from sparq_ctx import Ctx, Model, llama_cpp, prefill, rand_tokens

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "coverage.md"
# the fork's files the script reads (the upstream tree is read where the build prepared it)
FORK_INPUTS = ["ggml-sparq/llama/llama-sparq-buffers.cpp", "ggml-sparq/op/ggml-sparq.c",
               "dev/sparq_lab/arch_models.py", "upstream.pin", "scripts/upstream.py"]
SPARQ = dict(enabled=True, r=4, k=8, l=4, min_kv=0, all_rows=False)
N_PROMPT, N_STEPS = 40, 3


@pytest.fixture(scope="module")
def ct():
    spec = importlib.util.spec_from_file_location("coverage_table", REPO / "scripts" / "coverage_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["coverage_table"] = mod  # (dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def up(ct):
    return ct.upstream_tree(REPO)


@pytest.fixture(scope="module")
def result(ct, up):
    return ct.analyse(REPO, up)


def _fork_copy(tmp_path: Path) -> Path:
    for rel in FORK_INPUTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    return tmp_path


# -- the table against the source ---------------------------------------------------------------

def test_committed_table_is_the_generated_one(ct, result):
    assert TABLE.read_text() == ct.render(result), (
        "docs/coverage.md is stale: regenerate it with `.venv/bin/python scripts/coverage_table.py`")


def test_check_mode_fails_on_an_edited_table(ct, tmp_path):
    """`--check` passes on the committed table and fails on one with a row's outcome edited."""
    assert ct.main(["--check", "--out", str(TABLE)]) == 0
    edited = tmp_path / "coverage.md"
    text = TABLE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| llama |"))
    edited.write_text(text.replace(row, row.replace("| SparQ |", "| dense: attention sinks |")))
    assert edited.read_text() != text
    assert ct.main(["--check", "--out", str(edited)]) == 1


def test_the_summary_counts_every_row(result, ct):
    """The summary's counts add up to the rows, and every dense row has a cause."""
    rows = [a for a in result["archs"].values() if a.outcome]
    text = ct.render(result)
    n_sparq = sum(a.outcome == "sparq" for a in rows)
    assert f"{len(rows)} architectures attend over a KV cache: **{n_sparq} run SparQ**" in text
    assert all(a.cause for a in rows if a.outcome == "dense")
    counted = sum(int(m) for m in re.findall(r"^\| dense: [^|]+\| (\d+) \|", text, re.M))
    assert counted == len(rows) - n_sparq


def test_a_refusal_added_to_the_cpp_list_changes_its_rows(ct, up, result, tmp_path):
    """The table follows sparq_attn_variant: a refusal planted first in its list, of a condition the
    script knows (soft-capping), makes every SparQ row with that feature dense for the planted phrase
    (and no other row), and the table differs."""
    root = _fork_copy(tmp_path)
    src = root / "ggml-sparq/llama/llama-sparq-buffers.cpp"
    text = src.read_text()
    sig = re.search(r"const char \* sparq_attn_variant\([^)]*\) \{", text)
    assert sig, f"no sparq_attn_variant in {src.name}"
    src.write_text(text[:sig.end()] + '\n    if (hp.attn_soft_cap) {\n        return "a planted refusal";\n    }'
                   + text[sig.end():])
    after = ct.analyse(root, up)
    hit = {e for e, a in result["archs"].items() if a.outcome == "sparq" and "soft_cap" in a.features}
    assert hit
    for e, a in result["archs"].items():
        b = after["archs"][e]
        assert ((b.outcome, b.cause) == ("dense", "a planted refusal")) == (e in hit), (e, b.outcome, b.cause)
        if e not in hit:
            assert (b.outcome, b.cause) == (a.outcome, a.cause), e
    assert ct.render(after) != ct.render(result)


@pytest.mark.parametrize("planted,message", [
    ('if (hp.n_swa > 7) {\n        return "a planted refusal";\n    }', r"hp\.n_swa > 7.*CONDITIONS"),
    ('const bool odd = hp.n_swa > 7;', r"statements this script cannot read.*const bool odd"),
    ('if (hp.n_swa > 7) {\n        return variant_name(hp);\n    }', r"does not return a phrase"),
])
def test_a_refusal_the_script_cannot_read_stops_it(ct, up, tmp_path, planted, message):
    """A condition it does not know, a statement it does not read, a refusal without its phrase: each
    stops the script with a message, rather than a table that leaves the refusal out."""
    root = _fork_copy(tmp_path)
    src = root / "ggml-sparq/llama/llama-sparq-buffers.cpp"
    text = src.read_text()
    sig = re.search(r"const char \* sparq_attn_variant\([^)]*\) \{", text)
    src.write_text(text[:sig.end()] + "\n    " + planted + text[sig.end():])
    with pytest.raises(ct.SourceError, match=message):
        ct.analyse(root, up)


def test_cache_types_are_read_from_the_op(ct, tmp_path):
    root = _fork_copy(tmp_path)
    src = root / "ggml-sparq/op/ggml-sparq.c"
    src.write_text(src.read_text().replace("case GGML_TYPE_IQ4_NL:", "case GGML_TYPE_IQ4_NL: case GGML_TYPE_BF16:", 1))
    assert "BF16" in ct.cache_types(root) and "BF16" not in ct.cache_types(REPO)
    assert "Q4_0" in ct.cache_types(REPO)


def test_a_proof_of_no_architecture_is_refused(ct, up, tmp_path):
    root = _fork_copy(tmp_path)
    src = root / "dev/sparq_lab/arch_models.py"
    src.write_text(src.read_text().replace('PROOFS = {\n', 'PROOFS = {\n    "no-such-arch": make_tiny_llama,\n', 1))
    with pytest.raises(ct.SourceError, match="no-such-arch"):
        ct.analyse(root, up)


# -- the rows against the tiny GGUFs ------------------------------------------------------------

def attention_layers(path: Path) -> tuple[int, int | None]:
    """(layers with KV heads, of them the full-attention ones) of a tiny GGUF, from its own keys; the
    second is None where the GGUF has a sliding window but no pattern (the loader's default decides)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def values(key):
        f = r.fields.get(f"{arch}.{key}")
        return None if f is None else [f.parts[i].tolist()[0] for i in f.data]

    n_layer = values("block_count")[0]
    hkv = values("attention.head_count_kv")
    hkv = hkv * n_layer if len(hkv) == 1 else hkv
    kv = [i for i in range(n_layer) if hkv[i] > 0]
    pattern = values("attention.sliding_window_pattern")
    if pattern is None:
        return len(kv), (len(kv) if values("attention.sliding_window") is None else None)
    return len(kv), sum(not pattern[i] for i in kv)


def check_proof(path: Path, arch: str, outcome: str, cause: str) -> None:
    """The tiny GGUF at path is of architecture arch and decodes as its row says: SparQ on every
    full-attention layer (the sliding-window ones counted `swa`) at each decode step, or SparQ
    refused with the row's cause (the model still decodes dense)."""
    m = Model(path)
    got = m.llm.metadata.get("general.architecture")
    assert got == arch, f"{path.name} is a {got} GGUF, not {arch}"
    rng = np.random.default_rng(3)
    c = Ctx(m, n_ctx=256)
    try:
        try:
            c.sparq(**SPARQ)
            refused = None
        except RuntimeError as e:
            refused = str(e)
        if llama_cpp().llama_model_has_encoder(m.model):
            assert c.encode(rand_tokens(rng, 16, m.n_vocab)) == 0  # (T5: the decoder reads the encoder's output)
        prefill(c, 0, rand_tokens(rng, N_PROMPT, m.n_vocab))
        st0 = c.stats() if refused is None else None
        for _ in range(N_STEPS):
            rc, _ = c.decode([(int(rng.integers(3, m.n_vocab)), c.pos_max(0) + 1, 0)])
            assert rc == 0
        if outcome == "sparq":
            assert refused is None, f"{arch}: the row says SparQ, SparQ was refused: {refused}"
            st = c.stats()
            n_kv, n_full = attention_layers(path)
            if n_full is None:  # the loader's default pattern: the split is the counters', the sum is checked
                n_full = st["n_layers"]
            assert 0 < n_full == st["n_layers"] <= n_kv, (arch, n_kv, n_full, st)
            n_swa = n_kv - n_full
            assert st["n_sparq"] - st0["n_sparq"] == N_STEPS * n_full, (arch, st)
            assert st["n_dense"]["swa"] - st0["n_dense"]["swa"] == N_STEPS * n_swa, (arch, st)
            assert sum(st["n_dense"].values()) - sum(st0["n_dense"].values()) == N_STEPS * n_swa, (arch, st)
        elif refused is not None:
            assert "no KV-cache layer of this context can run SparQ" in refused or "no attention KV cache" in refused
            assert cause.startswith("a memory SparQ finds no KV cache") or f"attn_variant: {cause}" in refused, (
                f"{arch}: refused, but not for the row's cause {cause!r}: {refused}")
        else:
            st = c.stats()
            assert st["n_sparq"] == 0 and st["n_dense"]["attn_variant"] > 0, (
                f"{arch}: the row says dense ({cause}), the counters say {st}")
    finally:
        c.free()


def _proofs():
    sys.path.insert(0, str(REPO / "dev"))
    from sparq_lab.arch_models import PROOFS

    return PROOFS


@pytest.mark.parametrize("arch", sorted(_proofs()))
def test_each_proof_decodes_as_its_row_says(arch, result, tmp_path):
    a = next(a for a in result["archs"].values() if a.name == arch)
    assert a.outcome and a.proof == _proofs()[arch].__name__
    path = _proofs()[arch](tmp_path / f"tiny-{arch}.gguf")
    check_proof(path, arch, a.outcome, a.cause)


def test_the_proof_check_fails_on_a_wrong_row(tmp_path):
    """check_proof is not a rubber stamp: a SparQ model checked as dense (a plain one, MLA), and a
    refused one (a soft-cap SparQ refuses) checked as SparQ or with another cause, fail."""
    from sparq_lab.models import make_tiny_gemma2

    proofs = _proofs()
    llama = proofs["llama"](tmp_path / "llama.gguf")
    with pytest.raises(AssertionError):
        check_proof(llama, "llama", "dense", "attention sinks")
    mla = proofs["deepseek2"](tmp_path / "deepseek2.gguf")
    with pytest.raises(AssertionError):
        check_proof(mla, "deepseek2", "dense", "attention sinks")
    bad_cap = make_tiny_gemma2(tmp_path / "gemma2-bad-cap.gguf", softcap=-1.0)
    cause = "attention logit soft-capping by a value that is not finite and > 0"
    check_proof(bad_cap, "gemma2", "dense", cause)
    with pytest.raises(AssertionError):
        check_proof(bad_cap, "gemma2", "sparq", "")
    with pytest.raises(AssertionError):
        check_proof(bad_cap, "gemma2", "dense", "attention sinks")
    with pytest.raises(AssertionError):
        check_proof(llama, "deepseek2", "sparq", "")
