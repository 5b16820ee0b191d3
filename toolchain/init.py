"""A project of your own: the files `python -m toolchain init FOLDER` writes (from template/), and
the example's seeded checkpoint with its sha256 pinned in the TOML (with `--from`, a given ONNX's
spec instead of the example: check.py). Nothing is overwritten: a file already there is refused."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from toolchain.engine.files import atomic_path, sha256
from toolchain.engine.run.worker import load_module

TEMPLATE = Path(__file__).with_name("template")
# where each template goes in the project
FILES = {
    "dodo.py.in": "dodo.py",
    "gitignore.in": ".gitignore",
    "example.toml.in": "models/example.toml",
    "example.py.in": "models/example.py",
}
EXAMPLE = ("example.toml.in", "example.py.in")
CHECKPOINT = "models/example.pt"


class Refused(Exception):
    """The folder already holds a file init would write."""


def files(example: bool = True) -> list[str]:
    """What init writes, relative to the project folder (without the example:
    dodo.py and .gitignore)."""
    return (
        [*FILES.values(), CHECKPOINT]
        if example
        else [rel for t, rel in FILES.items() if t not in EXAMPLE]
    )


def refuse_taken(folder: str | Path, example: bool = True) -> None:
    """Refused, in one line, when init cannot write the folder whole: it holds a file (or a link,
    dangling or not) where init writes one, its `models` is no folder or a link out of it, or the
    folder is a file."""
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise Refused(f"{root}: is a file, not a folder; name a folder (made if missing)")
    models = root / "models"
    if models.is_symlink() and (not models.exists() or not _inside(models, root)):
        raise Refused(
            f"{models}: a link out of {root} (to {os.readlink(models)}); init writes only inside "
            "the folder"
        )
    if os.path.lexists(models) and not models.is_dir():
        raise Refused(f"{models}: is a file; init writes the models folder there")
    there = [rel for rel in files(example) if os.path.lexists(root / rel)]
    if there:
        raise Refused(
            f"{root}: already has {', '.join(there)}; init writes only into a folder without them"
        )


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def project(folder: str | Path, example: bool = True) -> list[str]:
    """Write the project's files into a temp folder inside `folder`, then rename each into place: a
    read-only or full disk, or a killed init, leaves nothing half-written. What the disk says is
    one line (Refused)."""
    root = Path(folder)
    refuse_taken(root, example)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".qnn-init-", dir=root))
    except OSError as err:
        raise Refused(f"{root}: cannot write there ({err.strerror or err})") from None
    moved, made_models = [], not (root / "models").exists()
    try:
        _stage(staging, example)
        (root / "models").mkdir(exist_ok=True)
        refuse_taken(root, example)   # again: nothing appeared in the meantime
        for rel in files(example):
            os.replace(staging / rel, root / rel)
            moved.append(root / rel)
    # RuntimeError: torch.save on a full disk ("basic_ios::clear")
    except (OSError, RuntimeError) as err:
        for path in moved:   # all or nothing
            path.unlink(missing_ok=True)
        if made_models and (root / "models").is_dir() and not any((root / "models").iterdir()):
            (root / "models").rmdir()
        reason = getattr(err, "strerror", None) or str(err).strip().splitlines()[0]
        raise Refused(f"{root}: cannot write there ({reason}); nothing written") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return files(example)


def _stage(staging: Path, example: bool) -> None:
    (staging / "models").mkdir()
    for template, rel in FILES.items():
        if template not in EXAMPLE:
            _write(staging / rel, (TEMPLATE / template).read_text())
    if not example:
        return
    _write(staging / FILES["example.py.in"], (TEMPLATE / "example.py.in").read_text())
    # the template's own helper, not a hook of the build
    code = load_module(str(staging / FILES["example.py.in"]))
    code.make_checkpoint(str(staging / CHECKPOINT))
    spec = (
        (TEMPLATE / "example.toml.in").read_text().replace("@SHA256@", sha256(staging / CHECKPOINT))
    )
    _write(staging / FILES["example.toml.in"], spec)


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:   # a killed init leaves no half-written file
        tmp.write_text(text)
