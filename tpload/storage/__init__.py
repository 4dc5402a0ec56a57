"""Where a checkpoint's bytes are, and how a rank reads them.

Two storages share one small interface (:class:`~.base.Storage`): a native folder of
shards (:mod:`.sharded`) and a pre-partitioned export whose ranks each read
a file of their own (:mod:`.partitioned`). Both hand the planner a
:class:`~.catalogue.Catalogue` (names, dtypes, shapes) and read bytes with
``pread`` into buffers the caller owns (:mod:`.files` says why not maps); :mod:`.open` picks the
storage of a folder. This face imports nothing.
"""
