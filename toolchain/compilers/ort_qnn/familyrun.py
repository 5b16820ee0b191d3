"""A QAIRT family's simulator, run in that family's own interpreter: the verify step (the build's
Python, with the model's own code and its CPU reference) hands each call's feeds to a child process
of the family's environment, which holds one EP session on the compiled EPContext model. Nothing of
the family loads into the caller's process, nothing of the build's own QAIRT into the child's.

The child (CHILD, arguments CTX_MODEL OPTIONS_JSON) answers one line per request on stdin (the path
of an .npz of feeds) with the path of an .npz of outputs; lines it prints start with MARK (the QNN
libraries print their own lines on stdout too)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from toolchain.compilers.ort_qnn import ep
from toolchain.errors import StageFailed

MARK = "QNC-FAMILYRUN "
# the child's entry (not `-m`: the package imports this module first, and runpy warns about
# running it again)
CHILD = ("import sys; from toolchain.compilers.ort_qnn.familyrun import main; "
         "sys.exit(main(*sys.argv[1:]))")


def simulator(ctx_model: str, options: dict, python: str, env: dict) -> Callable[[dict], dict]:
    """run(feeds) -> outputs for `ctx_model` on the simulator of the family whose
    interpreter is `python`."""
    import numpy as np
    scratch = tempfile.mkdtemp(prefix="familyrun.")
    child = subprocess.Popen(
        [python, "-c", CHILD, ctx_model, json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.getcwd(),
    )
    first = _answer(child, ctx_model)
    names = json.loads(first)
    calls = [0]

    def run(feeds: dict) -> dict:
        calls[0] += 1
        path = os.path.join(scratch, f"feeds-{calls[0]}.npz")
        np.savez(path, **feeds)
        assert child.stdin is not None   # stdin=PIPE
        child.stdin.write(path + "\n")
        child.stdin.flush()
        out = _answer(child, ctx_model)
        with np.load(out) as found:
            result = {name: found[name] for name in names}
        os.unlink(path)
        os.unlink(out)
        return result
    return run


def _answer(child: subprocess.Popen[str], ctx_model: str) -> str:
    assert child.stdout is not None   # stdout=PIPE
    while True:
        line = child.stdout.readline()
        if not line:
            child.wait()
            raise StageFailed(
                f"{ctx_model}: the QAIRT family's simulator process ended (exit {child.returncode})"
            )
        if not line.startswith(MARK):
            print(line, end="")   # the libraries' own lines, into the step's log
            continue
        kind, _, rest = line[len(MARK):].rstrip("\n").partition(" ")
        if kind == "FAILED":
            child.wait()
            raise StageFailed(f"{ctx_model}: {rest}")
        return rest


def main(ctx_model: str, options: str) -> int:
    import numpy as np
    try:
        run = ep.simulator(ctx_model, json.loads(options))
        import onnx
        names = [o.name for o in onnx.load(ctx_model, load_external_data=False).graph.output]
    except Exception as err:   # the load rule: an older runtime refuses a newer binary here
        print(f"{MARK}FAILED {_last(err)}", flush=True)
        return 3
    print(f"{MARK}READY {json.dumps(names)}", flush=True)
    for line in sys.stdin:
        path = line.strip()
        with np.load(path) as found:
            feeds = {k: found[k] for k in found.files}
        try:
            outputs = run(feeds)
        except Exception as err:
            print(f"{MARK}FAILED {_last(err)}", flush=True)
            return 3
        out = path[:-len(".npz")] + ".out.npz"
        np.savez(out, **outputs)
        print(f"{MARK}DONE {out}", flush=True)
    return 0


def _last(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
