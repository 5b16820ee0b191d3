#!/usr/bin/env python3
"""Why a Whisper transcript on the simulator differs from the CPU's: for every clip a full-tier
record (verify-full.json) names as differing, at 30 s and at each window, the CPU ONNX decode of
that clip again, with the margin between the two highest logits at every token. A near tie (a margin
of a few hundredths) at the token where the simulator's transcript departs is fp16 rounding picking
the other token; a large one would be a wrong result.

    python bench/whisper_ties.py --project DIR --model whisper-base --chip SM8750 [--out FILE]

DIR is the project whose build/ holds the record and the simplified ONNX
(build/<model>/<graph>/<graph>.onnx). Writes bench/results/whisper-ties-<model>-<chip>.json."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_npu  # noqa: E402  (the repository's model code: the same decode as the verify stage)


def cpu_runner(build: Path, suffix: str):
    """run(graph, feeds) over the CPU ONNX of one window, keeping the top-2 margin of
    every decoder call."""
    import numpy as np
    import onnxruntime as ort
    sessions = {
        g: ort.InferenceSession(
            str(build / f"{g}{suffix}" / f"{g}{suffix}.onnx"), providers=["CPUExecutionProvider"]
        )
        for g in ("encoder", "decoder")
    }
    steps: list[tuple[int, int, float]] = []   # (top token, runner-up, margin) per decoder call

    def run(graph: str, feeds: dict) -> dict:
        session = sessions[graph.removesuffix(suffix)]
        out = dict(zip((o.name for o in session.get_outputs()), session.run(None, feeds)))
        if "logits" in out:
            logits = out["logits"][0, -1]
            runner_up, top = np.argsort(logits)[-2:]
            steps.append((int(top), int(runner_up), float(logits[top] - logits[runner_up])))
        return out

    return run, steps


def ties(build: Path, data: str, seconds: int, clip: str, sim_text: str) -> dict:
    suffix = "" if seconds == 30 else f"_{seconds}s"
    run, steps = cpu_runner(build, suffix)
    wav = next(path for name, path, _ in whisper_npu.samples(data) if name == clip)
    positions = seconds * 50
    pair = {"encoder": f"encoder{suffix}", "decoder": f"decoder{suffix}"}
    enc = run(pair["encoder"], {"mel": whisper_npu._mel(wav, positions)})
    tok = whisper_npu._tokenizer(run, enc, pair["decoder"])
    steps.clear()
    tokens = whisper_npu._greedy(
        run, enc, tok, whisper_npu.window_tokens(224, positions), decoder=pair["decoder"]
    )
    # the prompt's calls pick nothing
    generated = steps[len(tok.sot_sequence_including_notimestamps) - 1:]
    sim = tok.encode(" " + sim_text)
    # where the simulator's text departs: the first token of the CPU's decode (eot included) it
    # does not share
    cpu = [*tokens, tok.eot]
    departs = next(
        (i for i, (a, b) in enumerate(zip(cpu, [*sim, tok.eot])) if a != b), min(len(cpu), len(sim))
    )

    def text(t: int) -> str:
        return "<|endoftext|>" if t == tok.eot else tok.decode([t])

    there = generated[departs] if departs < len(generated) else None
    return {
        "window_s": seconds,
        "clip": clip,
        "cpu": tok.decode(tokens).strip(),
        "simulator": sim_text,
        "tokens": [
            {"token": text(t), "runner_up": text(r), "margin": round(m, 4)} for t, r, m in generated
        ],
        "departs_at": departs,
        "margin_there": round(there[2], 4) if there else None,
        "simulator_took_the_runner_up": bool(there) and [*sim, tok.eot][departs] == there[1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default=str(ROOT))
    parser.add_argument("--model", required=True)
    parser.add_argument("--chip", required=True)
    parser.add_argument("--data", default=str(ROOT / "models/data/speech-en"))
    parser.add_argument("--out")
    args = parser.parse_args()
    build = Path(args.project) / "build" / args.model
    record = json.loads((build / "ort-qnn" / args.chip / "verify-full.json").read_text())
    differing = [(30, record["task"]["differ"])]
    differing += [
        (int(s), row["differ"]) for s, row in (record["task"].get("windows") or {}).items()
    ]
    rows = [ties(build, args.data, seconds, clip, texts[1])
            for seconds, differ in differing for clip, texts in differ.items()]
    for row in rows:
        print(
            f"{row['window_s']} s {row['clip']}: CPU {row['cpu']!r}, simulator "
            f"{row['simulator']!r}; departs at "
            f"token {row['departs_at']}, where the CPU's top two logits are {row['margin_there']} "
            "apart "
            + ("(the simulator took the runner-up)" if row["simulator_took_the_runner_up"]
               else "(not its runner-up)")
        )
    out = Path(args.out or ROOT / f"bench/results/whisper-ties-{args.model}-{args.chip}.json")
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "chip": args.chip,
                "verify_full": record["task"]["summary"],
                "seconds": record["seconds"],
                "differ": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
