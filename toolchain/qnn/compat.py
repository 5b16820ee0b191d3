"""Which QNN runtime loads which context binary: the load rule, measured (docs/qairt-families.md, 75
runs on 3 chips; tests/test_compiler_families.py holds it). A runtime loads binaries built with its
own QAIRT family or an older one and refuses any built with a newer one, even one release newer
(context creation: QNN_CONTEXT_ERROR_INVALID_ARGUMENT). Families are QAIRT major.minor; a binary's
family is in its build id (v2.51.0.260929181845 -> 2.51). Beware: a binary's QNN *core API* version
(2.40.0 for QAIRT 2.51) is not a QAIRT version."""
from __future__ import annotations

import re

VERSION = re.compile(r"^v?(\d+)\.(\d+)(?!\d)")   # a build id may carry more: v2.40.0.251030-standin
# The QNN runtime libraries sherpa-onnx's released apps ship
# (qnn-libs-2.40.0.251030: docs/qairt-families.md)
SHERPA_APPS = "2.40.0.251030"


def family(version: str | None) -> str | None:
    """'v2.51.0.260929181845', '2.49.40' or '2.49' -> '2.51' / '2.49'; None when it is not
    a QAIRT version."""
    found = VERSION.match((version or "").strip())   # the major.minor it starts with
    return f"{found.group(1)}.{found.group(2)}" if found else None


def key(version: str) -> tuple[int, int]:
    """(major, minor) of a QAIRT version; ValueError naming it when it is not one."""
    name = family(version)
    if name is None:
        raise ValueError(f"{version!r} is not a QAIRT version (e.g. 2.49 or 2.49.40.260810104044)")
    major, minor = name.split(".")
    return int(major), int(minor)


def loads(runtime: str, build_id: str) -> bool:
    """Whether a QNN runtime of QAIRT `runtime` loads a binary of build id `build_id`."""
    return key(build_id) <= key(runtime)


def requirement(build_id: str | None) -> dict:
    """What a deployer needs to know first about a binary: its build id and the runtime it needs."""
    name = family(build_id)
    if build_id is None or name is None:
        return {
            "build_id": build_id,
            "qairt_family": None,
            "needs": "unknown: the binary carries no QAIRT build id",
        }
    found = {
        "build_id": build_id,
        "qairt_family": name,
        "needs": f"a QNN runtime of QAIRT >= {name} (libQnnHtp.so, libQnnSystem.so, Stub and Skel "
                 "of that "
        f"release or newer); an older runtime refuses the binary at context creation "
        f"(QNN_CONTEXT_ERROR_INVALID_ARGUMENT)",
    }
    if not loads(SHERPA_APPS, build_id):
        found["sherpa_onnx_apps"] = sherpa_note(build_id)
    return found


def sherpa_note(build_id: str) -> str:
    name = family(build_id)
    return (
        f"sherpa-onnx's released apps ship QNN runtime libraries of QAIRT {SHERPA_APPS} and will "
        "refuse these "
        f"binaries (built with QAIRT {name}); ship QNN libraries of QAIRT >= {name} with the app "
        "instead of "
        f'theirs, or build with a QAIRT SDK {family(SHERPA_APPS)} (compiler = "qairt", '
        'QNN_SDK_ROOT)'
    )
