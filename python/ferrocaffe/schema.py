"""Records: typed, nested descriptions of columnar data (Caffe2's
``caffe2.python.schema``).

A schema is a tree of :class:`Field` objects whose leaves are
:class:`Scalar` columns.  Every leaf maps to exactly one tensor:

* ``Scalar(dtype)`` is one column; the first dimension of its tensor is the
  number of entries in the domain it lives in.
* ``Struct(('a', ...), ('b', ...))`` groups named fields that share one
  domain.  Names may be nested with ``:`` (``'a:b'``).
* ``List(values)`` is a variable-length list: an int32 ``lengths`` column in
  the parent domain plus the ``values`` field in the domain of the items.
* ``Map(keys, values)`` is a ``List`` of ``Struct(keys, values)``.

A field may carry its data: each Scalar holds either a ``BlobReference``
(the column lives in a workspace) or a numpy array.  Such a field is called a
*record*; ``NewRecord``, ``FeedRecord``, ``FetchRecord``, ``ConstRecord`` and
``InitEmptyRecord`` turn schemas into records and move data in and out.

Fields are flattened in depth-first order: ``field_names()``,
``field_types()``, ``field_metadata()`` and ``field_blobs()`` all list the
leaves in the same order, e.g. ``['uid', 'tags:lengths', 'tags:values']``.
"""

import logging
from collections import OrderedDict, namedtuple
from io import StringIO
from itertools import islice

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.core import BlobReference

logger = logging.getLogger(__name__)

__all__ = [
    'FIELD_SEPARATOR', 'Metadata', 'FeatureSpec', 'Field', 'Scalar', 'Struct',
    'List', 'ListWithEvicted', 'Map', 'MapWithEvicted', 'NamedTuple', 'Tuple',
    'RawTuple', 'from_dtype', 'from_column_list', 'from_blob_list',
    'as_record', 'FetchRecord', 'FeedRecord', 'NewRecord', 'ConstRecord',
    'InitEmptyRecord', 'is_schema_subset', 'equal_schemas', 'schema_check',
    'data_type_for_dtype', 'dtype_for_core_type', 'attach_metadata_to_scalars',
]

FIELD_SEPARATOR = ':'

_STRING_TYPES = (str, bytes)


def _join_field_name(prefix, suffix):
    return FIELD_SEPARATOR.join(part for part in (prefix, suffix) if part)


def _normalize_field(field_or_type_or_blob, keep_blobs=True):
    """What containers store for a child given as a Field (a copy), a type
    (an empty Scalar of that type) or a value (a Scalar holding it)."""
    value = field_or_type_or_blob
    if isinstance(value, Field):
        return value.clone(keep_blobs=keep_blobs)
    if type(value) in (type, np.dtype):
        return Scalar(dtype=value)
    return Scalar(blob=value)


FeatureSpec = namedtuple(
    'FeatureSpec',
    ['feature_type', 'feature_names', 'feature_ids', 'feature_is_request_only',
     'desired_hash_size', 'feature_to_index'])
FeatureSpec.__new__.__defaults__ = (None,) * 6


class Metadata(namedtuple(
        'Metadata', ['categorical_limit', 'expected_value', 'feature_specs'])):
    """Extra facts about a Scalar column.

    ``categorical_limit``: for a non-negative integer column, one more than
    the largest possible value (e.g. an embedding table size).
    ``expected_value``: the anticipated average value (e.g. of list lengths).
    ``feature_specs``: a :class:`FeatureSpec` describing the features held.
    """
    __slots__ = ()


Metadata.__new__.__defaults__ = (None, None, None)


class Field(object):
    """Abstract node of a schema tree."""

    def __init__(self, children):
        """Subclasses call this once their children exist."""
        self._parent = (None, 0)
        self._field_offsets = [0]
        for child in children:
            self._field_offsets.append(
                self._field_offsets[-1] + len(child.field_names()))

    # -- the flattened view ----------------------------------------------

    def field_names(self):
        """The leaf names, depth first, joined with ``:``."""
        raise NotImplementedError('Field is an abstract class.')

    def field_types(self):
        """The numpy dtype of each leaf."""
        raise NotImplementedError('Field is an abstract class.')

    def field_metadata(self):
        """The Metadata (or None) of each leaf."""
        raise NotImplementedError('Field is an abstract class.')

    def field_blobs(self):
        """The value (BlobReference or ndarray) of each leaf; asserts if a
        leaf has none."""
        raise NotImplementedError('Field is an abstract class.')

    def all_scalars(self):
        """The Scalar leaves, in field_names() order."""
        raise NotImplementedError('Field is an abstract class.')

    def has_blobs(self):
        """True if every leaf holds a value."""
        raise NotImplementedError('Field is an abstract class.')

    def clone(self, keep_blobs=True):
        """A deep copy; with ``keep_blobs=False`` the leaves are emptied."""
        raise NotImplementedError('Field is an abstract class.')

    def clone_schema(self):
        return self.clone(keep_blobs=False)

    # core.Net's record methods call these two: core sits below this module
    # and never imports it.

    def _new_record(self, net):
        """:func:`NewRecord` of this schema in ``net``."""
        return NewRecord(net, self)

    def _with_blobs(self, values):
        """:func:`from_blob_list` of this schema and ``values``."""
        return from_blob_list(self, values)

    # -- position inside the parent ----------------------------------------

    def _set_parent(self, parent, relative_id):
        self._parent = (parent, relative_id)

    def _child_base_id(self, child_index=None):
        """Index, in the root's flattened list, of this field's first leaf
        (or of its ``child_index``-th child's first leaf)."""
        parent, index_in_parent = self._parent
        pos = 0 if child_index is None else self._field_offsets[child_index]
        if parent:
            pos += parent._child_base_id(index_in_parent)
        return pos

    def slice(self):
        """The slice of the root's flattened lists that this field covers:
        ``root.field_blobs()[s.b.slice()]`` are the blobs of field ``b``."""
        base = self._child_base_id()
        return slice(base, base + len(self.field_names()))

    # -- comparison and printing -------------------------------------------

    def __eq__(self, other):
        """Two schemas are equal when their names, types and metadata are;
        the values held are not compared."""
        if not isinstance(other, Field):
            return NotImplemented
        return (self.field_names() == other.field_names()
                and self.field_types() == other.field_types()
                and self.field_metadata() == other.field_metadata())

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = object.__hash__

    def _pprint_impl(self, indent, str_buffer):
        raise NotImplementedError('Field is an abstract class.')

    def __repr__(self):
        buf = StringIO()
        self._pprint_impl(0, buf)
        return buf.getvalue()


class List(Field):
    """A variable-length list: ``lengths`` (int32, one entry per list in the
    parent domain) and ``values`` (one entry per item, sum(lengths) in all).

    If ``values`` is a Struct, its fields can be reached directly:
    ``List(Struct(('a', int)))).a`` is the ``a`` Scalar of the items.
    """

    def __init__(self, values, lengths_blob=None):
        if isinstance(lengths_blob, Field):
            assert isinstance(lengths_blob, Scalar)
            self.lengths = _normalize_field(lengths_blob)
        else:
            self.lengths = Scalar(np.int32, lengths_blob)
        self._items = _normalize_field(values)
        self.lengths._set_parent(self, 0)
        self._items._set_parent(self, 1)
        Field.__init__(self, [self.lengths, self._items])

    def field_names(self):
        return ['lengths'] + [
            _join_field_name('values', name)
            for name in self._items.field_names()]

    def field_types(self):
        return self.lengths.field_types() + self._items.field_types()

    def field_metadata(self):
        return self.lengths.field_metadata() + self._items.field_metadata()

    def field_blobs(self):
        return self.lengths.field_blobs() + self._items.field_blobs()

    def all_scalars(self):
        return self.lengths.all_scalars() + self._items.all_scalars()

    def has_blobs(self):
        return self.lengths.has_blobs() and self._items.has_blobs()

    def clone(self, keep_blobs=True):
        return type(self)(
            _normalize_field(self._items, keep_blobs=keep_blobs),
            _normalize_field(self.lengths, keep_blobs=keep_blobs))

    def _pprint_impl(self, indent, str_buffer):
        pad = '  ' * indent
        str_buffer.write(pad + 'List(\n')
        str_buffer.write(pad + '  lengths=\n')
        self.lengths._pprint_impl(indent + 2, str_buffer)
        str_buffer.write(pad + '  _items=\n')
        self._items._pprint_impl(indent + 2, str_buffer)
        str_buffer.write(pad + ')\n')

    def __getattr__(self, item):
        if item.startswith('__') or item in ('_items', 'lengths'):
            raise AttributeError(item)
        items = self.__dict__.get('_items')
        if isinstance(items, Struct):
            return getattr(items, item)
        if item in ('value', 'items'):
            return items
        raise AttributeError('Field not found in list: %s.' % item)

    def __getitem__(self, item):
        head, sep, rest = item.partition(FIELD_SEPARATOR)
        if not sep:
            if item == 'lengths':
                return self.lengths
            if item == 'values':
                return self._items
        elif head == 'values':
            return self._items[rest]
        raise KeyError('Field not found in list: %s.' % item)


class ListWithEvicted(List):
    """A List with an extra int64 ``_evicted_values`` column (LRU hashing)."""

    def __init__(self, values, lengths_blob=None, evicted_values=None):
        if isinstance(evicted_values, Field):
            assert isinstance(evicted_values, Scalar)
            self._evicted_values = _normalize_field(evicted_values)
        else:
            self._evicted_values = Scalar(np.int64, evicted_values)
        List.__init__(self, values, lengths_blob=lengths_blob)

    def field_names(self):
        return List.field_names(self) + ['_evicted_values']

    def field_types(self):
        return List.field_types(self) + self._evicted_values.field_types()

    def field_metadata(self):
        return (List.field_metadata(self)
                + self._evicted_values.field_metadata())

    def field_blobs(self):
        return List.field_blobs(self) + self._evicted_values.field_blobs()

    def all_scalars(self):
        return List.all_scalars(self) + self._evicted_values.all_scalars()

    def has_blobs(self):
        return List.has_blobs(self) and self._evicted_values.has_blobs()

    def clone(self, keep_blobs=True):
        return type(self)(
            _normalize_field(self._items, keep_blobs=keep_blobs),
            _normalize_field(self.lengths, keep_blobs=keep_blobs),
            _normalize_field(self._evicted_values, keep_blobs=keep_blobs))

    def _pprint_impl(self, indent, str_buffer):
        pad = '  ' * indent
        str_buffer.write(pad + 'ListWithEvicted(\n')
        str_buffer.write(pad + '  lengths=\n')
        self.lengths._pprint_impl(indent + 2, str_buffer)
        str_buffer.write(pad + '  _items=\n')
        self._items._pprint_impl(indent + 2, str_buffer)
        str_buffer.write(pad + '  _evicted_values=\n')
        self._evicted_values._pprint_impl(indent + 2, str_buffer)
        str_buffer.write(pad + ')\n')

    def __getattr__(self, item):
        if item == '_evicted_values':
            raise AttributeError(item)
        return List.__getattr__(self, item)

    def __getitem__(self, item):
        if item == '_evicted_values':
            return self._evicted_values
        return List.__getitem__(self, item)


class Struct(Field):
    """Named fields sharing one domain.

    ``Struct(('a', Scalar()), ('b:c', Scalar()), ('b', Struct(('d', int))))``
    nests ``b:c`` into a ``b`` Struct and merges it with the later ``b``, so
    the field names are ``['a', 'b:c', 'b:d']``.  Fields are reached as
    ``s.a``, ``s['b:c']``, ``s[0]`` or ``s[['a', 'b']]``.  A Struct is
    immutable once built; ``+`` merges two Structs and ``-`` removes fields.
    """

    def __init__(self, *fields):
        for field in fields:
            assert len(field) == 2
            assert field[0], 'Field names cannot be empty'
            assert field[0] != 'lengths', (
                'Struct cannot contain a field named `lengths`.')
        self.fields = OrderedDict()
        for name, field in fields:
            field = _normalize_field(field)
            if FIELD_SEPARATOR in name:
                name, field = self._struct_from_nested_name(name, field)
            if name not in self.fields:
                self.fields[name] = field
                continue
            existing = self.fields[name]
            if not (isinstance(field, Struct) and isinstance(existing, Struct)):
                raise ValueError('Duplicate field name: %s' % name)
            self.fields[name] = existing + field
        for index, field in enumerate(self.fields.values()):
            field._set_parent(self, index)
        Field.__init__(self, self.fields.values())
        self._frozen = True

    @staticmethod
    def _struct_from_nested_name(nested_name, field):
        """('a:b:c', f) -> ('a', Struct(('b', Struct(('c', f)))))."""
        parts = nested_name.split(FIELD_SEPARATOR)
        assert len(parts) >= 2
        for part in reversed(parts[1:]):
            field = Struct((part, field))
        return parts[0], field

    def get_children(self):
        return list(self.fields.items())

    def field_names(self):
        names = []
        for name, field in self.fields.items():
            names.extend(_join_field_name(name, sub)
                         for sub in field.field_names())
        return names

    def field_types(self):
        return [t for f in self.fields.values() for t in f.field_types()]

    def field_metadata(self):
        return [m for f in self.fields.values() for m in f.field_metadata()]

    def field_blobs(self):
        return [b for f in self.fields.values() for b in f.field_blobs()]

    def all_scalars(self):
        return [s for f in self.fields.values() for s in f.all_scalars()]

    def has_blobs(self):
        return all(f.has_blobs() for f in self.fields.values())

    def clone(self, keep_blobs=True):
        return type(self)(*[
            (name, _normalize_field(field, keep_blobs=keep_blobs))
            for name, field in self.fields.items()])

    def _get_field_by_nested_name(self, nested_name):
        head, sep, rest = nested_name.partition(FIELD_SEPARATOR)
        field = self.fields.get(head)
        if field is None or not sep:
            return field
        try:
            return field[rest]
        except (KeyError, TypeError):
            return None

    def _pprint_impl(self, indent, str_buffer):
        pad = '  ' * indent
        str_buffer.write(pad + 'Struct( \n')
        for name, field in self.fields.items():
            str_buffer.write(pad + '  {}=\n'.format(name))
            field._pprint_impl(indent + 2, str_buffer)
        str_buffer.write(pad + ') \n')

    def __contains__(self, item):
        return self._get_field_by_nested_name(item) is not None

    def __len__(self):
        return len(self.fields)

    def __getitem__(self, item):
        """A nested name (``'a:b'``), a top-level index, or a list/tuple of
        those (giving a new Struct of the selected fields)."""
        if isinstance(item, (list, tuple)):
            keys = list(self.fields.keys())
            return Struct(*[
                (keys[k] if isinstance(k, int) else k, self[k]) for k in item])
        if isinstance(item, int):
            return next(islice(self.fields.values(), item, None))
        field = self._get_field_by_nested_name(item)
        if field is None:
            raise KeyError('field "%s" not found' % (item))
        return field

    def get(self, item, default_value):
        """``getattr(self, item, default_value)``."""
        return getattr(self, item, default_value)

    def __getattr__(self, item):
        if item.startswith('__'):
            raise AttributeError(item)
        fields = self.__dict__.get('fields')
        if fields is None or item not in fields:
            raise AttributeError(item)
        return fields[item]

    def __setattr__(self, key, value):
        # Fields cannot be replaced once built: that would break the parent
        # offsets.  Private state (e.g. _parent) can still be set.
        if self.__dict__.get('_frozen') and not key.startswith('_'):
            raise TypeError('Struct.__setattr__() is disabled after __init__()')
        object.__setattr__(self, key, value)

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __add__(self, other):
        """Union of the fields; Structs under a common name merge
        recursively, any other common name is a TypeError."""
        if not isinstance(other, Struct):
            return NotImplemented
        children = OrderedDict(self.get_children())
        for name, right in other.get_children():
            if name not in children:
                children[name] = right
                continue
            left = children[name]
            if not (isinstance(left, Struct) and isinstance(right, Struct)):
                raise TypeError(
                    'Type of left_field, ' + str(type(left)) +
                    ', and type of right_field, ' + str(type(right)) +
                    ', must both the Struct to allow merging of the field, ' +
                    name)
            children[name] = left + right
        return Struct(*children.items())

    def __sub__(self, other):
        """``self`` without the fields named in ``other`` (recursively for
        Structs; a Struct left empty is dropped).  A common name with
        different field types is a TypeError."""
        if not isinstance(other, Struct):
            return NotImplemented
        children = OrderedDict(self.get_children())
        for name, right in other.get_children():
            if name not in children:
                continue
            left = children[name]
            if type(left) != type(right):
                raise TypeError(
                    'Type of left_field, ' + str(type(left)) +
                    ', is not the same as that of right_field, ' +
                    str(type(right)) +
                    ', yet they have the same field name, ' + name)
            if isinstance(left, Struct):
                rest = left - right
                if rest.get_children():
                    children[name] = rest
                    continue
            children.pop(name)
        return Struct(*children.items())


class Scalar(Field):
    """A leaf: one tensor whose first dimension is the domain size.

    ``Scalar(np.float32)`` is a vector of floats; ``Scalar((np.int32, 5))``
    a (L, 5) matrix; ``Scalar()`` a column of unknown type (``np.void``).

    The value (``blob``) is a BlobReference or numpy data (converted with
    ``np.array``; a bare number becomes a 1-element vector).  A str is
    refused as ambiguous.  ``scalar()`` returns the value.
    """

    def __init__(self, dtype=None, blob=None, metadata=None):
        self._metadata = None
        self.set(dtype, blob, metadata, unsafe=True)
        Field.__init__(self, [])

    def field_names(self):
        return ['']

    def field_type(self):
        return self.dtype

    def field_types(self):
        return [self.dtype]

    def field_metadata(self):
        return [self._metadata]

    def has_blobs(self):
        return self._blob is not None

    def field_blobs(self):
        assert self._blob is not None, 'Value is not set for this field.'
        return [self._blob]

    def all_scalars(self):
        return [self]

    def clone(self, keep_blobs=True):
        return Scalar(dtype=self._original_dtype,
                      blob=self._blob if keep_blobs else None,
                      metadata=self._metadata)

    def get(self):
        """The value of this Scalar."""
        assert self._blob is not None, 'Value is not set for this field.'
        return self._blob

    def __call__(self):
        return self.get()

    @property
    def metadata(self):
        return self._metadata

    def set_metadata(self, value):
        assert isinstance(value, Metadata), (
            'metadata must be Metadata, got {}'.format(type(value)))
        self._metadata = value
        self._validate_metadata()

    def _validate_metadata(self):
        if self._metadata is None:
            return
        if (self._metadata.categorical_limit is not None
                and self.dtype is not None):
            assert np.issubdtype(self.dtype, np.integer), (
                '`categorical_limit` can be specified only in integral '
                'fields but got {}'.format(self.dtype))

    def set_value(self, blob, throw_on_type_mismatch=False, unsafe=False):
        """Replaces the value only, keeping the declared type."""
        if self.dtype.base != np.void and throw_on_type_mismatch:
            assert isinstance(blob, np.ndarray), 'Got {!r}'.format(blob)
            assert blob.dtype.base == self.dtype.base, (
                'Expected {}, got {}'.format(self.dtype.base, blob.dtype.base))
        self.set(dtype=self._original_dtype, blob=blob, unsafe=unsafe)

    def set(self, dtype=None, blob=None, metadata=None, unsafe=False):
        """Sets the type and/or value (see the class doc).

        Scalars are meant to be immutable: call this only on a Scalar you
        just created, with ``unsafe=True``; otherwise a warning is logged.
        Without ``dtype`` the type is inferred from an ndarray value's inner
        shape, or left as ``np.void``.
        """
        if not unsafe:
            logger.warning(
                'Scalar should be considered immutable. Only call Scalar.set() '
                'on newly created Scalar with unsafe=True. This will become an '
                'error soon.')
        if blob is not None and isinstance(blob, _STRING_TYPES):
            raise ValueError(
                'Passing str blob to Scalar.set() is ambiguous. '
                'Do either set(blob=np.array(blob)) or '
                'set(blob=BlobReference(blob))')

        self._original_dtype = dtype
        # np.dtype((t, 1)) would collapse to a plain t: keep the inner dim.
        if isinstance(dtype, tuple) and dtype[1] == 1:
            dtype = (dtype[0], (1,))
        if dtype is not None:
            if isinstance(dtype, tuple) and dtype[0] == np.void:
                raise TypeError(
                    'Cannot set the Scalar with type {} for blob {}.'
                    'If this blob is the output of some operation, '
                    'please verify the input of that operation has '
                    'proper type.'.format(dtype, blob))
            dtype = np.dtype(dtype)

        if blob is not None and not isinstance(blob, BlobReference):
            # actual data: make it an ndarray of the declared type
            was_array = isinstance(blob, np.ndarray)
            if dtype is not None and dtype != np.void:
                blob = np.array(blob, dtype=dtype.base)
                if blob.size == 0 and not was_array:
                    blob = blob.reshape((0,) + dtype.shape)
            else:
                assert isinstance(blob, np.ndarray), (
                    'Invalid blob type: %s' % str(type(blob)))
            if blob.ndim == 0 and not was_array:
                blob = blob.reshape((1,))
            # the inner shape of the data refines the declared type
            if blob.ndim > 1 and dtype is not None and dtype.base != np.void:
                dtype = np.dtype((dtype.base, blob.shape[1:]))
        if dtype is None:
            dtype = np.dtype(np.void)
        assert not dtype.fields, (
            'Cannot create Scalar with a structured dtype. '
            'Use from_dtype instead.')
        self.dtype = dtype
        self._blob = blob
        if metadata is not None:
            self.set_metadata(metadata)
        self._validate_metadata()

    def set_type(self, dtype):
        self._original_dtype = dtype
        self.dtype = np.dtype(np.void if dtype is None else dtype)
        self._validate_metadata()

    def _pprint_impl(self, indent, str_buffer):
        str_buffer.write('  ' * indent + 'Scalar({!r}, {!r}, {!r})\n'.format(
            self.dtype, self._blob, self._metadata))

    def id(self):
        """This leaf's index in the root's flattened lists (the position of
        its blob in what readers return and writers take)."""
        return self._child_base_id()


def Map(keys, values, keys_name='keys', values_name='values',
        lengths_blob=None):
    """A List of ``Struct((keys_name, keys), (values_name, values))``."""
    return List(Struct((keys_name, keys), (values_name, values)),
                lengths_blob=lengths_blob)


def MapWithEvicted(keys, values, keys_name='keys', values_name='values',
                   lengths_blob=None, evicted_values=None):
    """Map with an ``_evicted_values`` column."""
    return ListWithEvicted(Struct((keys_name, keys), (values_name, values)),
                           lengths_blob=lengths_blob,
                           evicted_values=evicted_values)


def NamedTuple(name_prefix, *fields):
    """A Struct whose fields are named ``<name_prefix>_<i>``."""
    return Struct(*[('%s_%d' % (name_prefix, i), field)
                    for i, field in enumerate(fields)])


def Tuple(*fields):
    """A Struct with fields ``field_0``, ``field_1``, ..."""
    return NamedTuple('field', *fields)


def RawTuple(num_fields, name_prefix='field'):
    """A tuple of ``num_fields`` untyped Scalars."""
    assert isinstance(num_fields, int)
    assert num_fields >= 0
    return NamedTuple(name_prefix, *([np.void] * num_fields))


def from_dtype(dtype, _outer_shape=()):
    """The schema of a numpy dtype: a Scalar, or a Struct for a structured
    dtype (fields with byte offsets are not supported)."""
    if not isinstance(dtype, np.dtype):
        shape = _outer_shape
        dtype = np.dtype((dtype, _outer_shape))
    else:
        shape = _outer_shape + dtype.shape
        if shape != dtype.shape:
            dtype = np.dtype((dtype.base, shape))
    if not dtype.fields:
        return Scalar(dtype)
    struct_fields = []
    # Caffe2 bug fixed: it iterated the names only and extended the list
    # with the pair's items.
    for name in dtype.names:
        fdtype, offset = dtype.fields[name][:2]
        assert offset == 0, 'Fields with byte offsets are not supported.'
        struct_fields.append((name, from_dtype(fdtype, _outer_shape=shape)))
    return Struct(*struct_fields)


class _SchemaNode(object):
    """A node of the tree from_column_list builds from the column names."""

    def __init__(self, name, type_str=''):
        self.name = name
        self.children = []
        self.type_str = type_str
        self.field = None

    def add_child(self, name, type_str=''):
        for child in self.children:
            if child.name == name and child.type_str == type_str:
                return child
        child = _SchemaNode(name, type_str)
        self.children.append(child)
        return child

    def get_field(self):
        if not self.children or self.field is not None:
            return Struct() if self.field is None else self.field
        by_name = OrderedDict((c.name, c) for c in self.children)
        names = set(by_name)
        if names == {'lengths', 'values'}:
            self.field = List(by_name['values'].get_field(),
                              lengths_blob=by_name['lengths'].get_field())
            self.type_str = 'List'
        elif names == {'lengths', 'keys', 'values'}:
            self.field = Map(by_name['keys'].get_field(),
                             by_name['values'].get_field(),
                             lengths_blob=by_name['lengths'].get_field())
            self.type_str = 'Map'
        else:
            self.field = Struct(*[(c.name, c.get_field())
                                  for c in self.children])
            self.type_str = 'Struct'
        return self.field

    def print_recursively(self):
        for child in self.children:
            child.print_recursively()
        logger.info('Printing node: Name and type')
        logger.info(self.name)
        logger.info(self.type_str)


def from_column_list(col_names, col_types=None, col_blobs=None,
                     col_metadata=None):
    """A schema from flattened column names (``'a'``, ``'b:lengths'``,
    ``'b:values'``...), optionally with types, values and metadata."""
    n = len(col_names)
    col_types = [None] * n if col_types is None else col_types
    col_metadata = [None] * n if col_metadata is None else col_metadata
    col_blobs = [None] * n if col_blobs is None else col_blobs
    assert n == len(col_types), (
        'col_names and col_types must have the same length.')
    assert n == len(col_metadata), (
        'col_names and col_metadata must have the same length.')
    assert n == len(col_blobs), (
        'col_names and col_blobs must have the same length.')
    root = _SchemaNode('root', 'Struct')
    for col_name, col_type, col_blob, col_meta in zip(
            col_names, col_types, col_blobs, col_metadata):
        parts = col_name.split(FIELD_SEPARATOR)
        node = root
        for depth, part in enumerate(parts):
            if depth == len(parts) - 1:
                node = node.add_child(part, col_type)
                node.field = Scalar(dtype=col_type, blob=col_blob,
                                    metadata=col_meta)
            else:
                node = node.add_child(part, '')
    return root.get_field()


def from_blob_list(schema, values, throw_on_type_mismatch=False):
    """A copy of ``schema`` whose leaves hold ``values``, in order."""
    assert isinstance(schema, Field), 'Argument `schema` must be a Field.'
    if isinstance(values, BlobReference):
        values = [values]
    record = schema.clone_schema()
    scalars = record.all_scalars()
    assert len(scalars) == len(values), (
        'Values must have %d elements, got %d.' % (len(scalars), len(values)))
    for scalar, value in zip(scalars, values):
        scalar.set_value(value, throw_on_type_mismatch, unsafe=True)
    return record


def as_record(value):
    """Makes a record of a Field (as is), a list of (name, value) pairs or a
    dict (a Struct), another list or tuple (a Tuple), or a single value (a
    Scalar)."""
    if isinstance(value, Field):
        return value
    if isinstance(value, (list, tuple)):
        # Caffe2 bug fixed: the pair test read `f is tuple`, which is never
        # true, so lists of (name, value) pairs could not be converted.
        is_field_list = all(
            isinstance(f, tuple) and len(f) == 2
            and isinstance(f[0], _STRING_TYPES)
            for f in value)
        if is_field_list:
            return Struct(*[(k, as_record(v)) for k, v in value])
        return Tuple(*[as_record(f) for f in value])
    if isinstance(value, dict):
        return Struct(*[(k, as_record(v)) for k, v in value.items()])
    return _normalize_field(value)


def FetchRecord(blob_record, ws=None, throw_on_type_mismatch=False):
    """The record's blobs fetched from ``ws`` (default: the current
    workspace), as a record of numpy arrays with the same schema (copies:
    writing to them does not change the blobs)."""
    assert isinstance(blob_record, Field)
    field_blobs = blob_record.field_blobs()
    assert all(isinstance(v, BlobReference) for v in field_blobs)
    if ws is None:
        fetch = workspace.FetchBlob
    else:
        def fetch(name):
            return ws.blobs[name].fetch()
    arrays = [fetch(str(b)) for b in field_blobs]
    return from_blob_list(blob_record, arrays, throw_on_type_mismatch)


def FeedRecord(blob_record, arrays, ws=None):
    """Feeds ``arrays`` (a list of arrays or a record holding arrays) into
    the record's blobs in ``ws`` (default: the current workspace)."""
    assert isinstance(blob_record, Field)
    field_blobs = blob_record.field_blobs()
    assert all(isinstance(v, BlobReference) for v in field_blobs)
    if isinstance(arrays, Field):
        arrays = arrays.field_blobs()
    assert len(arrays) == len(field_blobs), (
        'Values must contain exactly %d ndarrays.' % len(field_blobs))
    for blob, array in zip(field_blobs, arrays):
        if ws is None:
            workspace.FeedBlob(str(blob), array)
        else:
            ws.create_blob(str(blob))
            ws.blobs[str(blob)].feed(array)


def NewRecord(net, schema):
    """A record of fresh, uniquely named blobs of ``net`` (named
    ``net.NextScopedBlob(field_name)``) with the given schema.  ``net`` may
    be ``net_builder.ops``."""
    if isinstance(schema, Scalar):
        result = schema.clone()
        result.set_value(blob=net.NextScopedBlob('unnamed_scalar'),
                         unsafe=True)
        return result
    assert isinstance(schema, Field), 'Record must be a schema.Field instance.'
    blobs = [net.NextScopedBlob(prefix=name) for name in schema.field_names()]
    return from_blob_list(schema, blobs)


def ConstRecord(net, array_record):
    """A record of blobs filled by ``net.Const`` with the arrays of
    ``array_record``."""
    blob_record = NewRecord(net, array_record)
    for blob, array in zip(blob_record.field_blobs(),
                           array_record.field_blobs()):
        net.Const(array, blob)
    return blob_record


def InitEmptyRecord(net, schema_or_record, enforce_types=False):
    """Adds to ``net`` a ConstantFill per leaf making an empty tensor (shape
    ``[0] + inner shape``) of the leaf's type; a schema without blobs gets
    new ones first.  A leaf of unknown type gets an empty float tensor (or a
    TypeError with ``enforce_types``).  Returns the record."""
    if not schema_or_record.has_blobs():
        record = NewRecord(net, schema_or_record)
    else:
        record = schema_or_record
    for blob_type, blob in zip(record.field_types(), record.field_blobs()):
        try:
            data_type = data_type_for_dtype(blob_type)
            shape = [0] + list(blob_type.shape)
            net.ConstantFill([], blob, shape=shape, dtype=data_type)
        except TypeError:
            logger.warning('Blob {} has type error'.format(blob))
            if enforce_types:
                raise
            net.ConstantFill([], blob, shape=[0])
    return record


_DATA_TYPE_FOR_DTYPE = [
    (str, core.DataType.STRING),
    (np.float16, core.DataType.FLOAT16),
    (np.float32, core.DataType.FLOAT),
    (np.float64, core.DataType.DOUBLE),
    (bool, core.DataType.BOOL),
    (np.int8, core.DataType.INT8),
    (np.int16, core.DataType.INT16),
    (np.int32, core.DataType.INT32),
    (np.int64, core.DataType.INT64),
    (np.uint8, core.DataType.UINT8),
    (np.uint16, core.DataType.UINT16),
]


def is_schema_subset(schema, original_schema):
    """True if every field name of ``schema`` is in ``original_schema``."""
    return set(schema.field_names()).issubset(
        set(original_schema.field_names()))


def equal_schemas(schema, original_schema, check_field_names=True,
                  check_field_types=True, check_field_metas=False):
    assert isinstance(schema, Field)
    assert isinstance(original_schema, Field)
    if check_field_names and (
            schema.field_names() != original_schema.field_names()):
        return False
    if check_field_types and (
            schema.field_types() != original_schema.field_types()):
        return False
    if check_field_metas and (
            schema.field_metadata() != original_schema.field_metadata()):
        return False
    return True


def schema_check(schema, previous=None):
    record = as_record(schema)
    if previous is not None:
        assert equal_schemas(schema, previous)
    return record


def data_type_for_dtype(dtype):
    """The ``core.DataType`` of a numpy dtype (TypeError if none)."""
    base = np.dtype(dtype).base
    if base.kind in ('U', 'S', 'O'):
        return core.DataType.STRING
    for np_type, data_type in _DATA_TYPE_FOR_DTYPE:
        if base == np_type:
            return data_type
    raise TypeError('Unknown dtype: ' + str(base))


def dtype_for_core_type(core_type):
    """The numpy type of a ``core.DataType`` (TypeError if none)."""
    for np_type, data_type in _DATA_TYPE_FOR_DTYPE:
        if data_type == core_type:
            return np_type
    raise TypeError('Unknown core type: ' + str(core_type))


def attach_metadata_to_scalars(field, metadata):
    for scalar in field.all_scalars():
        scalar.set_metadata(metadata)
