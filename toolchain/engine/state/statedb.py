"""doit state backend that commits after every write, so a killed build keeps what finished; an
environment fault (read-only folder, full disk, a lock) is one line saying what to do, never the
advice to delete a state DB that is healthy."""
import os
import sqlite3

from doit.dependency import DatabaseException, SqliteDB

from toolchain.engine.state import stamps


def explain(name: str, err: Exception) -> str:
    """What happened to the state DB `name`, in words a user can act on."""
    text = str(err)
    folder = os.path.dirname(os.path.abspath(name))
    if "readonly" in text or "read-only" in text or not os.access(folder, os.W_OK) or \
            (os.path.exists(name) and not os.access(name, os.W_OK)):
        return (
            f"{name}: cannot write the build state ({text}): {folder} or the file is read-only; "
            "make it "
            f"writable (chmod u+w) and run again. The state DB is intact: do not delete it."
        )
    if "disk is full" in text or "No space" in text:
        return (
            f"{name}: the disk is full ({text}): free space and run again; finished tasks are "
            "kept, "
            f"nothing needs cleaning."
        )
    if "locked" in text:
        return (f"{name}: locked by another process ({text}): let the other doit finish, then run "
                "again.")
    if "not a database" in text or "malformed" in text:
        return (
            f"{name}: damaged ({text}): move it aside (mv {name} {name}.bad) and run again; every "
            "task "
            f"then rebuilds once."
        )
    return f"{name}: {text}"


class SqliteSyncDB(SqliteDB):
    """doit's sqlite3 backend buffers until exit; this one commits each task's record at once."""

    def __init__(self, name, codec, *, module_name=None):
        try:
            super().__init__(name, codec, module_name=module_name)
            # A commit in WAL mode survives the process being killed (what this backend is
            # for) without an fsync each time (only an OS crash can lose the last ones): no-op
            # runs stay fast.
            self._conn.execute("pragma journal_mode=wal")
            self._conn.execute("pragma synchronous=normal")
        except (sqlite3.Error, DatabaseException) as err:
            raise DatabaseException(explain(name, err)) from None

    def set(self, task_id, dependency, value):
        before = self.codec.encode(self._cache[task_id]) if task_id in self._cache else None
        super().set(task_id, dependency, value)
        record = self.codec.encode(self._cache[task_id])
        try:
            if record != before:   # a no-op run re-saves group tasks unchanged: no write for those
                self._conn.execute("insert or replace into doit values (?,?)", (task_id, record))
            self._conn.commit()
        except sqlite3.Error as err:
            raise DatabaseException(explain(self.name, err)) from None
        self._dirty.discard(task_id)

    def dump(self):
        super().dump()
        stamps.save()   # the content memo of this run, beside the state (stamps.py)

    def remove(self, task_id):
        super().remove(task_id)
        self._conn.commit()

    def remove_all(self):
        super().remove_all()
        self._conn.commit()
