"""How far a candidate's outputs are from the CPU reference's, per output and call, and whether that
is within each output's check: the one measure verify, parity, the stream loop, the bundle gates,
the phone and the report use."""
from __future__ import annotations

import math
import time
from typing import NotRequired, TypedDict

from toolchain.spec import VERIFY_BOUNDS
from toolchain.spec.records import Verify

# numpy is imported where used: doit's own process loads this module on every run
# (tests/test_engine_worker.py)



class TensorErrors(TypedDict):
    """element_errors(): one output of one call against the reference (crosses from a worker
    in its record)."""
    max_abs: float
    max_rel: float    # max_abs / range
    p99_rel: float
    cosine: float
    range: float      # the reference's largest |value| (1 when all zero)


class OutputCheck(TypedDict, total=False):
    """One output's bound: graphs.<g>.checks.<output>, else the model's [verify]
    bounds (output_checks)."""
    max_abs: float
    max_rel: float
    min_cosine: float
    judged_by: str    # the task metric decides, not a tensor bound


class GraphErrors(TypedDict):
    """tensor_errors()[graph]: the worst over outputs and calls, as verify.json and
    parity.json record it."""
    max_abs: float
    max_rel: float
    p99_rel: float
    cosine: float
    calls: int
    seconds_per_call: float
    outputs: NotRequired[dict[str, dict]]   # per output: _judged()


def tensor_errors(
    reference,
    candidate,
    feeds_by_graph: dict,
    checks: dict[str, dict[str, OutputCheck]] | None = None,
) -> dict[str, GraphErrors]:
    """Per graph, worst over outputs and calls: max-abs error, max-abs error relative to the
    reference's range (its largest |value| in that call: one element decides it), the 99th
    percentile of the element errors relative to that range (robust to a few outliers), and the
    cosine similarity of each output as a whole vector. Under "outputs", the same per output, with
    the call where the output's check (`checks`: {graph: {output: check}}, see excess) is most
    exceeded, and whether it held."""
    result: dict[str, GraphErrors] = {}
    for graph, feeds_list in feeds_by_graph.items():
        worst = {"max_abs": 0.0, "max_rel": 0.0, "p99_rel": 0.0, "cosine": 1.0}
        per_output: dict[str, list[TensorErrors]] = {}
        seconds = 0.0
        for feeds in feeds_list:
            ref = reference(graph, feeds)
            started = time.monotonic()
            got = candidate(graph, feeds)
            seconds += time.monotonic() - started
            for name, want in ref.items():
                errors = element_errors(want, got[name])
                per_output.setdefault(name, []).append(errors)
                for key in ("max_abs", "max_rel", "p99_rel"):
                    worst[key] = max(worst[key], errors[key])   # type: ignore[literal-required]
                worst["cosine"] = min(worst["cosine"], errors["cosine"])
        result[graph] = GraphErrors(
            max_abs=worst["max_abs"],
            max_rel=worst["max_rel"],
            p99_rel=worst["p99_rel"],
            cosine=worst["cosine"],
            calls=len(feeds_list),
            # the candidate's
            seconds_per_call=round(seconds / max(len(feeds_list), 1), 3),
        )
        if checks is not None:
            result[graph]["outputs"] = {
                name: _judged(calls, checks[graph][name]) for name, calls in per_output.items()
            }
    return result


def _judged(calls: list[TensorErrors], check: OutputCheck) -> dict:
    """One output over its calls: the worst of each measure, and the call its check is
    most exceeded in."""
    import numpy as np
    judged = "judged_by" not in check
    ratios = [excess(e, check) for e in calls] if judged else [e["max_abs"] for e in calls]
    call = int(np.argmax(ratios))
    return {
        "max_abs": max(e["max_abs"] for e in calls),
        "max_rel": max(e["max_rel"] for e in calls),
        "p99_rel": max(e["p99_rel"] for e in calls),
        "cosine": min(e["cosine"] for e in calls),
        "worst_call": call,
        "at_worst_call": calls[call],
        "check": dict(check),
        "passed": bool(ratios[call] <= 1.0) if judged else None,
    }


def excess(errors: TensorErrors, check: OutputCheck) -> float:
    """How far one call's output is from its check (<= 1: within). max_abs and max_rel together
    bound the error like numpy's isclose: |error| <= max_abs + max_rel x range; min_cosine bounds
    1 - cosine."""
    if "judged_by" in check:
        return 0.0
    ratio = 0.0
    if "max_abs" in check or "max_rel" in check:
        allowed = check.get("max_abs", 0.0) + check.get("max_rel", 0.0) * errors["range"]
        ratio = errors["max_abs"] / allowed if allowed else (math.inf if errors["max_abs"] else 0.0)
    if "min_cosine" in check:
        slack = 1.0 - check["min_cosine"]
        lost = max(0.0, 1.0 - errors["cosine"])
        ratio = max(ratio, lost / slack if slack else (math.inf if lost else 0.0))
    return ratio


def allowed(check: dict, where: str) -> str:
    """A check in words, with where it was declared (a failure message names both)."""
    parts = []
    if "max_abs" in check and "max_rel" in check:
        parts.append(f"|error| <= {check['max_abs']:g} + {check['max_rel']:g} x range")
    elif "max_abs" in check:
        parts.append(f"|error| <= {check['max_abs']:g}")
    elif "max_rel" in check:
        parts.append(f"|error| <= {check['max_rel']:g} x range")
    if "min_cosine" in check:
        parts.append(f"cosine >= {check['min_cosine']:g}")
    return " and ".join(parts) + f" ({where})"


RANGE = "range = the largest |value| of the CPU output in that call"

# One fp16 step relative to a value (10 mantissa bits): an fp16 graph's output is off by about this
# much of its range from its last rounding alone, whatever its ops do.
FP16_STEP = 2 ** -10


def beyond_precision(check: dict, precision: str) -> str:
    """For a bound tighter than the graph's precision can hold (an fp16 graph's max_rel below one
    fp16 step), that sentence, to be said before any op is blamed; '' otherwise."""
    bound = check.get("max_rel")
    if precision != "fp16" or bound is None or check.get("max_abs") or bound >= FP16_STEP:
        return ""
    return (
        f"the bound max_rel {bound:g} is below what fp16 can hold (one fp16 step is 2^-10 = "
        f"{FP16_STEP:.2g} of "
        "a value, before any op adds its own rounding), so no op is to blame: raise it to 0.002 "
        "or more (the "
        f"default is {VERIFY_BOUNDS['max_rel']:g})"
    )


def output_checks(graph, verify: Verify) -> dict[str, OutputCheck]:
    """{output: check} of a graph: as declared in graphs.<g>.checks, else the model's [verify]
    bounds for the graph's precision (today's check, per output)."""
    default = OutputCheck(max_rel=graph.precision.max_rel(verify))
    if verify.min_cosine:
        default["min_cosine"] = verify.min_cosine
    return {
        o.name: OutputCheck(**graph.checks[o.name]) if o.name in graph.checks else default
        for o in graph.outputs
    }


def check_source(
    graph, output: str, spec: str, check: OutputCheck | None = None, written: tuple = ()
) -> str:
    """Where an output's check was declared, for a failure message: the spec's key, or the default's
    name when the spec does not write it (`written`: the [verify] keys it writes)."""
    if output in graph.checks:
        return f"{spec}: graphs.{graph.name}.checks.{output}"
    keys = [graph.precision.bound_key]
    keys += ["min_cosine"] if check and "min_cosine" in check else []
    said = [
        f"verify.{k}"
        if k in written
        else f"the default verify.{k} (not in the spec; docs/add-a-model.md)"
        for k in keys
    ]
    return f"{spec}: {' and '.join(said)}"


def element_errors(want, got) -> TensorErrors:
    """The error measures of one output (see tensor_errors); `range` is the scale
    max_rel divides by."""
    import numpy as np
    want, got = want.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    diff = np.abs(want - got)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    scale = scale or 1.0
    norms = float(np.linalg.norm(want) * np.linalg.norm(got))
    cosine = float(np.dot(want, got) / norms) if norms else float(np.array_equal(want, got))
    # inf/NaN from the candidate (an fp16 overflow): as bad as it gets
    if not np.all(np.isfinite(got)):
        return TensorErrors(
            max_abs=math.inf, max_rel=math.inf, p99_rel=math.inf, cosine=-1.0, range=scale
        )
    return TensorErrors(
        max_abs=float(diff.max(initial=0.0)),
        max_rel=float(diff.max(initial=0.0)) / scale,
        p99_rel=float(np.percentile(diff, 99)) / scale if diff.size else 0.0,
        cosine=cosine,
        range=scale,
    )


def finite(value):
    """inf/NaN (an fp16 overflow) as strings: a record is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return [finite(v) for v in value] if isinstance(value, (list, tuple)) else value
