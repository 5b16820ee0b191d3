"""Reproducible .tar.bz2 bundles: same inputs, same bytes (sorted names, fixed mtime/owner/mode)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from toolchain.engine.files import atomic_path

if TYPE_CHECKING:
    import tarfile

MTIME = 0            # no build time in the archive: two builds of the same inputs compare equal
FILE_MODE, DIR_MODE = 0o644, 0o755
# tarfile is imported where used: doit's own process loads this module at every run, which
# writes no bundle


def write(out: str | Path, top: str, members: dict[str, str | Path | bytes]) -> None:
    """Write `out` atomically: `top`/<name> for each member, a file path or bytes,
    in sorted order."""
    import tarfile
    with atomic_path(out) as tmp:
        # bz2 has no timestamp of its own and compresses deterministically at a fixed level.
        with tarfile.open(tmp, "w:bz2", compresslevel=9, format=tarfile.GNU_FORMAT) as tar:
            for folder in _folders(top, members):
                tar.addfile(_info(folder, tarfile.DIRTYPE, 0, DIR_MODE))
            for name in sorted(members):
                data = members[name]
                if isinstance(data, bytes):
                    tar.addfile(
                        _info(f"{top}/{name}", tarfile.REGTYPE, len(data), FILE_MODE),
                        io.BytesIO(data),
                    )
                else:
                    with open(data, "rb") as f:
                        size = Path(data).stat().st_size
                        tar.addfile(_info(f"{top}/{name}", tarfile.REGTYPE, size, FILE_MODE), f)


def names(path: str | Path) -> list[str]:
    """Member names of a bundle, in archive order."""
    import tarfile
    with tarfile.open(path, "r:bz2") as tar:
        return tar.getnames()


def extract(path: str | Path, into: str | Path) -> Path:
    """Unpack a bundle (refusing links and paths outside `into`); returns its top folder."""
    import tarfile
    with tarfile.open(path, "r:bz2") as tar:
        tar.extractall(into, filter="data")
        top = tar.getnames()[0].split("/")[0]
    return Path(into) / top


def _folders(top: str, members) -> list[str]:
    found = {top}
    for name in members:
        parts = name.split("/")[:-1]
        found.update(f"{top}/{'/'.join(parts[:i])}" for i in range(1, len(parts) + 1))
    return sorted(found)


def _info(name: str, kind: bytes, size: int, mode: int) -> tarfile.TarInfo:
    import tarfile
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
