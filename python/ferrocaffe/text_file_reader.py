"""``TextFileReader``: reads a tab-separated text file, one row per line,
as batches of a schema's columns (Caffe2's ``caffe2.python.text_file_reader``,
over the ops ``CreateTextFileReader`` and ``TextFileReaderRead``)."""

from ferrocaffe import core
from ferrocaffe.dataio import Reader
from ferrocaffe.schema import Scalar, Struct, data_type_for_dtype

__all__ = ["TextFileReader"]


class TextFileReader(Reader):
    """A reader of the rows of ``filename``: each line holds one field per
    column of ``schema`` (a ``Struct`` of ``Scalar`` string and number
    fields), separated by tabs; a backslash escapes the next character.
    The init net creates the reader; each read takes up to ``batch_size``
    rows, over ``num_passes`` passes, and the read's stop blob is set once a
    read comes back empty."""

    def __init__(self, init_net, filename, schema, num_passes=1, batch_size=1):
        if not isinstance(schema, Struct):
            raise TypeError("TextFileReader's schema must be a schema.Struct")
        for name, child in schema.get_children():
            if not isinstance(child, Scalar):
                raise TypeError(
                    "TextFileReader reads scalar fields only; field %r is not a Scalar" % name)
        Reader.__init__(self, schema)
        field_types = [data_type_for_dtype(t) for t in schema.field_types()]
        self._reader = init_net.CreateTextFileReader(
            [], filename=filename, num_passes=num_passes, field_types=field_types)
        self._batch_size = batch_size

    def read(self, net):
        """Adds the read of one batch to ``net``: ``(should_stop, blobs)``."""
        blobs = net.TextFileReaderRead(
            [self._reader], len(self.schema().field_names()), batch_size=self._batch_size)
        if isinstance(blobs, core.BlobReference):
            blobs = [blobs]
        should_stop = net.IsEmpty(
            [blobs[0]], core.ScopedBlobReference(net.NextName("should_stop")))
        return should_stop, blobs
