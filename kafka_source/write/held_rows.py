"""A write task's rows, taken in full before any of them is written, and read again as often as
needed.

Spark hands a write task its rows once, as an iterator of Arrow batches. A task that must know
its rows before it writes them -- an exactly-once repair, which compares their digest with the
digests of a batch's committed transactions and writes nothing when they match
(:mod:`.exactly_once`) -- has to keep them. :class:`HeldRows` keeps up to ``memory_bytes`` of
Arrow in memory and writes the rest to an Arrow IPC stream file in a local directory of the
executor (Spark's ``SPARK_LOCAL_DIRS``, which it gives its Python workers for their temporary
files, as PySpark's own spilling uses them; else the system's temporary directory). The file is
read back memory-mapped, one batch at a time, so memory stays bounded however large the task;
it is deleted by :meth:`HeldRows.close`.

When the rows cannot be spilled (a full or unwritable disk), the task fails before anything is
written, with an error that names the directory: Spark's retry runs it again, elsewhere if it
can. Writing first and aborting the write when the rows turn out to be committed ones, as was
done before, leaves their records twice in the log for ``read_uncommitted`` readers.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from typing import Iterable, Iterator

import pyarrow as pa

from ..errors import KafkaSourceError

__all__ = ["HeldRows", "SpillError", "spill_directory"]


class SpillError(KafkaSourceError):
    """The rows a task must hold could not be written to local disk."""


def spill_directory() -> str:
    """The first of Spark's local directories for this worker (``SPARK_LOCAL_DIRS``) that
    exists, else the system's temporary directory."""
    for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(","):
        d = d.strip()
        if d and os.path.isdir(d):
            return d
    return tempfile.gettempdir()


class HeldRows:
    """Every batch of ``batches``, in order, iterable any number of times (see the module
    docstring). ``memory_bytes``: how much Arrow stays in memory before the rest is spilled."""

    def __init__(self, batches: Iterable[pa.RecordBatch], memory_bytes: int,
                 directory: str | None = None):
        self._memory: list[pa.RecordBatch] = []
        self.path: str | None = None       # the spill file, while there is one
        self.spilled_batches = 0
        self.spilled_bytes = 0
        size = 0
        it = iter(batches)
        for batch in it:
            if size + batch.nbytes > memory_bytes:
                self._spill(batch, it, directory or spill_directory())
                break
            self._memory.append(batch)
            size += batch.nbytes

    def _spill(self, first: pa.RecordBatch, rest: Iterator[pa.RecordBatch],
               directory: str) -> None:
        fd = None
        try:
            fd, self.path = tempfile.mkstemp(prefix="pykafka-held-rows-", suffix=".arrows",
                                             dir=directory)
            with os.fdopen(fd, "wb") as raw:
                fd = None
                with pa.ipc.new_stream(raw, first.schema) as writer:
                    for batch in itertools.chain((first,), rest):
                        if not batch.schema.equals(first.schema):
                            raise SpillError(
                                "A write task's Arrow batches changed their schema midway "
                                f"({first.schema} then {batch.schema}); they cannot be held.")
                        writer.write_batch(batch)
                        self.spilled_batches += 1
                        self.spilled_bytes += batch.nbytes
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            self.close()
            raise SpillError(
                f"Could not write a task's rows to local disk in {directory!r} (after "
                f"{self.spilled_bytes} bytes in {self.spilled_batches} batch(es)): {exc}. An "
                "exactly-once repair holds its rows before writing them, to recognise rows of "
                "a committed transaction; nothing was written. Free space there, or point "
                "spark.local.dir (SPARK_LOCAL_DIRS) at a disk that has it; Spark retries the "
                "task.") from exc
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        yield from self._memory
        if self.path is not None:
            with pa.memory_map(self.path) as source:
                yield from pa.ipc.open_stream(source)

    def close(self) -> None:
        """Delete the spill file, if any (the batches in memory stay readable)."""
        path, self.path = self.path, None
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "HeldRows":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
