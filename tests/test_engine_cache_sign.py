"""Signed cache entries (toolchain/engine/cache/sign.py): a signature holds only for the key and
record it was made for, only a trusted key counts, a secret key is never replaced, and a bad key
is one line."""
from __future__ import annotations

import copy
import stat

import pytest

from toolchain.engine.cache import sign

RECORD = {"format": 2, "material": {"task": "compile:m/g@SM8750"},
          "outputs": {"build/m/g_qnn.bin": {"sha256": "a" * 64, "bytes": 10}}}


@pytest.fixture
def keys(tmp_path):
    return sign.keygen("ci-1", tmp_path / "keys"), sign.keygen("ci-1", tmp_path / "other")


def test_a_signature_holds_only_for_its_key_and_record_and_a_trusted_key(keys):
    (secret, public), (other_secret, other_public) = keys
    record = {**RECORD, "signatures": [sign.sign("k1", RECORD, str(secret))]}
    assert sign.signer("k1", record, (public,)) == "ci-1"
    assert sign.signer("k1", record, (other_public,)) is None   # the same name, another key
    assert sign.signer("k1", record, ()) is None                 # nothing trusted: nothing signed
    assert sign.signer("k2", record, (public,)) is None          # moved to another key
    edited = copy.deepcopy(record)
    edited["outputs"]["build/m/g_qnn.bin"]["sha256"] = "b" * 64
    assert sign.signer("k1", edited, (public,)) is None          # another binary
    forged = {**RECORD, "signatures": [sign.sign("k1", RECORD, str(other_secret))]}
    assert sign.signer("k1", forged, (public,)) is None          # signed, by a key nobody trusts
    both = {**RECORD, "signatures": [*forged["signatures"], *record["signatures"]]}
    assert sign.signer("k1", both, (public,)) == "ci-1"
    for junk in (None, "x", [1], [{"key": "ci-1", "sig": "!!"}]):
        assert sign.signer("k1", {**RECORD, "signatures": junk}, (public,)) is None


def test_keygen_writes_a_private_secret_and_never_replaces_one(keys, tmp_path):
    (secret, public), _ = keys
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert (tmp_path / "keys/ci-1.pub").read_text().strip() == public and sign.trusted_keys(
        public
    ) == (public,)
    before = secret.read_bytes()
    with pytest.raises(FileExistsError):
        sign.keygen("ci-1", tmp_path / "keys")
    assert secret.read_bytes() == before
    with pytest.raises(ValueError, match="letters, digits"):
        sign.keygen("../x", tmp_path / "keys")


def test_a_bad_key_is_one_line_that_never_repeats_a_secret(keys, tmp_path):
    (secret, public), _ = keys
    assert sign.check_secret(str(secret)) == str(secret)
    with pytest.raises(ValueError, match=r"^public key ci-1: not 32 bytes of base64"):
        sign.trusted_keys("ci-1:c2hvcnQ=")
    with pytest.raises(ValueError, match=r"is not <name>:<base64>"):
        sign.trusted_keys(f"{public},nonsense")
    (tmp_path / "pub-as-secret").write_text("ci-1:???\n")
    with pytest.raises(
        ValueError, match=r"^not a secret key written by python -m toolchain cache-key$"
    ):
        sign.check_secret(str(tmp_path / "pub-as-secret"))
    with pytest.raises(ValueError, match=r"^cannot read it \(FileNotFoundError\)$"):
        sign.check_secret(str(tmp_path / "missing"))


def test_cache_key_prints_what_goes_where_and_refuses_to_replace_a_key(tmp_path):
    import subprocess
    import sys

    def cache_key(*args):
        return subprocess.run(
            [sys.executable, "-m", "toolchain", "cache-key", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    made = cache_key("ci-2", "--out", str(tmp_path))
    public = (tmp_path / "ci-2.pub").read_text().strip()
    assert made.returncode == 0 and f"QNN_CACHE_SIGN_KEY={tmp_path / 'ci-2.secret'}" in made.stdout
    assert f"QNN_CACHE_TRUST={public}" in made.stdout and sign.trusted_keys(public)
    secret = (tmp_path / "ci-2.secret").read_text()
    assert secret.split(":")[1].strip() not in made.stdout   # the secret is never printed
    again = cache_key("ci-2", "--out", str(tmp_path))
    assert (
        again.returncode == 1
        and again.stderr.count("\n") == 1
        and "a key is never replaced" in again.stderr
    )
    assert (tmp_path / "ci-2.secret").read_text() == secret
