"""The docs against the tree, without a build: the architecture page's file table lists every
file of ggml-sparq/ and nothing else; repository paths named in code comments exist; no code
comment cites an issue number; the README stays short and keeps the test command CI runs;
every file in bench/results/ is cited by a doc and every result a doc cites exists; links
between the docs resolve; every environment switch the C code reads is documented; the README's
table of settings is the one scripts/settings_table.py renders from the settings' table."""

from __future__ import annotations

import ast
import difflib
import io
import itertools
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_BYTES = 20000
TEST_COMMAND = "make test"  # .ci/run runs it; the README must keep it

# the docs that may cite results and link to each other
DOCS = ["README.md", "CHANGELOG.md", "bench/README.md", "models/README.md", "patches/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
# the code whose comments are checked
CODE_DIRS = ["ggml-sparq", "py", "dev", "bindings", "bench", "tests", "scripts"]
C_SUFFIXES = {".c", ".cpp", ".h", ".cu", ".cuh", ".in"}
HASH_COMMENT_NAMES = {"CMakeLists.txt", "Makefile"}


def tracked(under: str) -> list[Path]:
    """Files under a folder of the repository: git's tracked and untracked-but-not-ignored files
    (so a new file counts before it is added, and build outputs do not), else a plain walk."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", under],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in (ROOT / under).rglob("*") if "__pycache__" not in p.parts]
    return sorted(p for p in files if p.is_file())


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# ---------------------------------------------------------------- comments of the code

def c_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every // and /* */ comment of C, C++ or CUDA source, string and character
    literals skipped."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j == -1 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j == -1 else j
            out.append((line, text[i + 2:j]))
            line += text.count("\n", i, j)
            i = j + 2
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def py_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every # comment and every docstring of Python source."""
    out = [(tok.start[0], tok.string[1:]) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def hash_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of # comments of shell, CMake and make files (a # at a line's start or after
    a blank, as those files write them)."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(?:^|\s)#(?![!{])(.*)", line)
        if m:
            out.append((no, m.group(1)))
    return out


def code_comments() -> list[tuple[str, int, str]]:
    """(file, line, text) of every comment and docstring in the code folders (results excluded)."""
    out = []
    for d in CODE_DIRS:
        for p in tracked(d):
            if p.is_relative_to(ROOT / "bench" / "results"):
                continue
            text = p.read_text(errors="replace")
            if p.suffix == ".py":
                found = py_comments(text)
            elif p.suffix in C_SUFFIXES:
                found = c_comments(text)
            elif p.suffix == ".sh" or p.name in HASH_COMMENT_NAMES:
                found = hash_comments(text)
            else:
                continue
            out += [(rel(p), no, c) for no, c in found]
    return out


def test_comment_extractors_find_what_they_should():
    """The extractors themselves: a path in a string literal is no comment, one in a comment is."""
    src = 'const char * s = "// not a comment"; // a comment\n/* two\nlines */ int x; char c = \'"\';\n'
    assert [c for _, c in c_comments(src)] == [" a comment", " two\nlines "]
    py = '"""Doc."""\nx = "# no"  # yes\ndef f():\n    """F doc."""\n'
    assert sorted(c for _, c in py_comments(py)) == [" yes", "Doc.", "F doc."]
    assert [c for _, c in hash_comments('echo "$#" # note\n#!/bin/sh\n')] == [" note"]


# ---------------------------------------------------------------- (a) the architecture page's file table

def architecture_table_paths() -> list[str]:
    """The ggml-sparq/ paths the file table of docs/architecture.md lists (between its
    layout-table markers; each row's first cell names one or more files relative to ggml-sparq/,
    bold rows name a folder)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"<!-- layout-table: begin -->(.*?)<!-- layout-table: end -->", text, re.S)
    assert m, "docs/architecture.md has no <!-- layout-table: begin/end --> markers around the file table"
    paths = []
    for row in m.group(1).splitlines():
        cells = row.split("|")
        if len(cells) < 3 or cells[1].strip().startswith("**") or set(cells[1].strip()) <= set("- "):
            continue
        paths += ["ggml-sparq/" + p for p in re.findall(r"`([^`]+)`", cells[1])]
    return paths


def test_architecture_table_lists_every_file_of_ggml_sparq():
    listed = architecture_table_paths()
    assert listed, "the file table of docs/architecture.md lists no file"
    files = {rel(p) for p in tracked("ggml-sparq")}
    missing = sorted(files - set(listed))
    stale = sorted(set(listed) - files)
    assert not missing, f"docs/architecture.md's file table does not list: {missing} (add a row saying what each owns)"
    assert not stale, f"docs/architecture.md's file table lists files that do not exist: {stale}"


# ---------------------------------------------------------------- (b) repository paths in comments

# a path of this repository: one of its top folders, then a name; not preceded by a path character
# (tools/llama-bench/llama-bench.cpp is no bench/ path)
REPO_PATH = re.compile(r"(?<![\w./-])((?:ggml-sparq|py|dev|bindings|bench|tests|scripts|docs|patches|models)"
                       r"/[\w./*{},-]*[\w*}])")
# a path written after these names upstream's tree, not this repository's
UPSTREAM_PREFIX = re.compile(r"(?:upstream's|llama\.cpp's)\s+$")


def expand_braces(pattern: str) -> list[str]:
    """a/{b,c}.d -> [a/b.d, a/c.d] (one level per brace pair, as the docs write them)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return list(itertools.chain.from_iterable(
        expand_braces(pattern[:m.start()] + alt + pattern[m.end():]) for alt in m.group(1).split(",")))


def path_exists(path: str) -> bool:
    """The path names a file or folder, a glob that matches one, or a stem (a result tag, an
    output path without its extension) some file extends."""
    for p in expand_braces(path.rstrip(".,")):
        if any(ch in p for ch in "*?["):
            if any(ROOT.glob(p)):
                return True
        elif (ROOT / p).exists() or any(ROOT.glob(p + ".*")):
            return True
    return False


def test_paths_in_comments_exist():
    bad = []
    for f, no, text in code_comments():
        for m in REPO_PATH.finditer(text):
            if UPSTREAM_PREFIX.search(text[:m.start()]):
                continue
            path = m.group(1)
            if text[m.end():m.end() + 1] == "<":
                path += "*"  # a placeholder follows (bench/results/gpu_<tag>.json): any name there
            if not path_exists(path):
                bad.append(f"{f}:{no}: {path}")
    assert not bad, "comments name repository paths that do not exist (moved or renamed?):\n" + "\n".join(bad)


# ---------------------------------------------------------------- (c) no issue numbers in code comments

ISSUE_REF = re.compile(r"\b(?:[Ii]ssue|[Bb]ug|PR|[Pp]ull request)s?\s*#?\d+|\b[Ii]tem\s+\d+\b|(?<![\w&#])#\d+\b")


def test_no_issue_numbers_in_code_comments():
    """A reader of the code has no tracker at hand: a comment says why, not which ticket."""
    bad = [f"{f}:{no}: {m.group(0)!r} in {text.strip()[:100]!r}"
           for f, no, text in code_comments() for m in ISSUE_REF.finditer(text)]
    assert not bad, "comments cite issue numbers (say the reason instead):\n" + "\n".join(bad)


# ---------------------------------------------------------------- (d) the README

def test_readme_is_short_and_keeps_the_test_command():
    readme = ROOT / "README.md"
    size = readme.stat().st_size
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to "
                                      "docs/ or bench/README.md")
    assert TEST_COMMAND in readme.read_text(), f"README.md lost the test command {TEST_COMMAND!r} (.ci/run runs it)"


# ---------------------------------------------------------------- (e) bench/results and the docs that cite them

RESULTS = "bench/results"


def result_citations() -> list[tuple[str, str]]:
    """(doc, pattern) for every result a doc names: bench/results/<name> anywhere, results/<name>
    in bench/README.md (relative to it); the name may be a glob (op_bench.*, gpu_*.{json,md}) or
    a stem."""
    out = []
    for doc in DOCS:
        path = ROOT / doc
        if not path.exists():
            continue
        prefix = r"(?:bench/)?" if doc == "bench/README.md" else r"bench/"
        for m in re.finditer(r"(?<![\w./-])" + prefix + r"results/([\w.*{},-]*[\w*}])", path.read_text()):
            out.append((doc, f"{RESULTS}/{m.group(1)}"))
    return out


def cited_files(pattern: str) -> set[str]:
    found = set()
    for p in expand_braces(pattern):
        for q in itertools.chain(ROOT.glob(p), ROOT.glob(p + ".*")):
            if q.is_file():
                found.add(rel(q))
    return found


def test_every_result_file_is_cited_and_every_citation_exists():
    cites = result_citations()
    assert cites, "no doc cites a file of bench/results"
    dangling = sorted({f"{doc}: {pat}" for doc, pat in cites if not cited_files(pat)})
    assert not dangling, "docs cite results that do not exist:\n" + "\n".join(dangling)
    cited = set().union(*(cited_files(pat) for _, pat in cites))
    uncited = sorted({rel(p) for p in tracked(RESULTS)} - cited)
    assert not uncited, ("files in bench/results that no doc cites (cite them where their figures are quoted, "
                         "or git rm them):\n" + "\n".join(uncited))


# ---------------------------------------------------------------- links between the docs

def heading_anchors(md: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces to
    hyphens, a -1, -2 suffix for repeats."""
    seen, out = {}, set()
    in_code = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_links_between_docs_resolve(doc):
    path = ROOT / doc
    if not path.exists():
        pytest.skip(f"{doc} does not exist")
    bad = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", path.read_text()):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {rel(dest)}")
    assert not bad, f"{doc} links to what does not exist:\n" + "\n".join(bad)


# ---------------------------------------------------------------- the environment switches

def test_every_environment_switch_of_the_c_code_is_documented():
    """docs/development.md's table of environment variables names every variable the C code
    reads (a switch nobody can find is a switch nobody can turn off)."""
    names = set()
    for p in tracked("ggml-sparq"):
        if p.suffix in C_SUFFIXES:
            names |= set(re.findall(r'getenv\("([A-Z0-9_]+)"\)', p.read_text(errors="replace")))
            names |= set(re.findall(r'sparq_env_(?:flag|way)\("([A-Z0-9_]+)"', p.read_text(errors="replace")))
    assert names, "no getenv found in ggml-sparq/: has the reading moved?"
    dev = (ROOT / "docs" / "development.md").read_text()
    undocumented = sorted(n for n in names if f"`{n}`" not in dev)
    assert not undocumented, f"environment variables read by ggml-sparq/ but missing from docs/development.md: {undocumented}"


# ---------------------------------------------------------------- the settings' table

def settings_rows() -> tuple:
    """The rows of ggml-sparq/include/llama-sparq-settings.def, read by bindings/settings.py from
    the source tree (pure Python: no build, no cffi)."""
    import importlib
    import importlib.util
    import sys

    name = "_sparq_bindings_src"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bindings" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "bindings")])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    settings = importlib.import_module(name + ".settings")
    return settings.table(ROOT / "ggml-sparq" / "include" / "llama-sparq-settings.def")


def test_every_setting_has_a_row_in_the_docs_settings_table():
    """docs/algorithm.md's "Settings" table has a row per setting of the table (a new setting is
    documented where the others are), and no row for a setting that is gone."""
    text = (ROOT / "docs" / "algorithm.md").read_text()
    m = re.search(r"\n## Settings\n.*?\n(\| field \|.*?)\n\n", text, re.S)
    assert m, "docs/algorithm.md has no Settings section with a `| field | ...` table"
    documented = re.findall(r"^\| `(\w+)` \|", m.group(1), re.M)
    names = [r.name for r in settings_rows()]
    assert sorted(documented) == sorted(names), (
        f"docs/algorithm.md's Settings table lists {sorted(documented)}; the settings' table "
        f"(ggml-sparq/include/llama-sparq-settings.def) has {sorted(names)}")


# ---------------------------------------------------------------- the README's settings table

def settings_table_script():
    """scripts/settings_table.py, imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_settings_table", ROOT / "scripts" / "settings_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_settings_table_is_the_one_the_def_yields():
    """README.md's table of settings, between its markers, is what scripts/settings_table.py
    renders from llama-sparq-settings.def (run the script to rewrite it)."""
    st = settings_table_script()
    text = (ROOT / "README.md").read_text()
    b, e = st.readme_table(text)
    want = st.render()
    assert text[b:e] == want, ("README.md's settings table differs from llama-sparq-settings.def: run "
                               "python scripts/settings_table.py\n" + "".join(difflib.unified_diff(
                                   text[b:e].splitlines(True), want.splitlines(True), "README.md", "rendered")))
    assert want.count("\n") == len(settings_rows()) + 2, "the table has not one row per setting"


def test_readme_settings_table_check_fails_on_a_changed_def(tmp_path):
    """The check above can fail: a copy of the .def with another default renders another table;
    a new row without a label, or a conditional default whose C expression changed, stops the
    script naming what to edit."""
    st = settings_table_script()
    text = st.DEF.read_text()
    readme = (ROOT / "README.md").read_text()
    b, e = st.readme_table(readme)

    changed = tmp_path / "changed.def"
    assert "0.95f, SPARQ_SHARE" in text
    changed.write_text(text.replace("0.95f, SPARQ_SHARE", "0.9f, SPARQ_SHARE"))
    other = st.render(changed)
    assert other != readme[b:e] and "| 0.9 |" in other

    new_row = tmp_path / "new_row.def"
    new_row.write_text(text.replace("\n#undef LLAMA_SPARQ_SETTING\n", '\nLLAMA_SPARQ_SETTING(int32_t, demo_budget, 7, '
                                    'SPARQ_INTS(1, 100), SPARQ_NONE, "a demo", SPARQ_IN_ALL)\n'
                                    "\n#undef LLAMA_SPARQ_SETTING\n"))
    with pytest.raises(st.TableError, match="demo_budget"):
        st.render(new_row)

    expr = '"5/16 of the head size (rounded)" : "head size / 4"'
    assert expr in text
    conditional = tmp_path / "conditional.def"
    conditional.write_text(text.replace(expr, '"a quarter of the head size" : "head size / 4"'))
    with pytest.raises(st.TableError, match="CONDITIONAL"):
        st.render(conditional)


def test_serving_flag_table_lists_every_flag_and_its_environment_variable():
    """docs/serving.md's table of the common flags has a row per setting the flags show, naming
    its flag and its environment variable (spelled as bindings/settings.py derives them)."""
    text = (ROOT / "docs" / "serving.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `--sparq")]
    assert rows, "docs/serving.md has no table of --sparq flags"
    missing = [f"{r.flag} ({r.env})" for r in settings_rows() if "flags" in r.shown
               and not any(f"`{r.flag}" in line.split("|")[1] and f"`{r.env}`" in line for line in rows)]
    assert not missing, f"docs/serving.md's flag table lacks rows (or their environment variables) for: {missing}"
