"""Original checkpoint -> the model code's PyTorch checkpoint, once per model, pinned by sha256."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

from doit.tools import config_changed

from toolchain import artifacts
from toolchain.engine import cache
from toolchain.engine.files import atomic_path, sha256
from toolchain.engine.run.worker import load_module, run
from toolchain.errors import StageFailed
from toolchain.shared import modeldata
from toolchain.stages import Project, export, named

DOC = "verify the pinned checkpoint's sha256 and convert it for the export code"


def tasks(project: Project) -> Iterator[dict]:
    for model in project.models:
        ck = model.checkpoint
        if ck is None:   # every graph's ONNX comes from a declared command or file
            continue
        out, log = artifacts.checkpoint(model), artifacts.checkpoint_log(model)
        settings = {"origin": ck.origin, "sha256": ck.sha256, "format": ck.format}
        kwargs = {
            "spec_file": model.spec_file,
            "module_file": model.module_file,
            "parts": list(ck.parts or [ck.path]),
            "pinned": ck.sha256,
            "fmt": ck.format,
            "out": out,
        }
        yield {
            **named(model),
            "doc": f"{model.name}: {DOC}",
            "file_dep": [*(ck.parts or [ck.path]), *model.code_files],
            "targets": [out, log],
            "clean": True,
            "actions": [(run, (prepare, kwargs, log))],
            "meta": {
                "restore_check": (
                    restored,
                    {"out": out, "pinned": ck.sha256, "module_file": model.module_file},
                ),
                # converted by the model code: no later step can tell other
                # weights from these
                **({cache.KIND: cache.RESULT} if converts(model.module_file) else {}),
            },
            "uptodate": [config_changed(settings)],
        }


def prepare(spec_file: str, module_file: str, parts: list, pinned: str, fmt: str, out: str) -> None:
    """Refuse a checkpoint whose bytes are not the pinned ones; else let the model
    code convert it."""
    if len(parts) == 1:
        source = parts[0]
    else:   # join the parts first: the pin is the whole file's hash
        source = out + ".joined"
        with atomic_path(source) as tmp, open(tmp, "wb") as joined:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, joined)
    actual = sha256(source)
    if actual != pinned:
        raise StageFailed(
            f"{spec_file}: checkpoint.sha256: {source} has sha256 {actual}, the spec pins "
            f"{pinned}; refusing a different checkpoint (update the pin only if you meant it)"
        )
    module = load_module(module_file)
    with atomic_path(out) as tmp:
        if hasattr(module, "prepare_checkpoint"):
            try:
                module.prepare_checkpoint(source, str(tmp), fmt)
            # the model code refusing the format or file: one line, no frames
            except ValueError as err:
                raise StageFailed(f"{spec_file}: checkpoint.format = {fmt!r}: "
                                  f"{module_file} refused it: {err}") from None
            # a file the code cannot read: named, with the code's own line
            except Exception as err:
                raise export.code_failed(
                    module_file, f"prepare_checkpoint (format {fmt!r}, {spec_file})", source, err
                ) from err
        else:
            shutil.copyfile(source, tmp)

    if len(parts) > 1:
        os.unlink(source)   # the joined copy is only an intermediate


def restored(staged: dict, out: str, pinned: str, module_file: str) -> list[str]:
    """Why a checkpoint restored from a cache (`staged`: target -> the restored file) is not this
    task's: a copy (model code without prepare_checkpoint) must have the spec's pinned sha256, which
    no cache writer can change. A converted checkpoint is data the model code loads with
    torch.load(weights_only=True) (docs/add-a-model.md)."""
    if sha256(staged[out]) == pinned or converts(module_file):
        return []
    return [
        f"{out} is a copy of the pinned checkpoint but has sha256 {sha256(staged[out])}, the spec "
        f"pins {pinned}"
    ]


def converts(module_file: str) -> bool:
    """Whether the model code defines prepare_checkpoint (read, not imported: doit's
    process stays light)."""
    return modeldata.defines(module_file, "prepare_checkpoint")
