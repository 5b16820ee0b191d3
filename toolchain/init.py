"""A project of your own: the files `python -m toolchain init FOLDER` writes (from template/), and the example's
seeded checkpoint with its sha256 pinned in the TOML (with `--from`, a given ONNX's spec instead of the example:
check.py). Nothing is overwritten: a file already there is refused."""
from __future__ import annotations

from pathlib import Path

from toolchain.engine.files import atomic_path, sha256
from toolchain.engine.worker import load_module

TEMPLATE = Path(__file__).with_name("template")
# where each template goes in the project
FILES = {"dodo.py.in": "dodo.py", "gitignore.in": ".gitignore", "example.toml.in": "models/example.toml",
         "example.py.in": "models/example.py"}
EXAMPLE = ("example.toml.in", "example.py.in")
CHECKPOINT = "models/example.pt"


class Refused(Exception):
    """The folder already holds a file init would write."""


def files(example: bool = True) -> list[str]:
    """What init writes, relative to the project folder (without the example: dodo.py and .gitignore)."""
    return [*FILES.values(), CHECKPOINT] if example else [rel for t, rel in FILES.items() if t not in EXAMPLE]


def refuse_taken(folder: str | Path, example: bool = True) -> None:
    """Refused when the folder already holds a file init would write."""
    root = Path(folder)
    there = [rel for rel in files(example) if (root / rel).exists()]
    if there:
        raise Refused(f"{root}: already has {', '.join(there)}; init writes only into a folder without them")


def project(folder: str | Path, example: bool = True) -> list[str]:
    root = Path(folder)
    refuse_taken(root, example)
    (root / "models").mkdir(parents=True, exist_ok=True)
    for template, rel in FILES.items():
        if template not in EXAMPLE:
            _write(root / rel, (TEMPLATE / template).read_text())
    if not example:
        return files(example)
    _write(root / FILES["example.py.in"], (TEMPLATE / "example.py.in").read_text())
    code = load_module(str(root / FILES["example.py.in"]))   # the template's own helper, not a hook of the build
    code.make_checkpoint(str(root / CHECKPOINT))
    spec = (TEMPLATE / "example.toml.in").read_text().replace("@SHA256@", sha256(root / CHECKPOINT))
    _write(root / FILES["example.toml.in"], spec)
    return files(example)


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:   # a killed init leaves no half-written file
        tmp.write_text(text)
