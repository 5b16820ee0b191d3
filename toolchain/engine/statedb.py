"""doit state backend that commits after every write, so a killed build keeps what finished."""
from doit.dependency import SqliteDB


class SqliteSyncDB(SqliteDB):
    """doit's sqlite3 backend buffers until exit; this one commits each task's record at once."""

    def __init__(self, name, codec, *, module_name=None):
        super().__init__(name, codec, module_name=module_name)
        # A commit in WAL mode survives the process being killed (what this backend is for) without
        # an fsync each time (only an OS crash can lose the last ones): no-op runs stay fast.
        self._conn.execute("pragma journal_mode=wal")
        self._conn.execute("pragma synchronous=normal")

    def set(self, task_id, dependency, value):
        before = self.codec.encode(self._cache[task_id]) if task_id in self._cache else None
        super().set(task_id, dependency, value)
        record = self.codec.encode(self._cache[task_id])
        if record != before:   # a no-op run re-saves group tasks unchanged: no write for those
            self._conn.execute("insert or replace into doit values (?,?)", (task_id, record))
        self._conn.commit()
        self._dirty.discard(task_id)

    def remove(self, task_id):
        super().remove(task_id)
        self._conn.commit()

    def remove_all(self):
        super().remove_all()
        self._conn.commit()
