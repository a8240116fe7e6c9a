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
import io
import lzma
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
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        stage = Path(td)
        for p in files:
            if p.suffix == ".whl":
                restore(p, stage / p.name)
            else:
                shutil.copy2(p, stage / p.name)
        tmp = out.with_suffix(out.suffix + ".tmp")
        xz = shutil.which("xz")
        if xz:  # several threads where the tool has them (a minute for the CUDA wheel on 2 cores)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tf:
                for p in sorted(stage.iterdir()):
                    tf.add(p, arcname=p.name)
            with open(tmp, "wb") as f:
                subprocess.run([xz, "-9", "-T0", "-c"], input=buf.getvalue(), stdout=f, check=True)
        else:
            with tarfile.open(tmp, mode="w:xz", preset=9) as tf:
                for p in sorted(stage.iterdir()):
                    tf.add(p, arcname=p.name)
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
