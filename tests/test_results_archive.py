"""scripts/results_archive.py against this checkout's own history, without a build: every
archived result file is gone from bench/results/, and each comes back from git history with the
bytes the archive records (skipped outside a git checkout or where history is shallow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "results_archive.py"
ARCHIVE = ROOT / "bench" / "results" / "ARCHIVE.tsv"


def git_ok(*args) -> bool:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def rows():
    if not git_ok("rev-parse", "--git-dir"):
        pytest.skip("not a git checkout")
    if not ARCHIVE.is_file():
        pytest.skip("no bench/results/ARCHIVE.tsv")
    out = []
    for line in ARCHIVE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, commit, size = line.split("\t")
            out.append((name, commit, int(size)))
    assert out, "ARCHIVE.tsv lists no file"
    return out


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_archived_files_are_out_of_the_tree_and_listed_once(rows):
    names = [n for n, _, _ in rows]
    assert len(names) == len(set(names)), "a file is archived twice"
    present = sorted(n for n in names if (ROOT / "bench" / "results" / n).exists())
    assert not present, f"archived files still in bench/results/: {present}"
    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == len(rows)


def test_fetch_restores_the_recorded_bytes(rows, tmp_path):
    name, commit, size = min(rows, key=lambda r: r[2])
    if not git_ok("cat-file", "-e", f"{commit}:bench/results/{name}"):
        pytest.skip(f"commit {commit[:12]} is not in this clone's history (shallow?)")
    p = run("fetch", name, "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    data = (tmp_path / name).read_bytes()
    assert len(data) == size
    shown = subprocess.run(["git", "show", f"{commit}:bench/results/{name}"], cwd=ROOT, capture_output=True).stdout
    assert data == shown


def test_fetch_refuses_a_name_not_archived(rows, tmp_path):
    p = run("fetch", "no_such_result.md", "--out", str(tmp_path))
    assert p.returncode != 0 and "not in bench/results/ARCHIVE.tsv" in p.stderr
