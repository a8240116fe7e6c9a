#!/usr/bin/env python3
"""Fetch the pinned upstream llama.cpp and apply the fork's patch series.

The pin lives in ``upstream.pin`` at the repository root.  ``prepare``:

1. downloads the pinned PyPI sdist with pip (by name and version) into
   ``.upstream/sdist/`` unless it is already there, and checks its sha256;
2. unpacks the sdist's llama.cpp tree into ``.upstream/llama.cpp-<commit12>/``
   (reused by later builds) and records the pristine tree as a git commit, so
   that ``git diff`` there shows exactly what the patches changed;
3. applies ``patches/*.patch`` in numeric order.  A patch that is already
   applied (it reverses cleanly; checked first) is skipped; a patch that applies
   neither in reverse nor forwards stops with a message naming it and the pin.
   No fuzz is allowed (a plain tree is patched with ``patch --fuzz=0``).

``LLAMA_SPARQ_UPSTREAM_DIR=/path/to/llama.cpp`` names a local upstream tree
instead of the download (the patches are still applied to it).

``python-layer`` unpacks the same sdist's pure-Python package ``llama_cpp/`` (and its
LICENSE.md) into ``.upstream/<package>-<version>/`` and prints that folder: the wheel
ships it as the ``llama_cpp`` package (MIT), so pip never builds llama-cpp-python (and
its own llama.cpp) as a dependency; at run time it loads the fork's libllama through
``LLAMA_CPP_LIB_PATH`` (set by ``llama_sparq``).

Exit codes: 0 success, 1 a patch does not apply or the download failed or the
checksum is wrong, 2 bad usage.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV_DIR = "LLAMA_SPARQ_UPSTREAM_DIR"


class UpstreamError(RuntimeError):
    pass


def read_pin(path: Path | None = None) -> dict:
    path = path or ROOT / "upstream.pin"
    pin = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UpstreamError(f"{path}: malformed line {line!r} (expected key = value)")
        pin[key.strip()] = value.strip()
    for key in ("package", "version", "sha256", "subdir", "llama_cpp_commit"):
        if key not in pin:
            raise UpstreamError(f"{path}: missing key {key!r}")
    return pin


def pin_label(pin: dict) -> str:
    return f"{pin['package']}=={pin['version']} (llama.cpp {pin['llama_cpp_commit'][:12]})"


def log(msg: str) -> None:
    print(f"[upstream] {msg}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(pin: dict, cache: Path) -> Path:
    """Return the verified sdist, downloading it with pip when missing."""
    cache.mkdir(parents=True, exist_ok=True)
    name = pin["package"].replace("-", "_")
    want = cache / f"{name}-{pin['version']}.tar.gz"
    if want.exists() and sha256_of(want) == pin["sha256"]:
        return want
    if want.exists():
        log(f"{want.name}: checksum mismatch, downloading again")
        want.unlink()
    log(f"downloading {pin['package']}=={pin['version']} sdist with pip")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", tmp, f"{pin['package']}=={pin['version']}"]
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if res.returncode != 0:
            raise UpstreamError(f"pip download of {pin_label(pin)} failed:\n{res.stdout[-2000:]}")
        got = list(Path(tmp).glob("*.tar.gz"))
        if len(got) != 1:
            raise UpstreamError(f"pip download produced {got}, expected one .tar.gz")
        digest = sha256_of(got[0])
        if digest != pin["sha256"]:
            raise UpstreamError(
                f"sha256 of downloaded {got[0].name} is {digest}, the pin says {pin['sha256']}")
        shutil.move(str(got[0]), want)
    return want


def git(tree: Path, *args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent),
               GIT_AUTHOR_NAME="llama-sparq", GIT_AUTHOR_EMAIL="llama-sparq@localhost",
               GIT_COMMITTER_NAME="llama-sparq", GIT_COMMITTER_EMAIL="llama-sparq@localhost")
    res = subprocess.run(["git", "-C", str(tree), *args], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and res.returncode != 0:
        raise UpstreamError(f"git {' '.join(args)} in {tree} failed:\n{res.stderr}")
    return res


def extract(sdist: Path, tmp: Path, prefix: str, keep) -> list[str]:
    """Extract the sdist's members under ``prefix`` for which ``keep(rel, member)`` holds into
    a fresh ``tmp``, with the prefix stripped; return their relative names."""
    if tmp.exists():
        shutil.rmtree(tmp)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or m.name == prefix.rstrip("/"):
                continue
            rel = m.name[len(prefix):]
            if keep(rel, m):
                m.name = rel
                members.append(m)
        if members:
            tar.extractall(tmp, members=members, filter="tar")
    return [m.name for m in members]


def unpack(pin: dict, sdist: Path, dest: Path) -> None:
    """Unpack the sdist's llama.cpp tree into dest and commit it as pristine."""
    tmp = dest.with_name(dest.name + ".tmp")
    log(f"unpacking {sdist.name} -> {dest}")
    prefix = f"{sdist.name[:-len('.tar.gz')]}/{pin['subdir']}/"
    # leave out a submodule gitdir pointer (.git) that would dangle here
    names = extract(sdist, tmp, prefix, lambda rel, m: not (rel == ".git" or rel.startswith(".git/")))
    if not names:
        raise UpstreamError(f"{sdist.name} holds no {pin['subdir']}/ tree")
    git(tmp, "init", "-q")
    git(tmp, "add", "-A")
    git(tmp, "commit", "-q", "--no-verify", "-m",
        f"pristine {pin_label(pin)}\n\nllama.cpp commit {pin['llama_cpp_commit']}")
    tmp.rename(dest)


def is_git_tree(tree: Path) -> bool:
    return (tree / ".git").exists()


def patch_list(patch_dir: Path) -> list[Path]:
    return sorted(p for p in patch_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def _patch(tree: Path, patch: Path, *args: str) -> subprocess.CompletedProcess:
    # --fuzz=0: every context line must match; -f: never ask, never guess "reversed"
    return subprocess.run(["patch", "-p1", "-s", "-f", "--fuzz=0", "-d", str(tree), "-i", str(patch), *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def apply_patches(tree: Path, patch_dir: Path, pin: dict) -> list[tuple[str, str]]:
    """Apply the series; return (patch, 'applied'|'skipped') per patch.

    "Already applied" is checked first (the patch reverses cleanly): an applied patch can
    also apply forwards a second time where its context repeats elsewhere in a file. Both
    checks and the application allow no fuzz (plain trees: patch --fuzz=0; git trees: git
    apply, which never fuzzes), so a patch lands only where all its context matches."""
    result = []
    use_git = is_git_tree(tree)
    for patch in patch_list(patch_dir):
        if use_git:
            rev = git(tree, "apply", "--check", "--reverse", "--whitespace=nowarn", str(patch), check=False)
        else:
            rev = _patch(tree, patch, "-R", "--dry-run")
        if rev.returncode == 0:
            result.append((patch.name, "skipped"))
            continue
        if use_git:
            fwd = git(tree, "apply", "--check", "--whitespace=nowarn", str(patch), check=False)
        else:
            fwd = _patch(tree, patch, "--dry-run")
        if fwd.returncode != 0:
            detail = (fwd.stderr if use_git else fwd.stdout) or ""
            raise UpstreamError(
                f"patch {patch.name} does not apply to {tree} (pin {pin_label(pin)}).\n"
                f"Regenerate it against the pin (see patches/README.md).\n{detail.strip()}")
        if use_git:
            git(tree, "apply", "--whitespace=nowarn", str(patch))
        else:
            res = _patch(tree, patch)
            if res.returncode != 0:
                raise UpstreamError(f"patch {patch.name} failed on {tree}:\n{res.stdout.strip()}")
        log(f"applied {patch.name}")
        result.append((patch.name, "applied"))
    return result


def tree_path(root: Path = ROOT) -> Path:
    """Where the prepared upstream tree lives: ``LLAMA_SPARQ_UPSTREAM_DIR`` or ``.upstream/llama.cpp-<commit12>``."""
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override).resolve()
    return root / ".upstream" / f"llama.cpp-{read_pin(root / 'upstream.pin')['llama_cpp_commit'][:12]}"


def prepare(root: Path = ROOT, quiet: bool = False) -> Path:
    pin = read_pin(root / "upstream.pin")
    override = os.environ.get(ENV_DIR)
    tree = tree_path(root)
    if override:
        if not (tree / "ggml" / "include" / "ggml.h").exists():
            raise UpstreamError(f"{ENV_DIR}={override}: not a llama.cpp tree (no ggml/include/ggml.h)")
        log(f"using local upstream tree {tree} ({ENV_DIR})")
    else:
        if not tree.exists():
            sdist = fetch_sdist(pin, root / ".upstream" / "sdist")
            unpack(pin, sdist, tree)
    apply_patches(tree, root / "patches", pin)
    return tree


def python_layer(root: Path = ROOT) -> Path:
    """Unpack the pinned sdist's llama_cpp/ Python package and LICENSE.md; return their folder."""
    pin = read_pin(root / "upstream.pin")
    dest = root / ".upstream" / f"{pin['package'].replace('-', '_')}-{pin['version']}"
    if (dest / "llama_cpp" / "__init__.py").is_file() and (dest / "LICENSE.md").is_file():
        return dest
    sdist = fetch_sdist(pin, root / ".upstream" / "sdist")
    tmp = dest.with_name(dest.name + ".tmp")
    log(f"unpacking the Python layer of {sdist.name} -> {dest}")
    names = extract(sdist, tmp, f"{sdist.name[:-len('.tar.gz')]}/",
                    lambda rel, m: (rel == "LICENSE.md" or rel.startswith("llama_cpp/")) and (m.isfile() or m.isdir()))
    if "llama_cpp/__init__.py" not in names:
        raise UpstreamError(f"{sdist.name} holds no llama_cpp/ package")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="fetch, unpack and patch; print the tree's path")
    p.add_argument("--root", type=Path, default=ROOT)
    p = sub.add_parser("apply", help="apply the patch series to a given tree")
    p.add_argument("tree", type=Path)
    p.add_argument("--patches", type=Path, default=ROOT / "patches")
    p.add_argument("--pin", type=Path, default=ROOT / "upstream.pin")
    sub.add_parser("pin", help="print the pin")
    p = sub.add_parser("python-layer", help="unpack the sdist's llama_cpp/ Python package; print its folder")
    p.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "prepare":
            print(prepare(args.root))
        elif args.cmd == "apply":
            for name, what in apply_patches(args.tree.resolve(), args.patches, read_pin(args.pin)):
                print(f"{what} {name}")
        elif args.cmd == "python-layer":
            print(python_layer(args.root))
        elif args.cmd == "pin":
            print(pin_label(read_pin()))
    except UpstreamError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
