"""doit state backend that commits after every write, so a killed build keeps what finished."""
from doit.dependency import SqliteDB


class SqliteSyncDB(SqliteDB):
    """doit's sqlite3 backend buffers until exit; this one commits each task's record at once."""

    def set(self, task_id, dependency, value):
        super().set(task_id, dependency, value)
        self._conn.execute("insert or replace into doit values (?,?)",
                           (task_id, self.codec.encode(self._cache[task_id])))
        self._conn.commit()
        self._dirty.discard(task_id)

    def remove(self, task_id):
        super().remove(task_id)
        self._conn.commit()

    def remove_all(self):
        super().remove_all()
        self._conn.commit()
