"""The foundation: the fork's library and version check, the Python Llama, the CLI
programs, bad input, and the patch applier."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import llama_sparq
from llama_sparq import LibraryError, check_library, tool_path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "scripts" / "upstream.py"


def pin_commit() -> str:
    for line in (ROOT / "upstream.pin").read_text().splitlines():
        if line.startswith("llama_cpp_commit"):
            return line.split("=", 1)[1].strip()
    raise AssertionError("no commit in upstream.pin")


# ---------------------------------------------------------------------------
# version and ABI check
# ---------------------------------------------------------------------------

def test_library_version_matches_package_and_pin():
    v = check_library()
    assert v == f"llama-sparq {llama_sparq.__version__} abi {llama_sparq.ABI_VERSION} llama.cpp {pin_commit()}"


def test_system_info_reports_the_fork():
    # patch 0001 makes llama_print_system_info() report the fork
    import ctypes

    lib = ctypes.CDLL(str(llama_sparq.lib_dir() / "libllama.so"))
    lib.llama_print_system_info.restype = ctypes.c_char_p
    assert f"SPARQ = llama-sparq {llama_sparq.__version__}" in lib.llama_print_system_info().decode()


def _fake_lib(tmp_path: Path, body: str) -> Path:
    src = tmp_path / "fake.c"
    src.write_text(body)
    out = tmp_path / "libllama.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


def test_mismatched_abi_is_refused(tmp_path):
    lib = _fake_lib(tmp_path, 'const char * llama_sparq_version(void) { return "llama-sparq 9.9.9 abi 999 llama.cpp abc"; }\n')
    with pytest.raises(LibraryError) as e:
        check_library(lib)
    msg = str(e.value)
    assert "ABI 999" in msg and f"ABI {llama_sparq.ABI_VERSION}" in msg and "make install" in msg and str(lib) in msg


def test_upstream_library_without_the_fork_is_refused(tmp_path):
    lib = _fake_lib(tmp_path, "int llama_backend_init(void) { return 0; }\n")
    with pytest.raises(LibraryError, match="not the llama-sparq fork"):
        check_library(lib)


def test_missing_library_is_reported_at_import(tmp_path):
    env = dict(os.environ, LLAMA_SPARQ_LIB_DIR=str(tmp_path / "nowhere"))
    res = subprocess.run([sys.executable, "-c", "from llama_sparq import Llama"], env=env,
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "native library not found" in res.stderr and str(tmp_path / "nowhere") in res.stderr
    assert "make install" in res.stderr


def test_reference_needs_no_library(tmp_path):
    env = dict(os.environ, LLAMA_SPARQ_LIB_DIR=str(tmp_path / "nowhere"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "dev"), os.environ.get("PYTHONPATH")])))
    code = "from sparq_lab import reference, cost; print(cost.compression(4096, 128, 16, 128))"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------------
# Python Llama
# ---------------------------------------------------------------------------

def _greedy(model, prompt, n=16, **kw):
    from llama_sparq import Llama

    llm = Llama(str(model), n_ctx=512, n_threads=2, verbose=False, seed=0, **kw)
    out = llm(prompt, max_tokens=n, temperature=0.0)
    return llm, out


@pytest.mark.parametrize("which", ["tiny_model", "tiny_gqa_model"])
def test_python_llama_generates_from_tiny(request, which):
    model = request.getfixturevalue(which)
    llm, out = _greedy(model, "hello world", n=12)
    assert out["usage"]["completion_tokens"] >= 1
    assert isinstance(out["choices"][0]["text"], str)
    # greedy decoding is deterministic
    _, again = _greedy(model, "hello world", n=12)
    assert again["choices"][0]["text"] == out["choices"][0]["text"]
    assert llm.tokenize(b"hello")  # the llama-cpp-python API is there


def test_last_logits_are_the_last_tokens_row(tiny_model):
    """Llama.last_logits(): the last evaluated token's logits, with or without logits_all (equal to
    the row the scores keep with it), and the next eval's after it."""
    import numpy as np

    from llama_sparq import Llama

    toks = [5, 9, 17, 3, 11]
    rows = []
    for logits_all in (True, False):
        llm = Llama(str(tiny_model), n_ctx=64, n_threads=2, verbose=False, seed=0, logits_all=logits_all)
        llm.eval(toks)
        last = llm.last_logits()
        assert last.shape == (llm.n_vocab(),) and np.isfinite(last).all()
        if logits_all:
            assert np.array_equal(last, llm.scores[llm.n_tokens - 1])
        rows.append(last.copy())
        llm.eval([7])
        assert not np.array_equal(llm.last_logits(), rows[-1])
        llm.close()
    # (the output buffer's row count changes the matmul's blocking: equal to the rounding)
    assert np.abs(rows[0] - rows[1]).max() <= 1e-5 * np.abs(rows[0]).max()


@pytest.mark.real_model
def test_python_llama_generates_from_gemma(gemma_model):
    llm, out = _greedy(gemma_model, "The three primary colours are", n=16)
    text = out["choices"][0]["text"]
    assert "red" in text.lower(), text
    chunks = list(llm("The three primary colours are", max_tokens=8, temperature=0.0, stream=True))
    assert len(chunks) >= 2 and all("choices" in c for c in chunks)


def test_python_llama_missing_model(tmp_path):
    from llama_sparq import Llama

    path = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match=str(path)):
        Llama(str(path))


def test_python_llama_not_a_gguf(tmp_path):
    from llama_sparq import Llama

    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ValueError, match=str(path)):
        Llama(str(path), verbose=False)


def test_python_llama_truncated_gguf(tmp_path, tiny_model):
    from llama_sparq import Llama

    path = tmp_path / "truncated.gguf"
    path.write_bytes(Path(tiny_model).read_bytes()[:5000])
    with pytest.raises(ValueError, match=str(path)):
        Llama(str(path), verbose=False)


# ---------------------------------------------------------------------------
# the CLI programs
# ---------------------------------------------------------------------------

def _run(args, timeout=300):
    # random-weight models print arbitrary bytes
    return subprocess.run([str(a) for a in args], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_completion_generates_from_tiny(tiny_model):
    res = _run([tool_path("llama-completion"), "-m", tiny_model, "-p", "hello", "-n", "8", "--temp", "0",
                "--ignore-eos", "-no-cnv", "-t", "2"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith(" hello") and len(res.stdout) > len(" hello"), repr(res.stdout)


def test_cli_generates_from_tiny(tiny_model):
    res = _run([tool_path("llama-cli"), "-m", tiny_model, "-p", "hello", "-n", "8", "--temp", "0",
                "--single-turn", "--simple-io", "-t", "2"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "> hello" in res.stdout and "Generation:" in res.stdout, res.stdout[-1000:]


@pytest.mark.real_model
def test_completion_generates_from_gemma(gemma_model):
    res = _run([tool_path("llama-completion"), "-m", gemma_model, "-p", "The three primary colours are",
                "-n", "16", "--temp", "0", "-no-cnv", "-t", "2"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "red" in res.stdout.lower(), res.stdout


@pytest.mark.real_model
def test_cli_generates_from_gemma(gemma_model):
    res = _run([tool_path("llama-cli"), "-m", gemma_model, "-p", "Name three primary colours.", "-n", "24",
                "--temp", "0", "--single-turn", "--simple-io", "-t", "2", "--chat-template", "gemma"])
    assert res.returncode == 0, res.stderr[-2000:]
    reply = res.stdout.split("> Name three primary colours.", 1)[1].split("[ Prompt:", 1)[0]
    assert len(reply.strip()) > 0, res.stdout


@pytest.mark.parametrize("tool", ["llama-completion", "llama-cli"])
def test_cli_missing_model(tmp_path, tool):
    path = tmp_path / "nope.gguf"
    res = _run([tool_path(tool), "-m", path, "-p", "hi", "-n", "4", "-no-cnv" if tool == "llama-completion"
                else "--single-turn", "-t", "1"], timeout=60)
    assert res.returncode != 0
    assert str(path) in res.stderr + res.stdout


def test_cli_corrupt_model(tmp_path, tiny_model):
    path = tmp_path / "truncated.gguf"
    path.write_bytes(Path(tiny_model).read_bytes()[:5000])
    res = _run([tool_path("llama-completion"), "-m", path, "-p", "hi", "-n", "4", "-no-cnv", "-t", "1"], timeout=60)
    assert res.returncode != 0
    assert "failed to load model" in (res.stderr + res.stdout).lower()


def test_console_script_runs_the_fork():
    exe = Path(sys.executable).parent / "llama-sparq-bench"
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "usage" in (res.stdout + res.stderr).lower()


# ---------------------------------------------------------------------------
# the patch applier
# ---------------------------------------------------------------------------

def _git(tree, *args):
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


@pytest.fixture()
def fake_upstream(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("one\ntwo\nthree\n")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "pristine")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-two.patch").write_text(textwrap.dedent("""\
        --- a/a.txt
        +++ b/a.txt
        @@ -1,3 +1,3 @@
         one
        -two
        +TWO
         three
        """))
    return tree, patches


def _apply(tree, patches):
    return subprocess.run([sys.executable, str(UPSTREAM), "apply", str(tree), "--patches", str(patches)],
                          capture_output=True, text=True)


def test_patch_applier_applies_then_skips(fake_upstream):
    tree, patches = fake_upstream
    res = _apply(tree, patches)
    assert res.returncode == 0 and "applied 0001-two.patch" in res.stdout
    assert (tree / "a.txt").read_text() == "one\nTWO\nthree\n"
    res = _apply(tree, patches)
    assert res.returncode == 0 and "skipped 0001-two.patch" in res.stdout
    assert (tree / "a.txt").read_text() == "one\nTWO\nthree\n"


def test_patch_applier_reports_a_broken_patch(fake_upstream):
    tree, patches = fake_upstream
    (patches / "0002-broken.patch").write_text(textwrap.dedent("""\
        --- a/a.txt
        +++ b/a.txt
        @@ -1,3 +1,3 @@
         one
        -zwei
        +ZWEI
         three
        """))
    res = _apply(tree, patches)
    assert res.returncode == 1
    assert "0002-broken.patch does not apply" in res.stderr
    assert "llama-cpp-python==0.3.36" in res.stderr and "Regenerate it against the pin" in res.stderr


def test_patch_applier_plain_tree_without_git(fake_upstream):
    tree, patches = fake_upstream
    shutil.rmtree(tree / ".git")
    assert _apply(tree, patches).returncode == 0
    res = _apply(tree, patches)
    assert res.returncode == 0 and "skipped 0001-two.patch" in res.stdout


REPEATED = "int f() {\n    a();\n    b();\n}\n\nint g() {\n    a();\n    b();\n}\n"


@pytest.mark.parametrize("kind", ["git", "plain"])
def test_patch_applier_does_not_apply_a_patch_twice(tmp_path, kind):
    """An applied patch whose context repeats further down must be skipped, not applied
    again there (the forward check succeeds too)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f.c").write_text(REPEATED)
    if kind == "git":
        _git(tree, "init", "-q")
        _git(tree, "add", "-A")
        _git(tree, "commit", "-qm", "pristine")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-x.patch").write_text(textwrap.dedent("""\
        --- a/f.c
        +++ b/f.c
        @@ -1,4 +1,5 @@
         int f() {
             a();
        +    x();
             b();
         }
        """))
    res = _apply(tree, patches)
    assert res.returncode == 0 and "applied 0001-x.patch" in res.stdout, res.stderr
    once = (tree / "f.c").read_text()
    assert once.count("x();") == 1
    res = _apply(tree, patches)
    assert res.returncode == 0 and "skipped 0001-x.patch" in res.stdout, res.stderr
    assert (tree / "f.c").read_text() == once


def test_patch_applier_plain_tree_allows_no_fuzz(fake_upstream):
    """A patch whose context does not match exactly is refused, not applied with fuzz."""
    tree, patches = fake_upstream
    shutil.rmtree(tree / ".git")
    (tree / "a.txt").write_text("zero\none\ntwo\nthree!\nfour\n")
    (patches / "0001-two.patch").write_text(textwrap.dedent("""\
        --- a/a.txt
        +++ b/a.txt
        @@ -1,5 +1,5 @@
         zero
         one
        -two
        +TWO
         three
         four
        """))
    res = _apply(tree, patches)
    assert res.returncode == 1 and "0001-two.patch does not apply" in res.stderr
    assert (tree / "a.txt").read_text() == "zero\none\ntwo\nthree!\nfour\n"


def _series_files():
    files = set()
    for p in sorted((ROOT / "patches").glob("*.patch")):
        for line in p.read_text().splitlines():
            if line.startswith("+++ b/"):
                files.add(line[len("+++ b/"):])
    return sorted(files)


def test_real_series_on_plain_copies_of_the_pin(tmp_path):
    """The real series on trees without .git (the LLAMA_SPARQ_UPSTREAM_DIR path), made of
    the files it touches: a pristine copy is patched to the build tree's files, and a
    patched copy is left as it is (every patch skipped, none applied twice)."""
    res = subprocess.run([sys.executable, str(UPSTREAM), "prepare"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    build_tree = Path(res.stdout.strip())
    pristine, patched = tmp_path / "pristine", tmp_path / "patched"
    for rel in _series_files():
        for dst in (pristine, patched):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shown = subprocess.run(["git", "-C", str(build_tree), "show", f"HEAD:{rel}"], capture_output=True, check=True)
        (pristine / rel).write_bytes(shown.stdout)
        shutil.copyfile(build_tree / rel, patched / rel)
    n = len(list((ROOT / "patches").glob("*.patch")))
    res = _apply(pristine, ROOT / "patches")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("applied ") == n, res.stdout
    res = _apply(patched, ROOT / "patches")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("skipped ") == n, res.stdout
    for rel in _series_files():
        want = (build_tree / rel).read_bytes()
        assert (pristine / rel).read_bytes() == want, rel
        assert (patched / rel).read_bytes() == want, rel


def test_real_series_is_applied_to_the_build_tree():
    res = subprocess.run([sys.executable, str(UPSTREAM), "prepare"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    tree = Path(res.stdout.strip())
    for p in sorted((ROOT / "patches").glob("*.patch")):
        check = subprocess.run(["git", "-C", str(tree), "apply", "--check", "--reverse", str(p)],
                               capture_output=True, text=True)
        assert check.returncode == 0, f"{p.name} is not applied in {tree}: {check.stderr}"
