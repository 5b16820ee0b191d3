"""Content decides, always: doit's md5 checker trusts an unchanged mtime, so a file swapped with its
mtime kept (`cp -p`, `rsync -a`, `tar x`, `touch -r`) reruns nothing. This one trusts the state only
while the file's whole stamp (size, mtime, ctime, inode: files.stamp) is the one seen when its md5
was last taken; a new ctime or inode means "read it", and the md5 decides. The stamps live in
build/.stamps.json (stamps.py); doit's state stays its own format, (mtime, size, md5), so a build
made with doit's checker stays up to date (its files are read once, the first run after, to learn
their stamps). `doit rehash=1` (or QNN_REHASH=1) reads every time (resolved once: for_run). A file
is hashed once per run while its stamp stays: doit hashes each task's dependencies for that task
alone, and every compile and verify depends on the QNN libraries (~220 MB)."""
from __future__ import annotations

import os

from doit import dependency
from doit.dependency import get_file_md5

from toolchain.engine import files
from toolchain.engine.state import stamps


def for_run(rehash: bool) -> type[MD5Checker]:
    """doit's `check_file_uptodate` for this run (doit makes it with no argument): `rehash` as
    resolved at load."""
    return type("MD5Checker", (MD5Checker,), {"rehash": rehash})


class MD5Checker(dependency.MD5Checker):
    """doit's md5 checker, re-hashing on a size change too (and always with rehash). It keeps doit's
    class name on purpose: doit records the checker's name with every file dependency and treats
    another name as every file changed, which would rebuild every build made before."""
    rehash = False   # for_run() makes the class of a run that asked for it

    def check_modified(self, file_path, file_stat, state):
        timestamp, size, file_md5 = state
        if file_stat.st_size != size:
            return True
        if (
            file_stat.st_mtime == timestamp
            and not self.rehash
            and _seen(file_path, file_stat, file_md5)
        ):
            return False
        return file_md5 != md5(file_path, file_stat, fresh=self.rehash)

    def get_state(self, dep, current_state):
        st = os.stat(dep)
        if (current_state and current_state[0] == st.st_mtime and current_state[1] == st.st_size
                and not self.rehash and _seen(dep, st, current_state[2])):
            return None   # unchanged: skip the hash
        return st.st_mtime, st.st_size, md5(dep, st, fresh=self.rehash)


_MEMO: dict[str, tuple] = {}   # path -> (stamp, md5), this run's hashes


def md5(path, st, fresh: bool = False) -> str:
    """doit's md5 of a file, once per process while its stamp stays what `st` says; `fresh`
    (rehash asked) reads the bytes regardless. Each md5 taken is remembered with the stamp it was
    taken at (stamps.py)."""
    value = files.memoized(_MEMO, path, get_file_md5, st, fresh)
    stamps.learn("md5", path, st, value)
    return value


def _seen(path, st, digest: str) -> bool:
    return stamps.seen("md5", path, st, digest)
