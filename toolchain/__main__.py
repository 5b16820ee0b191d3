"""`python -m toolchain` (or `qnn-npu-compile`): start a project of your own (init.py)."""
from __future__ import annotations

import argparse
import sys

from toolchain import init


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolchain", description="qnn-npu-compile: PyTorch and ONNX "
                                     "models -> Qualcomm HTP context binaries, a doit build in your own repository")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("init", help="write dodo.py, models/example.toml + example.py and .gitignore into "
                                "FOLDER (then: cd FOLDER && doit)")
    start.add_argument("folder", nargs="?", default=".", help="the project folder (made if missing; default: here)")
    args = parser.parse_args(argv)
    try:
        written = init.project(args.folder)
    except init.Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\n".join(f"wrote {path}" for path in written))
    print(f"next: cd {args.folder} && doit      (doit list: the tasks; the TOML's keys: docs/add-a-model.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
