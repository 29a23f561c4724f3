"""A reader of the records stored in a db file (Caffe2's
``caffe2.python.db_file_reader``).

A db written by Save (or ``CachedReader.build_cache_step``) holds one blob
per field of a record. ``DBFileReader`` loads them into a Dataset and reads
it in batches, in a shuffled order, once or endlessly (``loop_over``).

    reader = DBFileReader(db_path='/tmp/cache.db', db_type='minidb')
    pipe(reader, out_dataset.writer())

``db_type`` is one of ``workspace.C.registered_dbs()`` (``'ferro'``,
``'minidb'``, ``'leveldb'``/``'LevelDB'``); Caffe2's LMDB is not available.
"""

import os

from ferrocaffe import core, errors, scope, workspace
from ferrocaffe.dataio import Reader
from ferrocaffe.dataset import Dataset
from ferrocaffe.schema import from_column_list

__all__ = ['DBFileReader']


class DBFileReader(Reader):
    """Reads the records of the db at ``db_path``.

    Args:
        db_path: the db file (``~`` is expanded).
        db_type: its format, one of ``workspace.C.registered_dbs()``.
        name: prefix of the blobs holding the data (default
            ``'<db file name without extension>_db_file_reader'``).
        batch_size: records per read.
        loop_over: start again after the last record, endlessly.
        field_names: the record's fields, in schema order. Without them the
            db is loaded once now and its blob names, sorted, are the fields.
    """

    default_name_suffix = 'db_file_reader'

    def __init__(self, db_path, db_type, name=None, batch_size=100,
                 loop_over=False, field_names=None):
        if db_path is None:
            raise ValueError("db_path can't be None.")
        known = workspace.C.registered_dbs()
        if db_type not in known:
            raise errors.InvalidArgumentError(
                'db_type [{}] is not available. \nChoose one of these: {}.'
                .format(db_type, known))
        self.db_path = os.path.expanduser(os.fspath(db_path))
        self.db_type = db_type
        self.name = name or '{}_{}'.format(self._db_name(),
                                           self.default_name_suffix)
        self.batch_size = batch_size
        self.loop_over = loop_over
        super().__init__(self._init_reader_schema(field_names))
        self.ds = Dataset(self._schema, self.name + '_dataset')
        self.ds_reader = None

    def _db_name(self):
        """The db file's name without its extension: '/tmp/sample.db' ->
        'sample'."""
        return os.path.basename(self.db_path).rsplit('.', 1)[0]

    def _init_reader_schema(self, field_names=None):
        """The record schema: ``field_names`` if given, else the names of
        the blobs the db holds, in sorted order (loaded once, under a name
        scope of their own)."""
        if field_names:
            return from_column_list(field_names)
        with core.NameScope(self.name):
            prefix = scope.CurrentNameScope()
        workspace.RunOperatorOnce(core.CreateOperator(
            'Load', [], [], absolute_path=True, db=self.db_path,
            db_type=self.db_type, load_all=True, add_prefix=prefix))
        columns = [name[len(prefix):] for name in sorted(workspace.Blobs())
                   if name.startswith(prefix)]
        return from_column_list(columns)

    def setup_ex(self, init_net, finish_net):
        """Adds to ``init_net``, once, the loading of the db into the
        dataset and the set-up of a shuffled reader over it."""
        if self.ds_reader is not None:
            self.ds_reader.setup_ex(init_net, finish_net)
            return
        self._init_field_blobs_as_empty(init_net)
        self._feed_field_blobs_from_db_file(init_net)
        self.ds_reader = self.ds.random_reader(
            init_net, batch_size=self.batch_size, loop_over=self.loop_over)
        self.ds_reader.sort_and_shuffle(init_net)
        self.ds_reader.computeoffset(init_net)

    def read(self, read_net):
        if self.ds_reader is None:
            raise errors.InvalidPlanError(
                'DBFileReader: setup_ex must be called before read')
        return self.ds_reader.read(read_net)

    def _init_field_blobs_as_empty(self, init_net):
        with core.NameScope(self.name):
            self.ds.init_empty(init_net)

    def _feed_field_blobs_from_db_file(self, net):
        net.Load([], self.ds.get_blobs(), db=self.db_path,
                 db_type=self.db_type, absolute_path=True,
                 source_blob_names=self.ds.field_names())
