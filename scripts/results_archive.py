#!/usr/bin/env python3
"""Result files that left bench/results/ (superseded runs, the history of a figure), restored
from git history. bench/results/ holds only the runs bench/README.md quotes as current;
bench/results/ARCHIVE.tsv lists every file removed from it with the last commit that had it.

    python scripts/results_archive.py list [PATTERN]           the archived files (name, commit, bytes)
    python scripts/results_archive.py fetch NAME... [--out DIR]  restore them (default build/results-archive;
                                                                 --out - writes one to stdout)
    python scripts/results_archive.py archive NAME...          take current files out of bench/results/ into
                                                                 the archive (git rm; commit both yourself)

NAME and PATTERN are file names in bench/results/, or globs (`'real_text_smollm2_8k_*'`).
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "bench/results"
ARCHIVE = ROOT / RESULTS / "ARCHIVE.tsv"
HEADER = "# name\tcommit\tbytes"


def git(*args: str, binary: bool = False):
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=not binary)
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace") if binary else p.stderr
        raise SystemExit(f"results_archive: git {' '.join(args)}: {err.strip()}")
    return p.stdout


def read_archive() -> list[tuple[str, str, int]]:
    """(name, commit, bytes) of every archived file, in the file's order."""
    if not ARCHIVE.is_file():
        return []
    rows = []
    for line in ARCHIVE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, commit, size = line.split("\t")
            rows.append((name, commit, int(size)))
    return rows


def write_archive(rows) -> None:
    rows = sorted(rows)
    ARCHIVE.write_text("\n".join([HEADER] + [f"{n}\t{c}\t{s}" for n, c, s in rows]) + "\n")


def matching(rows, patterns) -> list[tuple[str, str, int]]:
    out = [r for r in rows if any(fnmatch.fnmatchcase(r[0], p) for p in patterns)]
    missing = [p for p in patterns if not any(fnmatch.fnmatchcase(r[0], p) for r in rows)]
    if missing:
        raise SystemExit(f"results_archive: not in {ARCHIVE.relative_to(ROOT)}: {', '.join(missing)} "
                         "(`list` shows what is)")
    return out


def cmd_list(a) -> int:
    rows = read_archive()
    if a.pattern:
        rows = [r for r in rows if fnmatch.fnmatchcase(r[0], a.pattern)]
    for name, commit, size in rows:
        print(f"{name}\t{commit[:12]}\t{size}")
    return 0


def cmd_fetch(a) -> int:
    rows = matching(read_archive(), a.names)
    if a.out == "-":
        if len(rows) != 1:
            raise SystemExit("results_archive: --out - writes one file: name one")
        name, commit, _ = rows[0]
        sys.stdout.buffer.write(git("show", f"{commit}:{RESULTS}/{name}", binary=True))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, commit, size in rows:
        data = git("show", f"{commit}:{RESULTS}/{name}", binary=True)
        if len(data) != size:
            raise SystemExit(f"results_archive: {name} at {commit[:12]} has {len(data)} bytes, the archive says {size}")
        (out / name).write_bytes(data)
        print(out / name)
    return 0


def cmd_archive(a) -> int:
    rows = {r[0]: r for r in read_archive()}
    head = git("rev-parse", "HEAD").strip()
    names = []
    for pattern in a.names:
        found = sorted(p.name for p in (ROOT / RESULTS).glob(pattern) if p.is_file() and p != ARCHIVE)
        if not found:
            raise SystemExit(f"results_archive: no file in {RESULTS} matches {pattern}")
        names += found
    for name in names:
        path = f"{RESULTS}/{name}"
        # the file must be in HEAD as it is now, or the archive would point at other bytes
        if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=ROOT).returncode != 0:
            raise SystemExit(f"results_archive: {path} differs from HEAD's (or is not committed): commit it first")
        rows[name] = (name, head, (ROOT / path).stat().st_size)
    git("rm", "-q", "--", *(f"{RESULTS}/{n}" for n in names))
    write_archive(rows.values())
    print(f"archived {len(names)} file(s) at {head[:12]}; commit {RESULTS}/ARCHIVE.tsv with the removal")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="the archived files: name, commit, bytes")
    p.add_argument("pattern", nargs="?", default=None)
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("fetch", help="restore archived files from git history")
    p.add_argument("names", nargs="+")
    p.add_argument("--out", default=str(ROOT / "build" / "results-archive"),
                   help="where they go (default build/results-archive; - for stdout)")
    p.set_defaults(fn=cmd_fetch)
    p = sub.add_parser("archive", help="move current result files into the archive (git rm)")
    p.add_argument("names", nargs="+")
    p.set_defaults(fn=cmd_archive)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
