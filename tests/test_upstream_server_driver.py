"""bench/upstream_server_tests.py's parsing and classification (the run itself, llama.cpp's
server tests against the fork's server, takes half an hour and is not part of the suite)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import upstream_server_plugin as plugin  # noqa: E402
import upstream_server_tests as ust  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="unit.test_basic" name="test_ok" time="0.5"/>
<testcase classname="unit.test_basic" name="test_split[a]" time="0.1"><skipped type="pytest.skip"
 message="needs model a GGUF split in 3 files (stories15M): ggml-org/models/x.gguf, not available offline"/></testcase>
<testcase classname="unit.test_chat" name="test_regex" time="1.0"><failure message="AssertionError: assert False
 + where False = match_regex('(Suddenly)+', 'Hello')">trace</failure></testcase>
<testcase classname="unit.test_chat" name="test_boom" time="1.0"><error message="failed on setup">x</error></testcase>
</testsuite></testsuites>"""


def test_junit_cases(tmp_path):
    p = tmp_path / "j.xml"
    p.write_text(JUNIT)
    cases = ust.junit_cases(p)
    assert cases["unit/test_basic.py::test_ok"]["outcome"] == "passed"
    assert cases["unit/test_basic.py::test_split[a]"]["outcome"] == "skipped"
    assert cases["unit/test_chat.py::test_regex"]["outcome"] == "failed"
    assert cases["unit/test_chat.py::test_boom"]["outcome"] == "error"
    assert "match_regex" in cases["unit/test_chat.py::test_regex"]["message"]


def case(outcome, message=""):
    return {"outcome": outcome, "message": message, "time": 0.0}


def test_classify():
    c = ust.classify
    assert c("t", case("passed"), case("passed"))["category"] == "passes"
    # a SparQ-only failure is named as such, whatever the reason table says
    r = c("unit/test_basic.py::test_no_ui", case("passed"), case("failed", "assert 1 == 2\nmore"))
    assert r["category"].startswith("SPARQ ONLY") and r["reason"] == "not investigated: assert 1 == 2"
    r = c("unit/test_completion.py::test_completion_unified[256-4-a-b]", case("passed"), case("error", "died"))
    assert r["category"].startswith("SPARQ ONLY") and r["reason"] == ust.KV_UNIFIED
    r = c("t", case("skipped", "needs model a reranker: x/y, not available offline"), case("skipped", "same"))
    assert r["category"] == "needs a model not available offline" and r["reason"] == "model a reranker: x/y"
    r = c("t", case("skipped", "needs file https://h/f.gguf, not available offline"), None)
    assert r["category"] == "needs a download (no network)" and r["sparq"] == "not run"
    r = c("unit/test_x.py::t", case("failed", "assert match_regex('(a)+', 'b')"), case("failed", "same"))
    assert r["category"] == ust.STORIES
    # the reason table's entries win over the heuristics
    for pat, cat, _ in ust.REASONS:
        assert cat
    r = c("unit/test_x.py::t", case("failed", "odd"), case("error", "odd"))
    assert r["category"] == "unclassified" and r["reason"] == "odd"


def test_mirror_links_all_but_the_tests(tmp_path):
    tree = tmp_path / "up"
    (tree / "models" / "templates").mkdir(parents=True)
    (tree / "tools" / "mtmd").mkdir(parents=True)
    tests = tree / "tools" / "server" / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "tmp").mkdir()
    (tests / "tmp" / "old.gguf").write_text("")
    (tests / "utils.py").write_text("x = 1\n")
    (tree / "tools" / "server" / "server.cpp").write_text("")
    (tree / ".gitignore").write_text("build/\n")
    out = ust.mirror(tree, tmp_path / "m")
    assert out == tmp_path / "m" / "tools" / "server" / "tests"
    assert (out / "utils.py").is_file() and not (out / "utils.py").is_symlink()
    assert (tmp_path / "m" / "models").is_symlink() and (tmp_path / "m" / "tools" / "mtmd").is_symlink()
    assert (tmp_path / "m" / "tools" / "server" / "server.cpp").is_symlink()
    assert (tmp_path / "m" / ".git").is_dir() and not (tmp_path / "m" / ".gitignore").is_symlink()
    assert (out / "tmp").is_dir() and not any((out / "tmp").iterdir())
    # the tests' relative paths reach the pinned tree's files
    assert (out / "../../../models/templates").resolve() == (tree / "models" / "templates").resolve()


def test_plugin_names_the_missing_models():
    assert plugin._kind("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf").startswith("an embedding model")
    assert plugin._kind("ggml-org/tinygemma3-GGUF:Q8_0", None).startswith("a vision model")
    assert plugin._kind("someone/Other-GGUF", None) == "someone/Other-GGUF"
    assert ("ggml-org/test-model-stories260K", None) in plugin.LOCAL_MODELS
