#!/usr/bin/env python3
"""Pack build/gpu-wheel into one xz archive small enough to carry to a GPU machine.

The device tool carries at most 64 MiB per call, the tracked tree included; the CUDA wheel alone
is about 52 MB as pip deflates it. Re-stored without compression inside the archive, the wheel's
libraries compress under xz to about 48 MB. scripts/gpu_session.sh unpacks the archive into the
wheel folder when that folder holds no wheel.

    python scripts/gpu_wheel_pack.py [--wheels build/gpu-wheel] [--out build/gpu-wheel-xz/wheel.tar.xz]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path


def restore(src: Path, dst: Path) -> None:
    """The wheel src rewritten to dst with every member stored (xz then sees the bytes, not deflate's)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            zo.writestr(info, zi.read(info.filename), compress_type=zipfile.ZIP_STORED)


def pack(wheels: Path, out: Path) -> Path:
    files = sorted(p for p in wheels.iterdir() if p.is_file())
    if not any(p.suffix == ".whl" for p in files):
        raise SystemExit(f"gpu_wheel_pack: no wheels in {wheels}: run 'make gpu-wheel' first")
    xz = shutil.which("xz")
    if not xz:
        raise SystemExit("gpu_wheel_pack: no xz on PATH (the xz-utils package)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tempfile.TemporaryDirectory() as td, open(tmp, "wb") as f:
        # the tar streamed into xz, which takes every core (a minute for the CUDA wheel on 2)
        proc = subprocess.Popen([xz, "-9", "-T0", "-c"], stdin=subprocess.PIPE, stdout=f)
        with tarfile.open(fileobj=proc.stdin, mode="w|") as tf:
            for p in files:
                if p.suffix == ".whl":
                    restore(p, Path(td) / p.name)
                    tf.add(Path(td) / p.name, arcname=p.name)
                else:
                    tf.add(p, arcname=p.name)
        proc.stdin.close()
        if proc.wait() != 0:
            raise SystemExit(f"gpu_wheel_pack: xz failed ({proc.returncode})")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default="build/gpu-wheel")
    ap.add_argument("--out", default="build/gpu-wheel-xz/wheel.tar.xz")
    args = ap.parse_args(argv)
    out = pack(Path(args.wheels), Path(args.out))
    print(f"{out}: {out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
