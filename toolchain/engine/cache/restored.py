"""What a file restored from the artifact cache must be, by its format, before it is put in place:
the checks a cache writer cannot satisfy with arbitrary bytes. A record (.json) parses and is one
JSON object; an array file (.npy, or each member of an .npz) holds no Python objects, so loading it
can never unpickle. The standard library only: the engine imports no model or array package (numpy's
.npy header is a Python literal)."""
from __future__ import annotations

import ast
import json
import struct
import zipfile

NPY_MAGIC = b"\x93NUMPY"


def problems(path: str, name: str) -> list[str]:
    """What is wrong with the staged file `path` that will become `name` (nothing: use it)."""
    try:
        if name.endswith(".json"):
            return _record(path, name)
        if name.endswith(".npy"):
            with open(path, "rb") as f:
                return _array(f, name)
        if name.endswith(".npz"):
            with zipfile.ZipFile(path) as archive:
                found = []
                for member in archive.namelist():
                    with archive.open(member) as f:
                        found += _array(f, f"{name}:{member}")
                return found
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        return [f"{name} does not parse ({err})"]
    return []


def _record(path: str, name: str) -> list[str]:
    with open(path, "rb") as f:
        value = json.loads(f.read().decode("utf-8"))
    return (
        []
        if isinstance(value, dict)
        else [f"{name} is JSON {type(value).__name__}, not a record (an object)"]
    )


def _array(f, name: str) -> list[str]:
    """The .npy header of stream `f` (format 1.0-3.0): a dtype with an object field would
    unpickle on load."""
    if f.read(6) != NPY_MAGIC:
        return [f"{name} is not an .npy array"]
    major = f.read(2)[0]
    size = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
    header = ast.literal_eval(f.read(size).decode("latin1"))
    descr = header.get("descr") if isinstance(header, dict) else None
    if descr is None:
        return [f"{name} has no dtype in its header"]
    if any(kind.lstrip("<>|=").startswith("O") for kind in _kinds(descr)):
        return [f"{name} holds Python objects (dtype {descr}): loading it would unpickle"]
    return []


def _kinds(descr) -> list[str]:
    """The type strings of a dtype descr: '<f4', or [(name, type[, shape]), ...] for
    a structured one."""
    if isinstance(descr, str):
        return [descr]
    if isinstance(descr, (list, tuple)):
        return [
            kind
            for field in descr
            for kind in _kinds(field[1] if isinstance(field, tuple) else field)
        ]
    return [repr(descr)]
