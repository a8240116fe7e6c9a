"""The docs against the tree, without a build: the architecture page's file table lists every
file of ggml-sparq/ and nothing else; repository paths named in code comments exist; no code
comment cites an issue number; the README keeps the test command CI runs; the docs stay under
their caps, with headings that name topics (not dates or runs), no result tables in the
reference docs, and, when long, an opening that says what they cover with a contents list;
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


# ---------------------------------------------------------------- (d) the docs' size and shape

# The docs the suite keeps short, with their caps in bytes: the README and docs/cuda.md 20000, every
# other page of docs/, bench/README.md and models/README.md 30000. CHANGELOG.md (history) and
# patches/README.md (one row per patch) are not capped.
SMALL_DOC_BYTES = {"README.md": 20000, "docs/cuda.md": 20000}
DOC_MAX_BYTES = 30000
CAPPED_DOCS = ["README.md", "bench/README.md", "models/README.md",
               *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
# the pages that say what the code does: their tables hold no figures (those are rows of
# bench/README.md, each with its command, commit, machine and result file)
REFERENCE_DOCS = ["docs/algorithm.md", "docs/architecture.md", "docs/serving.md", "docs/development.md",
                  "docs/cuda.md"]
# a doc over this many bytes opens with what it covers and a contents list
OPENING_FROM_BYTES = 10000
# the docs whose headings name topics; CHANGELOG.md's headings are its dates
SHAPED_DOCS = [d for d in DOCS if d != "CHANGELOG.md"]

MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
         r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
# A heading that dates itself or logs a run: a date (2026-11-28, 2026-11, Nov 28, 28 November), a
# numbered run ("Stop 52", "session 3", "round 2"), or words that only make sense on the day they
# were written (session, today, next, latest, plan, not yet, "run of ..."). A doc's headings name
# what it explains; when something happened belongs in CHANGELOG.md.
RUN_LOG_HEADING = re.compile(
    r"\b\d{4}-\d{2}(?:-\d{2})?\b"
    rf"|\b{MONTH}\.?\s+\d{{1,2}}\b|\b\d{{1,2}}\s+{MONTH}\b"
    r"|\b(?:stop|session|round|sprint|iteration|attempt|day|week|run|call)\s*#?\d+\b"
    r"|\b(?:sessions?|today'?s?|yesterday|tonight|this week|latest|next|upcoming|plans?|planned|todo|wip"
    r"|not yet|so far|run of)\b", re.I)
# words in a doc's text that go stale the day after they are written
STALE_WORDS = re.compile(r"\b(?:today'?s?|yesterday|uncommitted)\b", re.I)
# A cell that cites a measurement: a commit in backticks (7 to 40 hex digits, at least one digit
# and one letter), a bench/results/ file, a timing or rate (2.5 ms, 39 us, 61.97 t/s, 1.4 TB/s,
# 1452 s), or a speed-up (1.58x); or a header cell that names a unit of time or rate, or a
# speed-up, for the figures below it. Units are matched as written (S is a cell count, not s).
COMMIT_CELL = re.compile(r"`(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}`")
UNIT = r"(?:t/s|tok/s|tokens/s|ms|us|µs|ns|s|[KMGT]B/s)"
MEASUREMENT = re.compile(r"bench/results/|\b\d+(?:\.\d+)?\s*" + UNIT + r"(?![\w/])|\b\d+(?:\.\d+)?x(?!\w)")
MEASURE_HEADER = re.compile(r"(?<![\w/'-])(?:t/s|tok/s|tokens/s|ms|us|µs|ns|[KMGT]B/s)(?![\w/])|\b[Ss]peed-?ups?\b")


def doc_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of a markdown text outside its fenced code blocks."""
    out, in_code = [], False
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            out.append((no, line))
    return out


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line, level, title) of every heading outside code blocks."""
    out = []
    for no, line in doc_lines(text):
        m = re.match(r"(#{1,6}) +(.*?)\s*#*\s*$", line)
        if m:
            out.append((no, len(m.group(1)), m.group(2)))
    return out


def slug(title: str) -> str:
    """GitHub's anchor of a heading's title (before the -1, -2 suffix of repeats)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def run_log_headings(text: str) -> list[str]:
    return [f"line {no}: {'#' * lvl} {t}" for no, lvl, t in headings(text) if RUN_LOG_HEADING.search(t)]


def stale_words(text: str) -> list[str]:
    return [f"line {no}: {m.group(0)!r} in {line.strip()[:80]!r}"
            for no, line in doc_lines(text) for m in STALE_WORDS.finditer(line)]


def result_tables(text: str) -> list[str]:
    """The markdown tables (a header row, a |---| row, rows) with a cell that cites a measurement:
    'line N: <the first such cell>'."""
    out, table = [], []
    lines = doc_lines(text) + [(0, "")]
    for no, line in lines:
        if line.lstrip().startswith("|"):
            table.append((no, line))
            continue
        if len(table) >= 2 and re.match(r"\s*\|[\s:|-]*-[\s:|-]*$", table[1][1]):
            for i, (rno, row) in enumerate(table):
                hit = next((c.strip() for c in row.strip().strip("|").split("|")
                            if COMMIT_CELL.search(c) or MEASUREMENT.search(c)
                            or (i == 0 and MEASURE_HEADER.search(c))), None)
                if hit is not None:
                    out.append(f"line {table[0][0]} (row {rno}): {hit[:100]!r}")
                    break
        table = []
    return out


def opening_problems(text: str) -> list[str]:
    """What a long doc's opening lacks: a '# title' first, then (before its first '## ' section) a
    paragraph saying what the page covers and a contents list linking every '## ' section."""
    hs = headings(text)
    if not hs or hs[0][1] != 1 or text.lstrip().splitlines()[0] != "# " + hs[0][2]:
        return ["it does not open with a '# title' line"]
    sections = [(no, t) for no, lvl, t in hs if lvl == 2]
    end = sections[0][0] if sections else len(text.splitlines()) + 1
    preamble = [line for no, line in doc_lines(text) if hs[0][0] < no < end]
    prose = " ".join(line.strip() for line in preamble
                     if line.strip() and not re.match(r"\s*(?:[|#>*-]|\d+\.|<!--|\[)", line))
    problems = []
    if len(prose) < 60:
        problems.append("no paragraph before its first section says what the page covers")
    linked = set(re.findall(r"\]\(#([^)\s]+)\)", "\n".join(preamble)))
    seen, missing = {}, []
    for _, lvl, t in hs:
        s = slug(t)
        n = seen.get(s, 0)
        seen[s] = n + 1
        if lvl == 2 and (s if n == 0 else f"{s}-{n}") not in linked:
            missing.append(t)
    if sections and missing:
        problems.append(f"its contents list (links before the first section) lacks: {missing}")
    if not sections:
        problems.append("it has no '## ' sections to list")
    return problems


def test_readme_keeps_the_test_command():
    assert TEST_COMMAND in (ROOT / "README.md").read_text(), (
        f"README.md lost the test command {TEST_COMMAND!r} (.ci/run runs it)")


@pytest.mark.parametrize("doc", CAPPED_DOCS)
def test_docs_stay_under_their_caps(doc):
    cap = SMALL_DOC_BYTES.get(doc, DOC_MAX_BYTES)
    size = (ROOT / doc).stat().st_size
    assert size <= cap, (f"{doc} is {size} bytes, over its cap of {cap}: merge and point (figures are rows of "
                         "bench/README.md, history is CHANGELOG.md, the GPU runbook is scripts/gpu_session.sh's "
                         "usage), do not raise the cap")


@pytest.mark.parametrize("doc", SHAPED_DOCS)
def test_docs_have_no_dated_or_run_log_headings_and_no_stale_words(doc):
    path = ROOT / doc
    if not path.exists():
        pytest.skip(f"{doc} does not exist")
    text = path.read_text()
    bad = run_log_headings(text)
    assert not bad, (f"{doc} has headings that date themselves or log a run (name the topic; when it happened "
                     "goes in CHANGELOG.md):\n" + "\n".join(bad))
    stale = stale_words(text)
    assert not stale, f"{doc} has words that go stale (say the commit or drop them):\n" + "\n".join(stale)


@pytest.mark.parametrize("doc", REFERENCE_DOCS)
def test_reference_docs_hold_no_result_tables(doc):
    bad = result_tables((ROOT / doc).read_text())
    assert not bad, (f"{doc} has tables citing measurements (commits, result files, timings, speed-ups): make "
                     "them rows of bench/README.md with their command, commit, machine and result file, and "
                     "point there:\n" + "\n".join(bad))


@pytest.mark.parametrize("doc", SHAPED_DOCS)
def test_long_docs_open_with_what_they_cover_and_their_contents(doc):
    path = ROOT / doc
    if not path.exists() or path.stat().st_size <= OPENING_FROM_BYTES:
        pytest.skip(f"{doc} is {OPENING_FROM_BYTES} bytes or less")
    bad = opening_problems(path.read_text())
    assert not bad, f"{doc} is over {OPENING_FROM_BYTES} bytes and its opening falls short: " + "; ".join(bad)


def test_doc_shape_checks_catch_what_they_should():
    """The checks above on planted text: dated and run-log headings (not topic ones, nor lines in
    code blocks), stale words, a result table (not a table of settings or files), and a long doc
    without its opening or with a section missing from its contents."""
    planted = ("# T\n\n## 2026-11-28\n### Stop 52: what ran\n## The next GPU call\n## Run of Nov 28\n"
               "## Session notes\n## Results, 28 November\n"
               "## The kernels\n## Build, test, run\n## Moving the upstream pin\n## 2048 cells per bin\n"
               "```sh\n# 2026-11-28 in a code block is a comment\n```\n")
    assert [b.split(": ", 1)[1] for b in run_log_headings(planted)] == [
        "## 2026-11-28", "### Stop 52: what ran", "## The next GPU call", "## Run of Nov 28",
        "## Session notes", "## Results, 28 November"]
    assert len(stale_words("As of today's build (docs uncommitted), it runs.\n")) == 2
    assert not stale_words("Runs each day.\n```\ntoday\n```\n")

    settings = "| field | default | meaning |\n| --- | --- | --- |\n| `k` | 0 | positions, 1..2^20 |\n"
    files = "| file | what |\n| --- | --- |\n| `cpu/sparq-cpu.cpp` | the 16 phases, x86 and NEON |\n"
    costs = ("| selector | notes |\n| --- | --- |\n| `oracle` | reads all of K: not a speed-up |\n"
             "| `h2o` | `2 k d + 2 S` (its scores) |\n| `index` | `256` lists, 16 probed, 4 steps |\n")
    assert not result_tables(settings + "\n" + files + "\n" + costs)
    for row in ("| 4K | `49b147f` | H200 |", "| 4K | 1.264 ms | 1.790 ms |", "| 4K | 61.97 t/s | |",
                "| 4K | **1.58x** | |", "| 4K | see `bench/results/gpu_h200_49b147f_b1.md` | |",
                "| 65536 | 39.2 us | |", "| eval | 1452 s | |"):
        table = "| S | a | b |\n|---|---|---|\n" + row + "\n"
        assert len(result_tables("text\n\n" + table + "\nmore\n")) == 1, row
    assert not result_tables("| setting | K^T's `r` at `b_t`, the rest at 2 |\n|---|---|\n| `pca` | `2 d^2` |\n")
    for header in ("| S | dense `-fa 1` ms | SparQ ms |", "| S | speed-up | compression |"):
        table = header + "\n|---|---|---|\n| 4096 | 1.264 | 1.790 |\n"
        assert len(result_tables(table)) == 1, header
    assert not result_tables("```\n| S | ms |\n|---|---|\n| 1 | 2 ms |\n```\n")  # in a code block

    body = "".join(f"## Part {i}\n\n" + "words " * 400 + "\n\n" for i in range(3))
    contents = "".join(f"- [Part {i}](#part-{i})\n" for i in range(3))
    opening = "# Title\n\nThis page says what the parts are, how they fit together, and where to go next.\n\n"
    assert not opening_problems(opening + contents + "\n" + body)
    assert opening_problems("# Title\n\n" + contents + "\n" + body)  # no paragraph
    assert any("Part 2" in p for p in opening_problems(opening + contents[:-len("- [Part 2](#part-2)\n")] + body))
    assert opening_problems("Intro first.\n\n# Title\n\n" + contents + body)  # the title is not first


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
    for _, _, title in headings(md.read_text()):
        s = slug(title)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
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
    assert "0.9f, SPARQ_SHARE" in text
    changed.write_text(text.replace("0.9f, SPARQ_SHARE", "0.8f, SPARQ_SHARE"))
    other = st.render(changed)
    assert other != readme[b:e] and "| 0.8 |" in other

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
