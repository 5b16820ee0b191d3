"""A project of your own: the files `python -m toolchain init FOLDER` writes (from template/), and the example's
seeded checkpoint with its sha256 pinned in the TOML. Nothing is overwritten: a file already there is refused."""
from __future__ import annotations

from pathlib import Path

from toolchain.engine.files import sha256
from toolchain.engine.worker import load_module

TEMPLATE = Path(__file__).with_name("template")
# where each template goes in the project
FILES = {"dodo.py.in": "dodo.py", "gitignore.in": ".gitignore", "example.toml.in": "models/example.toml",
         "example.py.in": "models/example.py"}
CHECKPOINT = "models/example.pt"


class Refused(Exception):
    """The folder already holds a file init would write."""


def project(folder: str | Path) -> list[str]:
    root = Path(folder)
    there = [rel for rel in [*FILES.values(), CHECKPOINT] if (root / rel).exists()]
    if there:
        raise Refused(f"{root}: already has {', '.join(there)}; init writes only into a folder without them")
    (root / "models").mkdir(parents=True, exist_ok=True)
    for template, rel in FILES.items():
        if rel != FILES["example.toml.in"]:
            (root / rel).write_text((TEMPLATE / template).read_text())
    example = load_module(str(root / FILES["example.py.in"]))   # the template's own helper, not a hook of the build
    example.make_checkpoint(str(root / CHECKPOINT))
    spec = (TEMPLATE / "example.toml.in").read_text().replace("@SHA256@", sha256(root / CHECKPOINT))
    (root / FILES["example.toml.in"]).write_text(spec)
    return [*FILES.values(), CHECKPOINT]
