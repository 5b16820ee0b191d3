"""Signed cache entries, as Nix signs its binary caches: a writer holding a secret key (CI) signs
each entry it stores; a reader given public keys (`cache_trust`) restores only entries one of them
signed. A key is text, `<name>:<base64 of 32 bytes>` (ed25519, the `cryptography` package); the
secret key lives in a file of its own (mode 0600) that only the machines that upload hold.

What is signed: a fixed prefix and the canonical JSON of the entry's key and record (format,
material, outputs), so a signature neither moves to another key nor survives an edited byte count
or hash. `cryptography` is imported only when an entry is signed or checked: a no-op `doit` never
pays for it."""
from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
from pathlib import Path

DOMAIN = b"qnn-npu-compile cache entry 1\n"
NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# the fields of an entry a signature covers (with its key)
SIGNED = ("format", "material", "outputs")


def keygen(name: str, folder: str | Path) -> tuple[Path, str]:
    """A new key pair: <folder>/<name>.secret (mode 0600, never overwritten) and
    <folder>/<name>.pub; returns the secret's path and the public key's text."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    if not NAME.match(name):
        raise ValueError(f"key name {name!r}: letters, digits, '.', '_' and '-' only (at most 64)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    secret, public = folder / f"{name}.secret", folder / f"{name}.pub"
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    text = f"{name}:{base64.b64encode(raw).decode()}"
    # O_EXCL: an existing secret is never replaced (its public key may be trusted somewhere)
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{name}:{base64.b64encode(seed).decode()}\n")
    public.write_text(text + "\n")
    return secret, text


def _split(text: str, what: str) -> tuple[str, bytes]:
    name, colon, encoded = text.strip().partition(":")
    if not colon or not NAME.match(name):
        raise ValueError(
            f"{what} {_short(text)!r} is not <name>:<base64> (python -m toolchain cache-key makes "
            "one)"
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            f"{what} {name}: not 32 bytes of base64 (python -m toolchain cache-key makes one)"
        )
    return name, raw


def _short(text: str) -> str:
    return text if len(text) <= 24 else text[:20] + "…"


def trusted_keys(text: str) -> tuple[str, ...]:
    """`cache_trust`: public keys, comma separated; ValueError names the bad one."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    for one in keys:
        _split(one, "public key")
    return keys


def check_secret(path: str) -> str:
    """`cache_sign_key`: the file of a secret key; ValueError says what is wrong
    (never its content)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read it ({type(err).__name__})") from None
    try:
        _split(text, "secret key")
    except ValueError:
        raise ValueError("not a secret key written by python -m toolchain cache-key") from None
    return path


@functools.cache
def _secret(path: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    name, seed = _split(Path(path).read_text(), "secret key")
    return name, Ed25519PrivateKey.from_private_bytes(seed)


def message(key: str, record: dict) -> bytes:
    """The bytes a signature covers: the prefix, then the entry's key and signed fields
    as canonical JSON."""
    covered = {"key": key, **{field: record.get(field) for field in SIGNED}}
    return DOMAIN + json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()


def sign(key: str, record: dict, secret_path: str) -> dict:
    """{"key": name, "sig": base64}: the signature of `record` stored under `key` by the
    secret key's holder."""
    name, secret = _secret(secret_path)
    return {"key": name, "sig": base64.b64encode(secret.sign(message(key, record))).decode()}


def signer(key: str, record: dict, trusted: tuple[str, ...]) -> str | None:
    """The name of a trusted key whose signature on `record` (stored under `key`) holds; None
    when none does."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    signatures = record.get("signatures")
    if not trusted or not isinstance(signatures, list):
        return None
    keys = dict(_split(text, "public key") for text in trusted)
    signed = message(key, record)
    for one in signatures:
        if (
            not isinstance(one, dict)
            or one.get("key") not in keys
            or not isinstance(one.get("sig"), str)
        ):
            continue
        try:
            Ed25519PublicKey.from_public_bytes(keys[one["key"]]).verify(
                base64.b64decode(one["sig"]), signed
            )
        except (InvalidSignature, binascii.Error, ValueError):
            continue
        return one["key"]
    return None
