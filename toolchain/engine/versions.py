"""Installed distributions' versions and folders, read once per process: every task's settings name
its tools' versions, and importlib.metadata reads the installed package's metadata files anew on
each call (hundreds of reads made a third of a no-op `doit`)."""
from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

NotInstalled = metadata.PackageNotFoundError


@functools.cache
def version(distribution: str) -> str:
    """The installed version (NotInstalled if it is not)."""
    return of(metadata.distribution(distribution))


def of(dist: metadata.Distribution) -> str:
    """dist.version, read from the metadata's header block alone: dist.version parses the whole file
    as an e-mail message, long description and all (~1 ms a package; six at each load)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    for line in text.partition("\n\n")[0].splitlines():
        if line.startswith("Version:"):
            return line.removeprefix("Version:").strip()
    return dist.version


@functools.cache
def folder(distribution: str, inner: str) -> Path:
    """Where an installed distribution keeps `inner` (a package folder or file), found
    from its metadata."""
    return Path(str(metadata.distribution(distribution).locate_file(inner)))
