"""Every setting of a build, once: the `doit name=value` variables and their environment twins, and
the settings that only the environment carries (credentials, the QAIRT SDK). `resolve()` reads them
when dodo.py loads into one frozen Options (the mechanism and the precedence rule:
engine/options.py); the project holds it (Project.options) and every stage and the engine take their
settings from there. docs/usage.md's table is held to TABLE by tests/test_docs.py; `python -m
toolchain.options` prints it."""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from toolchain import pipeline
from toolchain.compilers import registry
from toolchain.deploy import chip_index
from toolchain.engine import cache
from toolchain.engine.cache import sign
from toolchain.engine.options import (
    Option,
    OptionError,
    Options,
    choice,
    command_line,
    flag,
    integer,
    number,
    table_markdown,
    text,
)
from toolchain.engine.options import resolve as resolve_rows
from toolchain.engine.run import limits, zygote
from toolchain.spec import chips as chip_table

__all__ = ["TABLE", "Options", "OptionError", "resolve", "resolve_given"]


def _chips(value: str) -> tuple[str, ...]:
    known = chip_table.load()
    wanted = tuple(dict.fromkeys(c for c in value.split(",") if c))
    if wanted == ("all",):
        return tuple(known)
    for name in wanted:
        if name not in known:
            raise ValueError(chip_table.unknown(name, known))
    return wanted


def _file(value: str) -> str:
    if not os.path.isfile(value):
        raise ValueError("no such file")
    return value


def _limits(value: str) -> dict[str, int]:
    return limits.parse(value, pipeline.NAMES)


TABLE: tuple[Option, ...] = (
    # what is built
    Option(
        "full",
        _chips,
        (),
        "the full verification tier (every sample) for these chips: a comma list, or all",
        examples=("SM8750", "SM8550,SM8650"),
    ),
    Option("extra", flag, False, "1: add the opt-in models of models/extra/", examples=("0", "1")),
    Option(
        "corpus",
        flag,
        False,
        "1: add the corpus of real models from packages, models/corpus/ (docs/corpus.md)",
        examples=("0", "1"),
    ),
    Option(
        "qairt",
        registry.check_families,
        "",
        "build this run for other QAIRT families: versions or runtime "
        "versions, a comma list, or all (docs/qairt-families.md)",
        examples=("2.49", "2.47,2.51"),
    ),
    # how it runs
    Option(
        "jobs",
        integer(1),
        os.cpu_count() or 1,
        "steps at once by default (doit's -n overrides it)",
        env="QNN_JOBS",
        variable=False,
        examples=("3", "4"),
        shown_default="the cores",
    ),
    Option(
        "limits",
        _limits,
        {},
        "slots per stage, over the measured defaults: `<stage>:<slots>,…` (0: no limit)",
        env="QNN_LIMITS",
        examples=("compile:1", "verify:2,compile:1"),
    ),
    Option(
        "workers",
        choice(*zygote.MODES),
        "fork",
        "fork: steps fork from a warm server; fresh: a new interpreter per step",
        env="QNN_WORKERS",
        examples=("fresh", "fork"),
    ),
    Option(
        "rehash",
        flag,
        False,
        "1: read every file's bytes, trusting no stamp",
        env="QNN_REHASH",
        examples=("1", "0"),
    ),
    # the shared cache (docs/scale.md)
    Option(
        "cache",
        cache.parse_location,
        None,
        "the shared cache: a folder or an http(s):// URL",
        env="QNN_CACHE",
        examples=("/tmp/qnn-cache-a", "http://cache.example.com:8080/"),
    ),
    Option(
        "cache_upload",
        flag,
        True,
        "0: a read-only client (restores, never stores or evicts)",
        env="QNN_CACHE_UPLOAD",
        examples=("0", "1"),
    ),
    Option(
        "cache_timeout",
        number,
        5.0,
        "seconds per request to a cache server",
        env="QNN_CACHE_TIMEOUT",
        variable=False,
        examples=("1", "30"),
    ),
    Option(
        "cache_retry",
        number,
        300.0,
        "seconds a cache server that failed is left alone",
        env="QNN_CACHE_RETRY",
        variable=False,
        examples=("60", "600"),
    ),
    Option(
        "cache_max_blob",
        integer(1),
        cache.MAX_BLOB,
        "the most bytes an entry may record for one output",
        env="QNN_CACHE_MAX_BLOB",
        variable=False,
        examples=("1000", "2000"),
        shown_default="4 GiB",
    ),
    Option(
        "cache_ca",
        _file,
        None,
        "a PEM file of the CAs that sign an https:// cache server",
        env="QNN_CACHE_CA",
        # any existing files: the row checks existence
        variable=False,
        examples=("/etc/hosts", "/etc/passwd"),
    ),
    Option(
        "cache_trust",
        sign.trusted_keys,
        (),
        "restore only entries signed by one of these public keys, a comma "
        'list (python -m toolchain cache-key; docs/scale.md, "Signed entries")',
        env="QNN_CACHE_TRUST",
        examples=(f"ci-1:{'A' * 43}=", f"ci-2:{'B' * 43}="),
    ),
    Option(
        "cache_sign_key",
        text,
        None,
        "the secret key file that signs each entry this client stores",
        env="QNN_CACHE_SIGN_KEY",
        variable=False,
        examples=("/keys/ci-1.secret", "/keys/ci-2.secret"),
    ),
    Option(
        "cache_token",
        text,
        None,
        "a bearer token for the cache server (never printed)",
        env="QNN_CACHE_TOKEN",
        variable=False,
        examples=("token-a", "token-b"),
        secret=True,
    ),
    Option(
        "cache_user",
        text,
        None,
        "basic-auth user for the cache server",
        env="QNN_CACHE_USER",
        variable=False,
        examples=("alice", "bob"),
    ),
    Option(
        "cache_password",
        text,
        None,
        "basic-auth password (never printed)",
        env="QNN_CACHE_PASSWORD",
        variable=False,
        examples=("pw-a", "pw-b"),
        secret=True,
    ),
    # the QAIRT SDK and an attached phone (docs/phone.md)
    Option(
        "sdk",
        text,
        None,
        'the unzipped QAIRT SDK (compiler = "qairt", and the phone\'s libraries)',
        env="QNN_SDK_ROOT",
        examples=("/opt/qairt-a", "/opt/qairt-b"),
    ),
    Option(
        "qairt_python",
        text,
        "python3.10",
        "the Python the QAIRT converter runs with",
        env="QAIRT_PYTHON",
        variable=False,
        examples=("/usr/bin/python3", "python3.12"),
    ),
    Option(
        "kind",
        choice(*chip_index.KINDS),
        "onnxruntime",
        "device: which bundle to run",
        examples=("onnxruntime", "sherpa-onnx"),
    ),
    Option(
        "ort_perf",
        text,
        None,
        "device: an onnxruntime_perf_test built for the phone, run instead of qnn-net-run",
        examples=("/opt/ort_perf_a", "/opt/ort_perf_b"),
    ),
    Option("runs", integer(0), 10, "device: timed runs per graph", examples=("20", "5")),
    Option("interval", number, 2.0, "device, step0: seconds between samples", examples=("1", "5")),
    Option(
        "minutes", number, 0.0, "device: minutes of sustained load (0: none)", examples=("30", "10")
    ),
    Option(
        "input_seconds",
        number,
        None,
        "device: seconds of input one call stands for (real-time factor)",
        examples=("30", "5"),
    ),
    Option(
        "pid",
        integer(1),
        None,
        "step0: the process running today's CPU path",
        examples=("1234", "4321"),
    ),
    Option(
        "process",
        text,
        None,
        "step0: its name, when no pid is given",
        examples=("com.app", "com.other"),
    ),
    Option("seconds", number, None, "step0: a fixed task length in seconds", examples=("60", "30")),
)


def resolve(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Options:
    """This run's settings from doit's command line (`argv`: sys.argv[1:]) and the environment."""
    return resolve_given(command_line(sys.argv[1:] if argv is None else argv), environ)


def resolve_given(given: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> Options:
    """This run's settings from the `name=value` words given and the environment."""
    return resolve_rows(TABLE, given, environ)


if __name__ == "__main__":
    print(table_markdown(TABLE))
