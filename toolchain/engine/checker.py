"""Content decides, always: doit's md5 checker trusts an unchanged mtime, so a file swapped with its mtime
kept (`cp -p`, `rsync -a`, `tar x`, `touch -r`) reruns nothing. This one re-hashes when the size differs
too, and with `doit rehash=1` (or QNN_REHASH=1) every time. Same state format as doit's: a build made
with the md5 checker stays up to date. A file is hashed once per run while its size and mtime stay: doit
hashes each task's dependencies for that task alone, and every compile and verify depends on the QNN
libraries (~220 MB), which cost 5.6 s of a 7 s warm-cache build before."""
from __future__ import annotations

import os

from doit import dependency, doit_cmd
from doit.dependency import get_file_md5

from toolchain.engine import files, outputs


def rehash_asked() -> bool:
    return (doit_cmd.get_var(outputs.VAR) or os.environ.get(outputs.ENV) or "") not in ("", "0")


class MD5Checker(dependency.MD5Checker):
    """doit's md5 checker, re-hashing on a size change too (and always with rehash). It keeps doit's class
    name on purpose: doit records the checker's name with every file dependency and treats another name
    as every file changed, which would rebuild every build made before."""

    def __init__(self):
        self.rehash = rehash_asked()

    def check_modified(self, file_path, file_stat, state):
        timestamp, size, file_md5 = state
        if file_stat.st_size != size:
            return True
        if file_stat.st_mtime == timestamp and not self.rehash:
            return False
        return file_md5 != md5(file_path, file_stat, fresh=self.rehash)

    def get_state(self, dep, current_state):
        st = os.stat(dep)
        if current_state and current_state[0] == st.st_mtime and current_state[1] == st.st_size and not self.rehash:
            return None   # unchanged: skip the hash
        return st.st_mtime, st.st_size, md5(dep, st, fresh=self.rehash)


_MEMO: dict[str, tuple[int, int, str]] = {}   # path -> (size, mtime_ns, md5), this run's hashes


def md5(path, st, fresh: bool = False) -> str:
    """doit's md5 of a file, once per process while its size and mtime (ns) stay what `st` says; `fresh`
    (rehash asked: a swap that kept both) reads the bytes regardless."""
    return files.memoized(_MEMO, path, get_file_md5, st, fresh)
