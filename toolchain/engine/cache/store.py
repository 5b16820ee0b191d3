"""Where the artifact cache keeps entries and blobs, and the rules every store follows (__init__.py
has the keys): a restore is all or nothing, each blob checked against its sha256 and the stage's own
restore check; a save writes the blobs first and the entry last; a store that fails says so in one
line and never fails the build. This module is the folder; remote.py the server."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from toolchain.engine.cache import restored, sign
from toolchain.engine.files import MODE, remember, sha256, sha256_memo

FORMAT = 2   # bump when the key material or the layout changes (2: inputs named portably)
BLOCK = 1 << 20
# bytes: an entry is a small JSON record; a larger answer is cut off and counts as bad
MAX_ENTRY = 16 << 20
# bytes an entry may record per output, unless the settings say (no writer fills the disk)
MAX_BLOB = 4 << 30
# Outputs that a later step compiles, links, loads or imports: never stored, never restored,
# whatever an entry says (a stage whose outputs are code declares it and is not cached at all:
# cache.run). A writer of the cache could otherwise run code on every machine that restores from it.
CODE_SUFFIXES = (
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".h",
    ".hpp",
    ".so",
    ".dylib",
    ".dll",
    ".o",
    ".a",
    ".py",
    ".pyc",
    ".pkl",
    ".pickle",
    ".sh",
)


@dataclass(frozen=True)
class Settings:
    """How this run reaches the cache, resolved once when dodo.py loads (toolchain/options.py
    declares each field's variable and environment twin) and handed to every task in its meta:
    nothing here reads the environment."""
    where: Path | str | None = None   # a folder, an http(s):// URL, or None (no cache)
    # False: a read-only client, which restores but never writes or evicts
    upload: bool = True
    max_blob: int = MAX_BLOB          # bytes an entry may record for one output
    timeout: float = 5.0              # seconds per request to a server
    retry: float = 300.0              # seconds a server that failed is left alone
    ca: str | None = None             # a PEM file for https:// (else the system's CAs)
    token: str | None = field(default=None, repr=False)      # a bearer token
    user: str | None = None                                  # basic auth, with password
    password: str | None = field(default=None, repr=False)
    # the file of the secret key that signs what this client stores (sign.py)
    sign_key: str | None = None
    # public keys: restore only entries one of them signed (none: unsigned cache)
    trust: tuple[str, ...] = ()


class Store:
    """One cache folder. A subclass (remote.HttpStore) changes where entries and blobs live,
    not the rules."""

    def __init__(self, root: str | Path, settings: Settings = Settings()):
        self.root = Path(root)
        self.name = str(self.root)
        # False: a read-only client, which restores but never writes or evicts
        self.upload = settings.upload
        self.max_blob = settings.max_blob
        self.sign_key, self.trust = settings.sign_key, settings.trust
        # entries (sha256 of their bytes) never restored (heal.BAD)
        self.refused: frozenset[str] = frozenset()
        # the sha256 of the entry the last restore() used
        self.digest: str | None = None

    def entry(self, key: str) -> Path:
        return self.root / "entries" / f"{key}.json"

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    # ---- where things live: the folder's own
    def read_entry(self, key: str) -> bytes | None:
        path = self.entry(key)
        if not path.exists():
            return None
        with open(path, "rb") as f:
            return bounded(f.read(MAX_ENTRY + 1), f"entry {key}")

    def write_entry(self, key: str, data: bytes) -> None:
        write_atomic(self.entry(key), data)

    def drop_entry(self, key: str) -> None:
        self.entry(key).unlink(missing_ok=True)

    def fetch_blob(self, digest: str, out: str, size: int) -> str:
        """The blob in a temp file beside `out` (the caller renames it): at most `size` bytes read,
        its sha256 checked; a blob of another size is a ValueError (a store never writes more than
        the entry says)."""
        return _copy(self.blob(digest), out, digest, size=size)

    def has_blob(self, digest: str) -> bool:
        blob = self.blob(digest)
        return blob.is_file() and sha256(blob) == digest

    def put_blob(self, digest: str, src: str) -> None:
        _copy(src, self.blob(digest), digest, replace=True)

    # ---- the rules, the same for every store
    def restore(self, key: str, outputs: list[str], check=None) -> bool:
        """Put the entry's files in place, all or none, each only if it is data (never code:
        CODE_SUFFIXES), its bytes have the recorded size and sha256, it parses as its format says
        (restored.py) and `check` (the stage's own, on the staged files) finds nothing; else drop
        the entry (never offered again) and return False."""
        staged = []
        try:
            data = self.read_entry(key)   # None: no such entry; too large: ValueError, a bad entry
            if data is None or hashlib.sha256(data).hexdigest() in self.refused:
                # refused: it failed a check in this tree (heal.py), the step runs here
                return False
            record = json.loads(data)
            if self.trust and sign.signer(key, record, self.trust) is None:
                say_once(
                    "untrusted",
                    f"{self.name}: an entry not signed by a key of cache_trust is never restored "
                    f"(first: {key[:12]} for {_task(record)}); such steps run here",
                )
                return False
            files = record["outputs"]
            if sorted(files) != sorted(outputs):
                raise ValueError(f"it lists {sorted(files)}, the task writes {sorted(outputs)}")
            for out, recorded in sorted(files.items()):
                _refuse_code(out)
                size = _size(recorded["bytes"], out, self.max_blob)
                staged.append((self.fetch_blob(recorded["sha256"], out, size), out))
            problems = [p for tmp, out in staged for p in restored.problems(tmp, out)]
            problems += check({out: tmp for tmp, out in staged}) if check and not problems else []
            if problems:
                raise ValueError("its outputs are not what this task makes: " + "; ".join(problems))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, Unreachable) as err:
            for tmp, _ in staged:
                os.unlink(tmp)
            if isinstance(err, Unreachable):
                _say(err, after="; the step runs here")
                return False
            warn(
                f"{self.name} entry {key}: unusable cache entry "
                + ("evicted" if self.upload else "ignored")
                + f", recomputing ({err})"
            )
            if self.upload:
                self.drop_entry(key)
            return False
        for tmp, out in staged:
            os.replace(tmp, out)
            remember(out, files[out]["sha256"])   # verified while copying: not hashed again
        self.digest = hashlib.sha256(data).hexdigest()
        return True

    def save(self, key: str, material: dict, outputs: list[str]) -> None:
        """Store the outputs (a blob that exists but fails its hash is replaced), then the entry
        with its key material (to diff when an expected hit misses): a reader never sees an entry
        whose blobs are not all there. A read-only client (upload False) and code outputs store
        nothing; nor does a client that trusts keys but holds no secret key (its entries would be
        unsigned: no reader like it restores them, and each would replace a signed one)."""
        if not self.upload or any(out.endswith(CODE_SUFFIXES) for out in outputs):
            return
        if self.trust and not self.sign_key:
            say_once(
                "unsigned-upload",
                f"{self.name}: nothing stored by this client: it trusts signed entries "
                "only (cache_trust) and holds no key to sign its own (cache_sign_key)",
            )
            return
        try:
            files = {}
            for out in outputs:
                digest = sha256_memo(out)   # the outputs record reuses it
                if not self.has_blob(digest):
                    self.put_blob(digest, out)
                files[out] = {"sha256": digest, "bytes": os.path.getsize(out)}
            record = {"format": FORMAT, "material": material, "outputs": files}
            if self.sign_key:
                record["signatures"] = [sign.sign(key, record, self.sign_key)]
            self.write_entry(key, json.dumps(record, indent=1, sort_keys=True).encode())
        except Unreachable as err:   # a dead or full server must not fail the build
            _say(err, f"could not store {material['task']}: ")
        except (OSError, ValueError) as err:   # nor a full or read-only folder
            warn(f"{self.name}: could not store {material['task']} ({err})")


def _refuse_code(out: str) -> None:
    if out.endswith(CODE_SUFFIXES):
        raise ValueError(
            f"{out} is code (a later step compiles, loads or imports it): never taken from a cache"
        )


def _size(recorded, out: str, limit: int) -> int:
    """An entry's recorded size of `out`, refused when it is no size or more than
    `limit` (Settings.max_blob)."""
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 0:
        raise ValueError(f"{out}: recorded size {recorded!r} is not a byte count")
    if recorded > limit:
        raise ValueError(
            f"{out}: the entry records {recorded} bytes, over the {limit} allowed (cache_max_blob)"
        )
    return recorded


def bounded(data: bytes, what: str, limit: int = MAX_ENTRY) -> bytes:
    if len(data) > limit:
        raise ValueError(f"{what} is over {limit} bytes: cut off")
    return data


class Unreachable(Exception):
    """The store did not answer (or answered with an error): the step runs locally, the
    build goes on."""


def _say(err: Unreachable, what: str = "", after: str = "") -> None:
    """One warning line for a server that failed; nothing for one skipped since (remote.Skipped)."""
    if type(err).__name__ != "Skipped":
        warn(what + str(err) + after)


def _copy(
    src: str | Path, dst: str | Path, digest: str, replace: bool = False, size: int | None = None
) -> str:
    """Copy src to a temp file beside dst, checking the bytes' sha256 (and, given `size`, reading no
    more than size + 1 bytes: a blob longer than its entry says is refused without copying the
    rest); rename it onto dst if `replace`, else return the temp name (the caller renames it)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        hasher, left = hashlib.sha256(), (size + 1 if size is not None else None)
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            for block in iter(lambda: f.read(BLOCK if left is None else min(BLOCK, left)), b""):
                hasher.update(block)
                out.write(block)
                if left is not None:
                    left -= len(block)
                    if left == 0:
                        raise ValueError(
                            f"{src} is larger than the {size} bytes its entry records: cut off"
                        )
        if size is not None and left is not None and left != 1:
            raise ValueError(f"{src} has {size + 1 - left} bytes, its entry records {size}")
        if hasher.hexdigest() != digest:
            raise ValueError(f"{src} has sha256 {hasher.hexdigest()}, recorded {digest}")
        os.chmod(tmp, MODE)   # the umask's mode: a shared cache is read by other users
        if replace:
            os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, MODE)
    os.replace(tmp, path)


def _task(record) -> str:
    material = record.get("material") if isinstance(record, dict) else None
    return str(material.get("task")) if isinstance(material, dict) else "?"


_SAID: set[str] = set()


def say_once(topic: str, message: str) -> None:
    """warn(), once per build (doit runs a build's steps as threads of one process)
    for each topic."""
    if topic not in _SAID:
        _SAID.add(topic)
        warn(message)


def warn(message: str) -> None:
    """Say on stderr, after "cache: ", what a cache could not do (the build goes on without it)."""
    print(f"cache: {message}", file=sys.stderr, flush=True)
