"""Installed distributions' versions and folders, read once per process: every task's settings name its tools'
versions, and importlib.metadata reads the installed package's metadata files anew on each call (hundreds of reads
made a third of a no-op `doit`)."""
from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

NotInstalled = metadata.PackageNotFoundError


@functools.cache
def version(distribution: str) -> str:
    """The installed version (NotInstalled if it is not)."""
    return metadata.version(distribution)


@functools.cache
def folder(distribution: str, inner: str) -> Path:
    """Where an installed distribution keeps `inner` (a package folder or file), found from its metadata."""
    return Path(str(metadata.distribution(distribution).locate_file(inner)))
