"""Tests of ferrocaffe.schema: building schemas, the flattened views,
records of blobs, and moving record data in and out of workspaces."""

import logging

import numpy as np
import pytest

from ferrocaffe import core, schema, workspace
from ferrocaffe.schema import (
    ConstRecord, FeedRecord, FetchRecord, InitEmptyRecord, List, Map,
    Metadata, NewRecord, RawTuple, Scalar, Struct, Tuple, as_record,
    equal_schemas, from_blob_list, from_column_list, is_schema_subset)


def nested_schema():
    return Struct(
        ('uid', np.int64),
        ('tags', List(np.int32)),
        ('features', Map(np.int32, np.float32)),
        ('info', Struct(('score', np.float32), ('name', str))),
    )


NESTED_NAMES = [
    'uid', 'tags:lengths', 'tags:values', 'features:lengths',
    'features:values:keys', 'features:values:values',
    'info:score', 'info:name',
]


# ------------------------------------------------------------ structure --

def test_flattened_names_and_types():
    s = nested_schema()
    assert s.field_names() == NESTED_NAMES
    assert s.field_types() == [
        np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.int32),
        np.dtype(np.int32), np.dtype(np.int32), np.dtype(np.float32),
        np.dtype(np.float32), np.dtype(str)]
    assert s.field_metadata() == [None] * 8
    assert not s.has_blobs()
    assert len(s.all_scalars()) == 8


def test_nested_names_are_merged_into_structs():
    s = Struct(
        ('a', Scalar()),
        ('b:c', np.int32),
        ('b:d:e', np.int64),
        ('b', Struct(('f', np.float32))),
    )
    assert s.field_names() == ['a', 'b:c', 'b:d:e', 'b:f']
    assert isinstance(s.b, Struct)
    assert isinstance(s.b.d, Struct)
    assert s['b:d:e'].field_type() == np.dtype(np.int64)


def test_struct_rejects_bad_names():
    with pytest.raises(ValueError, match='Duplicate field name: a'):
        Struct(('a', np.int32), ('a', np.int64))
    with pytest.raises(AssertionError, match='`lengths`'):
        Struct(('lengths', np.int32))
    with pytest.raises(AssertionError, match='cannot be empty'):
        Struct(('', np.int32))


def test_access_by_attribute_name_index_and_list():
    s = nested_schema()
    assert s.uid is s['uid'] is s[0]
    assert s['info:score'] is s.info.score
    assert s['features:values:keys'] is s.features.keys
    assert s.tags['values'] is s.tags.value is s.tags.items
    assert s.tags['lengths'] is s.tags.lengths
    sub = s[['uid', 3]]
    assert sub.field_names() == ['uid', 'info:score', 'info:name']
    assert 'info:name' in s and 'info:nope' not in s and 'zzz' not in s
    assert len(s) == 4
    with pytest.raises(KeyError):
        s['nope']
    with pytest.raises(AttributeError):
        s.nope
    assert s.get('nope', 7) == 7
    with pytest.raises(TypeError, match='disabled after __init__'):
        s.uid = Scalar()


def test_ids_and_slices_index_the_flattened_lists():
    s = nested_schema()
    names = NESTED_NAMES
    assert names[s.tags.slice()] == ['tags:lengths', 'tags:values']
    assert names[s.features.slice()] == names[3:6]
    assert names[s.info.slice()] == ['info:score', 'info:name']
    for i, scalar in enumerate(s.all_scalars()):
        assert scalar.id() == i


def test_struct_add_and_sub():
    s1 = Struct(('a', np.int32), ('b', Struct(('c', np.int32))))
    s2 = Struct(('b', Struct(('d', np.float32))), ('e', np.int64))
    merged = s1 + s2
    assert merged.field_names() == ['a', 'b:c', 'b:d', 'e']
    assert (merged - s2).field_names() == ['a', 'b:c']
    assert (merged - Struct(('b', Struct(('c', np.int32), ('d', np.float32))))
            ).field_names() == ['a', 'e']
    with pytest.raises(TypeError):
        s1 + Struct(('a', np.int32))
    with pytest.raises(TypeError):
        s1 - Struct(('b', np.int32))


def test_tuple_helpers_and_as_record():
    assert Tuple(np.int32, np.float32).field_names() == ['field_0', 'field_1']
    raw = RawTuple(3)
    assert raw.field_names() == ['field_0', 'field_1', 'field_2']
    assert raw.field_types() == [np.dtype(np.void)] * 3
    assert RawTuple(2, 'x').field_names() == ['x_0', 'x_1']

    rec = as_record([('a', np.int32), ('b', np.float32)])
    assert rec.field_names() == ['a', 'b']
    rec = as_record({'k': np.array([1, 2])})
    assert rec.field_names() == ['k']
    np.testing.assert_array_equal(rec.k(), [1, 2])
    rec = as_record((np.array([1.5]), np.array([2])))
    assert rec.field_names() == ['field_0', 'field_1']
    blob = core.BlobReference('x')
    assert as_record(blob).field_blobs() == [blob]
    same = Struct(('z', np.int32))
    assert as_record(same) is same


def test_from_column_list_recognises_lists_and_maps():
    s = from_column_list(
        ['a', 'l:lengths', 'l:values', 'm:lengths', 'm:keys', 'm:values'],
        col_types=[np.int64, np.int32, np.float32, np.int32, np.int64,
                   np.float32])
    assert isinstance(s.l, List)
    assert isinstance(s.m, List)
    assert s.field_names() == [
        'a', 'l:lengths', 'l:values', 'm:lengths', 'm:values:keys',
        'm:values:values']
    assert s.field_types()[4] == np.dtype(np.int64)


def test_schema_comparisons():
    a = Struct(('x', np.int32), ('y', np.float32))
    assert a == a.clone()
    assert a != Struct(('x', np.int32), ('y', np.float64))
    assert equal_schemas(a, Struct(('x', np.int32), ('y', np.float32)))
    assert not equal_schemas(a, Struct(('x', np.int32), ('z', np.float32)))
    assert equal_schemas(a, Struct(('x', np.int64), ('y', np.float32)),
                         check_field_types=False)
    assert is_schema_subset(Struct(('y', np.int64)), a)
    assert not is_schema_subset(Struct(('q', np.int64)), a)
    with_meta = a.clone()
    with_meta.x.set_metadata(Metadata(categorical_limit=10))
    assert equal_schemas(a, with_meta)
    assert not equal_schemas(a, with_meta, check_field_metas=True)


# --------------------------------------------------------------- scalars --

def test_scalar_values_and_types():
    s = Scalar(np.int32, [1, 2, 3])
    assert s.field_type() == np.dtype(np.int32)
    assert s().dtype == np.int32 and list(s()) == [1, 2, 3]
    assert list(Scalar(np.float32, 5)()) == [5.0]  # a number is 1-element
    m = Scalar(np.float32, np.zeros((4, 3)))
    assert m.field_type() == np.dtype((np.float32, (3,)))
    assert Scalar((np.int32, 1)).field_type().shape == (1,)
    assert Scalar().field_type() == np.dtype(np.void)
    with pytest.raises(ValueError, match='ambiguous'):
        Scalar(blob='a_blob_name')
    with pytest.raises(AssertionError, match='Value is not set'):
        Scalar(np.int32).get()
    with pytest.raises(AssertionError, match='categorical_limit'):
        Scalar(np.float32, metadata=Metadata(categorical_limit=3))


def test_scalar_set_and_set_value(caplog):
    s = Scalar(np.int64)
    with caplog.at_level(logging.WARNING, logger='ferrocaffe.schema'):
        s.set(blob=core.BlobReference('b'), unsafe=True)
    assert not caplog.records
    assert s() == core.BlobReference('b')
    assert s.field_type() == np.dtype(np.void)  # set() replaces the type
    with caplog.at_level(logging.WARNING, logger='ferrocaffe.schema'):
        s.set(np.int32, core.BlobReference('c'))
    assert any('immutable' in r.getMessage() for r in caplog.records)

    typed = Scalar(np.int32)
    typed.set_value(np.array([7, 8], dtype=np.int64), unsafe=True)
    assert typed.field_type() == np.dtype(np.int32)
    assert typed().dtype == np.int32
    with pytest.raises(AssertionError, match='Expected int32'):
        typed.set_value(np.array([1.5]), throw_on_type_mismatch=True,
                        unsafe=True)


def test_clone_schema_drops_values_and_clone_keeps_them():
    rec = Struct(('a', Scalar(np.int32, [1])), ('b', List(np.float32)))
    assert not rec.clone_schema().a.has_blobs()
    assert rec.clone().a.has_blobs()
    copy = rec.clone()
    assert copy.a is not rec.a


def test_from_blob_list():
    s = nested_schema()
    blobs = [core.BlobReference('b%d' % i) for i in range(8)]
    rec = from_blob_list(s, blobs)
    assert rec.field_blobs() == blobs
    assert rec.info.name() == blobs[7]
    assert not s.has_blobs()  # the schema itself is left alone
    with pytest.raises(AssertionError, match='Values must have 8 elements, got 2.'):
        from_blob_list(s, blobs[:2])
    single = from_blob_list(Scalar(np.int32), core.BlobReference('one'))
    assert single() == core.BlobReference('one')


# --------------------------------------------------------------- records --

def test_new_record_names_blobs_after_fields():
    net = core.Net('rec_net')
    s = Struct(('a', np.int32), ('b', List(np.float32)))
    rec = NewRecord(net, s)
    assert [str(b) for b in rec.field_blobs()] == ['a', 'b:lengths', 'b:values']
    again = NewRecord(net, s)
    assert [str(b) for b in again.field_blobs()] == [
        'a_auto_0', 'b:lengths_auto_0', 'b:values_auto_0']
    with core.NameScope('scoped'):
        scoped = NewRecord(net, Struct(('a', np.int32)))
    assert [str(b) for b in scoped.field_blobs()] == ['scoped/a']
    assert str(NewRecord(net, Scalar(np.int32))()) == 'unnamed_scalar'
    assert rec.a.field_type() == np.dtype(np.int32)


def test_feed_and_fetch_record_in_a_workspace():
    ws = workspace.Workspace()
    net = core.Net('feed_net')
    s = Struct(('uid', np.int64), ('tags', List(np.int32)),
               ('w', np.float32))
    rec = NewRecord(net, s)
    values = [np.array([10, 20], dtype=np.int64),
              np.array([2, 1], dtype=np.int32),
              np.array([5, 6, 7], dtype=np.int32),
              np.array([0.5, 0.25], dtype=np.float32)]
    FeedRecord(rec, values, ws)
    fetched = FetchRecord(rec, ws=ws)
    assert fetched.field_names() == s.field_names()
    for got, want in zip(fetched.field_blobs(), values):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    # a record of arrays can be fed as well
    FeedRecord(rec, from_blob_list(s, [v * 2 for v in values]), ws)
    np.testing.assert_array_equal(ws.blobs[str(rec.uid())].fetch(), [20, 40])
    with pytest.raises(AssertionError, match='exactly 4 ndarrays'):
        FeedRecord(rec, values[:3], ws)


def test_feed_and_fetch_record_in_the_current_workspace():
    rec = NewRecord(core.Net('cur_net'), Struct(('x', np.int32)))
    FeedRecord(rec, [np.array([3, 4], dtype=np.int32)])
    try:
        np.testing.assert_array_equal(FetchRecord(rec).x(), [3, 4])
    finally:
        workspace.RemoveBlob(str(rec.x()))


def test_const_record():
    ws = workspace.Workspace()
    net = core.Net('const_net')
    arrays = Struct(('i', np.array([1, 2, 3], dtype=np.int32)),
                    ('f', np.array([1.5, 2.5], dtype=np.float32)),
                    ('s', np.array(['x', 'yz'])))
    rec = ConstRecord(net, arrays)
    ws.run(net)
    out = FetchRecord(rec, ws=ws)
    np.testing.assert_array_equal(out.i(), [1, 2, 3])
    np.testing.assert_array_equal(out.f(), [1.5, 2.5])
    assert [v.decode() if isinstance(v, bytes) else v for v in out.s()] == [
        'x', 'yz']


def test_init_empty_record():
    ws = workspace.Workspace()
    net = core.Net('empty_net')
    s = Struct(('i', np.int64), ('m', Scalar((np.float32, 3))), ('l', List(np.int32)),
               ('s', str), ('u', Scalar()))
    rec = InitEmptyRecord(net, s)
    ws.run(net)
    expected = {
        'i': ((0,), np.int64), 'm': ((0, 3), np.float32),
        'l:lengths': ((0,), np.int32), 'l:values': ((0,), np.int32),
        'u': ((0,), np.float32),
    }
    for name, blob in zip(rec.field_names(), rec.field_blobs()):
        value = ws.blobs[str(blob)].fetch()
        if name == 's':
            assert value.shape == (0,)
            continue
        shape, dtype = expected[name]
        assert value.shape == shape, name
        assert value.dtype == dtype, name
    with pytest.raises(TypeError):
        InitEmptyRecord(core.Net('strict'), Struct(('u', Scalar())),
                        enforce_types=True)


def test_data_type_mapping():
    assert schema.data_type_for_dtype(np.dtype(np.int32)) == core.DataType.INT32
    assert schema.data_type_for_dtype(np.dtype(str)) == core.DataType.STRING
    assert schema.data_type_for_dtype(np.dtype(bool)) == core.DataType.BOOL
    assert schema.data_type_for_dtype(
        np.dtype((np.float64, (2,)))) == core.DataType.DOUBLE
    assert schema.dtype_for_core_type(core.DataType.INT64) is np.int64
    with pytest.raises(TypeError, match='Unknown dtype'):
        schema.data_type_for_dtype(np.dtype(np.void))


def test_net_records_use_schema():
    net = core.Net('with_records')
    rec = net.set_input_record(Struct(('a', np.int32), ('b', np.float32)))
    assert [str(b) for b in rec.field_blobs()] == [
        'with_records/a', 'with_records/b']
    out = net.Copy(rec.a(), 'out_a')
    net.set_output_record(Struct(('y', Scalar(np.int32, out))))
    clone = net.Clone('cloned', blob_remap={'with_records/a': 'z'})
    assert [str(b) for b in clone.input_record().field_blobs()] == [
        'z', 'with_records/b']
    assert clone.output_record().field_names() == ['y']
