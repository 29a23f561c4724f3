"""A reader whose records are cached in a db file (Caffe2's
``caffe2.python.cached_reader``).

    cached = CachedReader(source_reader, db_path='/tmp/cache.db')
    session.run(cached.build_cache_step())   # reads the source once
    pipe(cached, out_dataset.writer())        # later reads come from the db

``build_cache_step`` does nothing when the db already exists (unless
``overwrite``), so a job can build its cache on first run only. The
default ``db_type`` is Caffe2's, ``'LevelDB'`` (a LevelDB directory).
"""

import os

from ferrocaffe import core
from ferrocaffe.db_file_reader import DBFileReader
from ferrocaffe.pipeline import pipe
from ferrocaffe.task import Cluster, TaskGroup

__all__ = ['CachedReader']


class CachedReader(DBFileReader):
    """A DBFileReader over ``db_path`` that can build its db from
    ``original_reader`` (whose schema it has).

    Args:
        original_reader: the reader the cache is built from.
        db_path: the cache db.
        db_type: its format (default 'LevelDB', as Caffe2).
        name, batch_size, loop_over: as for DBFileReader.
    """

    default_name_suffix = 'cached_reader'

    def __init__(self, original_reader, db_path, db_type='LevelDB', name=None,
                 batch_size=100, loop_over=False):
        if original_reader is None:
            raise ValueError("original_reader can't be None")
        self.original_reader = original_reader
        super().__init__(db_path, db_type, name, batch_size, loop_over)

    def _init_reader_schema(self, *args, **kwargs):
        # The source's schema is the cache's.
        return self.original_reader._schema

    def build_cache_step(self, overwrite=False):
        """A step that reads every record of the original reader (16
        threads) into the dataset and saves it to ``db_path``; an empty step
        when the db exists and ``overwrite`` is false."""
        if os.path.exists(self.db_path) and not overwrite:
            return core.execution_step('build_step', [])
        init_net = core.Net('init')
        self._init_field_blobs_as_empty(init_net)
        with Cluster(), core.NameScope(self.name), TaskGroup() as copy_tg:
            pipe(self.original_reader, self.ds.writer(), num_threads=16)
            copy_step = copy_tg.to_task().get_step()
        save_net = core.Net('save')
        save_net.Save(self.ds.get_blobs(), [], db=self.db_path,
                      db_type=self.db_type,
                      blob_name_overrides=self.ds.field_names(),
                      absolute_path=True)
        return core.execution_step('build_cache',
                                   [init_net, copy_step, save_net])
