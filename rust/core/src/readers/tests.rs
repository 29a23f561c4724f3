//! Tests of the readers and the writer.

use super::npy::*;
use super::parquet::*;
use super::writer::*;
use super::*;
use crate::ir::Argument;
use crate::test_util::{get, int_arg, ints_arg, op, run, string_arg, strings_arg, strs};
use crate::workspace::Workspace;
use ::parquet::basic::Compression;
use ::parquet::data_type::ByteArray;
use ::parquet::data_type::{BoolType, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type};
use ::parquet::file::properties::WriterProperties;
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;
use std::fs;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

#[test]
fn copy_strings_overwrites_old_strings_then_allocates() {
    let strs = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
    // Three old strings; a batch of one longer, one empty, then (after
    // a second call) two more: the third old slot and one new.
    let mut dst = strs(&["old-a", "old-bb", "old-ccc"]);
    let mut filled = 0;
    copy_strings(&strs(&["a much longer string", ""]), &mut dst, &mut filled);
    assert_eq!(filled, 2);
    copy_strings(&strs(&["x", "yz"]), &mut dst, &mut filled);
    assert_eq!(filled, 4);
    assert_eq!(dst, strs(&["a much longer string", "", "x", "yz"]));
    // A shorter batch over a longer one: the leftovers are past `filled`.
    let mut filled = 0;
    copy_strings(&strs(&["q"]), &mut dst, &mut filled);
    assert_eq!((filled, &dst[0]), (1, &b"q".to_vec()));
    // Both halves above the parallel threshold.
    let big: Vec<Vec<u8>> = (0..40000).map(|i| i.to_string().into_bytes()).collect();
    let mut dst: Vec<Vec<u8>> = (0..20000).map(|_| b"stale".to_vec()).collect();
    let mut filled = 0;
    copy_strings(&big, &mut dst, &mut filled);
    assert_eq!((filled, &dst), (40000, &big));
}

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferrocaffe-fileio-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> String {
        let p = self.0.join(name);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).unwrap();
        }
        p.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One column chunk to write: values plus optional levels.
enum Vals {
    B(Vec<bool>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    S(Vec<&'static str>),
}

struct Chunk {
    vals: Vals,
    def: Option<Vec<i16>>,
    rep: Option<Vec<i16>>,
}

fn plain(vals: Vals) -> Chunk {
    Chunk {
        vals,
        def: None,
        rep: None,
    }
}

/// A required list<int64> column chunk ("repeated int64 item" under a LIST
/// group with required levels): records given as slices.
fn list_i64(records: &[&[i64]]) -> Chunk {
    let (mut vals, mut def, mut rep) = (Vec::new(), Vec::new(), Vec::new());
    for r in records {
        if r.is_empty() {
            def.push(0);
            rep.push(0);
        }
        for (i, &v) in r.iter().enumerate() {
            vals.push(v);
            def.push(1);
            rep.push(if i == 0 { 0 } else { 1 });
        }
    }
    Chunk {
        vals: Vals::I64(vals),
        def: Some(def),
        rep: Some(rep),
    }
}

fn write_parquet(
    path: &str,
    schema: &str,
    groups: Vec<Vec<Chunk>>,
    codec: Compression,
    page_rows: usize,
) {
    let schema = Arc::new(parse_message_type(schema).unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(codec)
            .set_data_page_row_count_limit(page_rows)
            .set_write_batch_size(page_rows)
            .build(),
    );
    let mut w = SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
    for g in groups {
        let mut rg = w.next_row_group().unwrap();
        for c in g {
            let mut col = rg.next_column().unwrap().expect("a column per chunk");
            let (d, r) = (c.def.as_deref(), c.rep.as_deref());
            match c.vals {
                Vals::B(v) => col.typed::<BoolType>().write_batch(&v, d, r),
                Vals::I32(v) => col.typed::<Int32Type>().write_batch(&v, d, r),
                Vals::I64(v) => col.typed::<Int64Type>().write_batch(&v, d, r),
                Vals::F32(v) => col.typed::<FloatType>().write_batch(&v, d, r),
                Vals::F64(v) => col.typed::<DoubleType>().write_batch(&v, d, r),
                Vals::S(v) => {
                    let v: Vec<ByteArray> = v.into_iter().map(ByteArray::from).collect();
                    col.typed::<ByteArrayType>().write_batch(&v, d, r)
                }
            }
            .unwrap();
            col.close().unwrap();
        }
        assert!(rg.next_column().unwrap().is_none(), "every column written");
        rg.close().unwrap();
    }
    w.close().unwrap();
}

const SCHEMA: &str = "message m {
    required int64 id;
    required float x;
    required binary name (UTF8);
    required group items (LIST) { repeated int64 item; }
}";

/// Records `lo..hi`: id = i, x = i / 2, name = "n<i>", items = [i; i % 3].
fn group(lo: i64, hi: i64) -> Vec<Chunk> {
    let names: Vec<&'static str> = (lo..hi)
        .map(|i| &*Box::leak(format!("n{i}").into_boxed_str()))
        .collect();
    let items: Vec<Vec<i64>> = (lo..hi).map(|i| vec![i; (i % 3) as usize]).collect();
    let refs: Vec<&[i64]> = items.iter().map(|v| v.as_slice()).collect();
    vec![
        plain(Vals::I64((lo..hi).collect())),
        plain(Vals::F32((lo..hi).map(|i| i as f32 / 2.0).collect())),
        plain(Vals::S(names)),
        list_i64(&refs),
    ]
}

/// A file of records `lo..hi` in row groups of `rg` records.
fn sample(path: &str, lo: i64, hi: i64, rg: i64, codec: Compression) {
    let mut groups = Vec::new();
    let mut a = lo;
    while a < hi {
        groups.push(group(a, (a + rg).min(hi)));
        a += rg;
    }
    write_parquet(path, SCHEMA, groups, codec, 7);
}

fn ids(t: &Tensor) -> Vec<i64> {
    t.array::<i64>().unwrap().iter().copied().collect()
}

/// Reads every batch, checking each record's fields against its id;
/// returns the ids in order.
fn drain(r: &ParquetReader, n: usize) -> Vec<i64> {
    let mut all = Vec::new();
    loop {
        let b = r.read_batch(n).unwrap();
        assert_eq!(b.len(), 5);
        let id = ids(&b[0]);
        let x: Vec<f32> = b[1].array::<f32>().unwrap().iter().copied().collect();
        let names: Vec<Vec<u8>> = b[2].array::<Vec<u8>>().unwrap().iter().cloned().collect();
        let lengths: Vec<i32> = b[3].array::<i32>().unwrap().iter().copied().collect();
        let values = ids(&b[4]);
        assert!(id.len() <= n);
        assert_eq!(x.len(), id.len());
        assert_eq!(lengths.len(), id.len());
        let mut at = 0;
        for (k, &i) in id.iter().enumerate() {
            assert_eq!(x[k], i as f32 / 2.0);
            assert_eq!(names[k], format!("n{i}").into_bytes());
            assert_eq!(lengths[k] as i64, i % 3);
            assert!(values[at..at + lengths[k] as usize].iter().all(|&v| v == i));
            at += lengths[k] as usize;
        }
        assert_eq!(at, values.len());
        if id.is_empty() {
            assert_eq!(b[4].shape(), &[0]);
            assert_eq!(b[2].dtype(), DataType::String);
            return all;
        }
        all.extend(id);
    }
}

#[test]
fn streams_batches_across_pages_and_row_groups() {
    let s = Scratch::new();
    for codec in [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::ZSTD(Default::default()),
        Compression::GZIP(Default::default()),
        Compression::LZ4_RAW,
    ] {
        let p = s.path("a.parquet");
        sample(&p, 0, 100, 30, codec);
        let r = ParquetReader::open(&[p], &[], 8).unwrap();
        assert_eq!(r.total_records(), 100);
        assert_eq!(
            r.columns(),
            vec![
                ("id".to_string(), DataType::Int64, false),
                ("x".to_string(), DataType::Float, false),
                ("name".to_string(), DataType::String, false),
                ("items".to_string(), DataType::Int64, true),
            ]
        );
        for n in [1, 8, 29, 30, 31, 1000] {
            r.reset();
            assert_eq!(
                drain(&r, n),
                (0..100).collect::<Vec<_>>(),
                "batch {n}, {codec}"
            );
            assert_eq!(r.position(), 100);
        }
    }
}

#[test]
fn a_folder_is_its_data_files_in_name_order() {
    let s = Scratch::new();
    sample(&s.path("d/part-1.parquet"), 50, 80, 16, Compression::SNAPPY);
    sample(&s.path("d/part-0.parquet"), 0, 50, 16, Compression::SNAPPY);
    sample(
        &s.path("d/sub/part-2.parquet"),
        80,
        81,
        16,
        Compression::SNAPPY,
    );
    sample(
        &s.path("d/part-05-empty.parquet"),
        0,
        0,
        16,
        Compression::SNAPPY,
    );
    fs::write(s.path("d/_SUCCESS"), b"").unwrap();
    fs::write(s.path("d/.part-0.parquet.crc"), b"junk").unwrap();
    let r = ParquetReader::open(&[s.path("d")], &[], 7).unwrap();
    assert_eq!(r.files().len(), 4);
    assert_eq!(drain(&r, 7), (0..81).collect::<Vec<_>>());
    let e = ParquetReader::open(&[s.path("empty-dir/")], &[], 7);
    fs::create_dir_all(s.path("empty-dir")).unwrap();
    let e2 = ParquetReader::open(&[s.path("empty-dir")], &[], 7).unwrap_err();
    assert!(e.is_err());
    assert!(e2.message.contains("holds no data files"), "{}", e2.message);
}

#[test]
fn an_empty_file_reads_as_no_records() {
    let s = Scratch::new();
    let p = s.path("empty.parquet");
    sample(&p, 0, 0, 10, Compression::SNAPPY);
    let r = ParquetReader::open(&[p], &["id".into(), "items".into()], 4).unwrap();
    let b = r.read_batch(4).unwrap();
    assert_eq!(b.len(), 3);
    assert!(b.iter().all(|t| t.shape() == [0]));
    assert_eq!(b[1].dtype(), DataType::Int32);
}

#[test]
fn selected_columns_in_the_order_asked() {
    let s = Scratch::new();
    let p = s.path("a.parquet");
    sample(&p, 0, 10, 4, Compression::SNAPPY);
    let r =
        ParquetReader::open(std::slice::from_ref(&p), &["items".into(), "id".into()], 4).unwrap();
    assert_eq!(r.num_outputs(), 3);
    let b = r.read_batch(4).unwrap();
    assert_eq!(b[0], Tensor::from_vec(&[4], vec![0i32, 1, 2, 0]).unwrap());
    assert_eq!(b[1], Tensor::from_vec(&[3], vec![1i64, 2, 2]).unwrap());
    assert_eq!(ids(&b[2]), vec![0, 1, 2, 3]);
    // The full path of the list's leaf names the same column.
    let r = ParquetReader::open(&[p], &["items.item".into()], 4).unwrap();
    assert_eq!(r.columns()[0].0, "items");
}

#[test]
fn a_source_describes_its_outputs() {
    let s = Scratch::new();
    let p = s.path("a.parquet");
    sample(&p, 0, 10, 4, Compression::SNAPPY);
    let r = ParquetReader::open(&[p], &["items".into(), "name".into()], 4).unwrap();
    let want = [
        ("items:lengths", DataType::Int32),
        ("items:values", DataType::Int64),
        ("name", DataType::String),
    ];
    let got: Vec<(String, DataType)> = r.outputs().into_iter().map(|o| (o.name, o.dtype)).collect();
    let want: Vec<(String, DataType)> = want.iter().map(|(n, d)| (n.to_string(), *d)).collect();
    assert_eq!(got, want);
    assert_eq!(BatchSource::num_outputs(&r), 3);
    assert_eq!(BatchSource::total_records(&r), 10);
    let n = s.path("a.npy");
    npy(&n, "<i2", &[3, 2], &[0u8; 12]);
    let r = NpyReader::open(std::slice::from_ref(&n), 2).unwrap();
    assert_eq!(
        r.outputs(),
        vec![OutputDesc {
            name: n,
            dtype: DataType::Int16
        }]
    );
    assert_eq!(BatchSource::total_records(&r), 3);
}

#[test]
fn missing_corrupt_and_mistyped_files_name_file_and_column() {
    let s = Scratch::new();
    let good = s.path("good.parquet");
    sample(&good, 0, 40, 40, Compression::SNAPPY);

    let missing = s.path("missing.parquet");
    let e = ParquetReader::open(std::slice::from_ref(&missing), &[], 4).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(
        e.message.contains(&missing) && e.message.contains("No such file"),
        "{}",
        e.message
    );
    assert_eq!(e.context.file.as_deref(), Some(missing.as_str()));

    let zero = s.path("zero.parquet");
    fs::write(&zero, b"").unwrap();
    let e = ParquetReader::open(std::slice::from_ref(&zero), &[], 4).unwrap_err();
    assert!(
        e.message.contains(&zero) && e.message.contains("empty"),
        "{}",
        e.message
    );

    let junk = s.path("junk.parquet");
    fs::write(&junk, b"this is not a parquet file at all, only some text").unwrap();
    let e = ParquetReader::open(std::slice::from_ref(&junk), &[], 4).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(
        e.message.contains(&junk) && e.message.contains("not a valid Parquet file"),
        "{}",
        e.message
    );

    // Damaged pages: the footer is intact, the data is not.
    let bytes = fs::read(&good).unwrap();
    let bad = s.path("bad-pages.parquet");
    let mut b = bytes.clone();
    for v in b.iter_mut().skip(4).take(bytes.len() / 2) {
        *v = 0xAB;
    }
    fs::write(&bad, &b).unwrap();
    let r = ParquetReader::open(std::slice::from_ref(&bad), &[], 16).unwrap();
    let e = r.read_batch(16).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(
        e.message.contains(&bad) && e.message.contains("column '"),
        "{}",
        e.message
    );
    // The failure leaves the position alone and fails again, never hangs.
    assert_eq!(r.position(), 0);
    assert!(r.read_batch(16).is_err());

    // A truncated file loses its footer.
    let cut = s.path("cut.parquet");
    fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let e = ParquetReader::open(std::slice::from_ref(&cut), &[], 4).unwrap_err();
    assert!(e.message.contains(&cut), "{}", e.message);

    let e = ParquetReader::open(std::slice::from_ref(&good), &["nope".into()], 4).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("no column 'nope'") && e.message.contains(&good),
        "{}",
        e.message
    );

    let e = ParquetReader::open_expecting(
        std::slice::from_ref(&good),
        &["id".into()],
        &[(Some(DataType::Float), None)],
        4,
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert!(
        e.message.contains("column 'id'")
            && e.message.contains(&good)
            && e.message.contains("int64 values but float32"),
        "{}",
        e.message
    );
    let e = ParquetReader::open_expecting(
        std::slice::from_ref(&good),
        &["items".into()],
        &[(None, Some(false))],
        4,
    )
    .unwrap_err();
    assert!(e.message.contains("lists of int64"), "{}", e.message);

    // Two files disagreeing on a column's type.
    let other = s.path("other.parquet");
    write_parquet(
        &other,
        "message m { required double id; }",
        vec![vec![plain(Vals::F64(vec![1.0]))]],
        Compression::SNAPPY,
        10,
    );
    let e = ParquetReader::open(&[good.clone(), other.clone()], &["id".into()], 4).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert!(
        e.message.contains(&other) && e.message.contains("column 'id'"),
        "{}",
        e.message
    );
}

#[test]
fn nulls_are_refused_but_a_null_list_is_empty() {
    let s = Scratch::new();
    let p = s.path("nulls.parquet");
    let schema = "message m {
        optional int32 a;
        optional group l (LIST) { repeated group list { optional int64 element; } }
    }";
    // a: 1, null, 3.  l: [5, 6], null, [].
    let a = Chunk {
        vals: Vals::I32(vec![1, 3]),
        def: Some(vec![1, 0, 1]),
        rep: None,
    };
    let l = Chunk {
        vals: Vals::I64(vec![5, 6]),
        def: Some(vec![3, 3, 0, 1]),
        rep: Some(vec![0, 1, 0, 0]),
    };
    write_parquet(&p, schema, vec![vec![a, l]], Compression::SNAPPY, 10);
    let r = ParquetReader::open(std::slice::from_ref(&p), &["l".into()], 10).unwrap();
    let b = r.read_batch(10).unwrap();
    assert_eq!(b[0], Tensor::from_vec(&[3], vec![2i32, 0, 0]).unwrap());
    assert_eq!(b[1], Tensor::from_vec(&[2], vec![5i64, 6]).unwrap());
    let r = ParquetReader::open(std::slice::from_ref(&p), &["a".into()], 10).unwrap();
    let e = r.read_batch(10).unwrap_err();
    assert!(
        e.message.contains("column 'a'") && e.message.contains("null") && e.message.contains(&p),
        "{}",
        e.message
    );

    let p2 = s.path("null-item.parquet");
    let l = Chunk {
        vals: Vals::I64(vec![5]),
        def: Some(vec![3, 2]),
        rep: Some(vec![0, 1]),
    };
    write_parquet(
        &p2,
        "message m { optional group l (LIST) { repeated group list { optional int64 element; } } }",
        vec![vec![l]],
        Compression::SNAPPY,
        10,
    );
    let r = ParquetReader::open(&[p2], &[], 10).unwrap();
    assert!(r.read_batch(10).unwrap_err().message.contains("null item"));
}

#[test]
fn integer_annotations_pick_the_tensor_type() {
    let s = Scratch::new();
    let p = s.path("ints.parquet");
    let schema = "message m {
        required int32 a (INT_8); required int32 b (UINT_16); required int32 c (UINT_32);
        required boolean d; required double e; required int32 f (DATE);
    }";
    let g = vec![
        plain(Vals::I32(vec![-128, 127])),
        plain(Vals::I32(vec![0, 65535])),
        plain(Vals::I32(vec![-1, 7])),
        plain(Vals::B(vec![true, false])),
        plain(Vals::F64(vec![0.25, -1.5])),
        plain(Vals::I32(vec![19000, 19001])),
    ];
    write_parquet(&p, schema, vec![g], Compression::SNAPPY, 10);
    let r = ParquetReader::open(&[p], &[], 10).unwrap();
    let b = r.read_batch(10).unwrap();
    assert_eq!(b[0], Tensor::from_vec(&[2], vec![-128i8, 127]).unwrap());
    assert_eq!(b[1], Tensor::from_vec(&[2], vec![0u16, 65535]).unwrap());
    assert_eq!(
        b[2],
        Tensor::from_vec(&[2], vec![4294967295i64, 7]).unwrap()
    );
    assert_eq!(b[3], Tensor::from_vec(&[2], vec![true, false]).unwrap());
    assert_eq!(b[4], Tensor::from_vec(&[2], vec![0.25f64, -1.5]).unwrap());
    assert_eq!(b[5], Tensor::from_vec(&[2], vec![19000i32, 19001]).unwrap());

    let p = s.path("i96.parquet");
    write_parquet(
        &p,
        "message m { required int64 u (UINT_64); }",
        vec![vec![plain(Vals::I64(vec![1]))]],
        Compression::SNAPPY,
        10,
    );
    let e = ParquetReader::open(&[p], &[], 10).unwrap_err();
    assert!(
        e.message.contains("column 'u'") && e.message.contains("UINT64"),
        "{}",
        e.message
    );
}

#[test]
fn threads_sharing_a_reader_get_every_record_once() {
    let s = Scratch::new();
    sample(&s.path("d/0.parquet"), 0, 500, 64, Compression::SNAPPY);
    sample(&s.path("d/1.parquet"), 500, 1000, 100, Compression::SNAPPY);
    let r = Arc::new(ParquetReader::open(&[s.path("d")], &[], 13).unwrap());
    let got: Vec<i64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4).map(|_| sc.spawn(|| drain(&r, 13))).collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
}

#[test]
fn a_saved_reader_resumes_where_it_stood() {
    let s = Scratch::new();
    sample(&s.path("d/0.parquet"), 0, 45, 20, Compression::SNAPPY);
    sample(&s.path("d/1.parquet"), 45, 90, 20, Compression::SNAPPY);
    let r = ParquetReader::open(
        &[s.path("d")],
        &["id".into(), "items".into(), "name".into(), "x".into()],
        11,
    )
    .unwrap();
    for _ in 0..5 {
        r.read_batch(11).unwrap();
    }
    assert_eq!(r.position(), 55);
    let bytes = crate::storage::serialize_blob("r", &BlobValue::Object(Arc::new(r))).unwrap();
    let v = crate::storage::deserialize_blob(&bytes).unwrap();
    let back = v.object::<ParquetReader>("ParquetReader").unwrap();
    assert_eq!(back.position(), 55);
    assert_eq!(back.batch_size(), 11);
    let b = back.read_batch(11).unwrap();
    assert_eq!(ids(&b[0]), (55..66).collect::<Vec<_>>());
    assert_eq!(
        b[1].array::<i32>()
            .unwrap()
            .iter()
            .map(|&l| l as i64)
            .collect::<Vec<_>>(),
        (55..66).map(|i| i % 3).collect::<Vec<_>>()
    );

    // A file that changed since is refused, naming it.
    let bytes2 = crate::storage::serialize_blob("r", &BlobValue::Object(back.clone())).unwrap();
    sample(&s.path("d/1.parquet"), 45, 91, 20, Compression::SNAPPY);
    let e = crate::storage::deserialize_blob(&bytes2).unwrap_err();
    assert!(
        e.message.contains("1.parquet") && e.message.contains("46 records now"),
        "{}",
        e.message
    );
    // Malformed saved bytes are a CorruptCheckpoint error.
    let e = ParquetReader::from_bytes(b"FCPQ\x01\x05").unwrap_err();
    assert_eq!(e.kind, ErrorKind::CorruptCheckpoint);
}

// ------------------------------------------------------------ ops --

#[test]
fn parquet_ops_read_reset_and_describe() {
    let s = Scratch::new();
    let p = s.path("a.parquet");
    sample(&p, 0, 10, 4, Compression::SNAPPY);
    let ws = Workspace::new();
    let cols = strings_arg("columns", &["id", "items"]);
    run(
        &ws,
        op(
            "ParquetSchema",
            &[],
            &["n", "t", "l"],
            vec![string_arg("path", &p), cols.clone()],
        ),
    )
    .unwrap();
    assert_eq!(
        get(&ws, "n"),
        Tensor::from_vec(&[2], vec![b"id".to_vec(), b"items".to_vec()]).unwrap()
    );
    assert_eq!(
        get(&ws, "t"),
        Tensor::from_vec(&[2], vec![10i32, 10]).unwrap()
    );
    assert_eq!(
        get(&ws, "l"),
        Tensor::from_vec(&[2], vec![false, true]).unwrap()
    );

    let create = |extra: Vec<Argument>| {
        let mut a = vec![
            string_arg("path", &p),
            cols.clone(),
            int_arg("batch_size", 6),
        ];
        a.extend(extra);
        op("CreateParquetReader", &[], &["r"], a)
    };
    run(
        &ws,
        create(vec![
            ints_arg("dtypes", &[10, 10]),
            ints_arg("is_list", &[0, 1]),
        ]),
    )
    .unwrap();
    let read = op("ReadParquetBatch", &["r"], &["id", "len", "val"], vec![]);
    run(&ws, read.clone()).unwrap();
    assert_eq!(ids(&get(&ws, "id")), (0..6).collect::<Vec<_>>());
    run(&ws, read.clone()).unwrap();
    assert_eq!(ids(&get(&ws, "id")), (6..10).collect::<Vec<_>>());
    assert_eq!(get(&ws, "len").shape(), &[4]);
    run(&ws, read.clone()).unwrap();
    assert_eq!(get(&ws, "id").shape(), &[0]);
    run(&ws, op("ResetParquetReader", &["r"], &[], vec![])).unwrap();
    run(
        &ws,
        op(
            "ReadParquetBatch",
            &["r"],
            &["id", "len", "val"],
            vec![int_arg("batch_size", 2)],
        ),
    )
    .unwrap();
    assert_eq!(ids(&get(&ws, "id")), vec![0, 1]);

    let e = run(&ws, op("ReadParquetBatch", &["r"], &["id", "len"], vec![])).unwrap_err();
    assert!(
        e.message.contains("needs 3 outputs, got 2"),
        "{}",
        e.message
    );
    let e = run(&ws, create(vec![ints_arg("dtypes", &[10, 1])])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert!(
        e.full_message().contains("column 'items'"),
        "{}",
        e.full_message()
    );
    let e = run(&ws, create(vec![ints_arg("dtypes", &[10])])).unwrap_err();
    assert!(e.message.contains("one entry per column"), "{}", e.message);
    let e = run(&ws, op("CreateParquetReader", &[], &["r"], vec![])).unwrap_err();
    assert!(
        e.message.contains("needs a file or folder"),
        "{}",
        e.message
    );
    ws.feed("t2", BlobValue::Tensor(Tensor::scalar(1i32)));
    let e = run(&ws, op("ReadParquetBatch", &["t2"], &["x"], vec![])).unwrap_err();
    assert!(
        e.message.contains("ParquetReader was expected"),
        "{}",
        e.message
    );
}

// --------------------------------------------------------- writer --

#[test]
fn written_files_read_back_the_same() {
    let s = Scratch::new();
    let p = s.path("out.parquet");
    let w = ParquetWriter::new(&p, "zstd", 5, false).unwrap();
    let fields: Vec<String> = [
        "id",
        "a:b",
        "items:lengths",
        "items:values",
        "name",
        "a:c",
        "small",
    ]
    .iter()
    .map(|f| f.to_string())
    .collect();
    let mut want_items = Vec::new();
    for batch in 0..4i64 {
        let ids: Vec<i64> = (batch * 3..batch * 3 + 3).collect();
        let lengths: Vec<i32> = ids.iter().map(|i| (i % 3) as i32).collect();
        let values: Vec<i64> = ids
            .iter()
            .flat_map(|&i| vec![i * 10; (i % 3) as usize])
            .collect();
        want_items.extend(values.iter().copied());
        let t = [
            Tensor::from_vec(&[3], ids.clone()).unwrap(),
            Tensor::from_vec(&[3], ids.iter().map(|&i| i as f64).collect()).unwrap(),
            Tensor::from_vec(&[3], lengths).unwrap(),
            Tensor::from_vec(&[values.len()], values).unwrap(),
            strs(&["x", "yy", "é"]),
            Tensor::from_vec(&[3], vec![true, false, true]).unwrap(),
            Tensor::from_vec(&[3], vec![-1i8, 0, 1]).unwrap(),
        ];
        w.write(&fields, &t.iter().collect::<Vec<_>>()).unwrap();
    }
    assert!(!Path::new(&p).exists(), "the file appears on close");
    w.close().unwrap();
    w.close().unwrap();
    assert!(w
        .write(&fields, &[])
        .unwrap_err()
        .message
        .contains("already closed"));
    let r = ParquetReader::open(std::slice::from_ref(&p), &[], 100).unwrap();
    assert_eq!(
        r.files.iter().map(|f| f.rg_rows.clone()).next().unwrap(),
        vec![6, 6]
    );
    assert_eq!(
        r.columns(),
        vec![
            ("id".into(), DataType::Int64, false),
            ("a.b".into(), DataType::Double, false),
            ("a.c".into(), DataType::Bool, false),
            ("items".into(), DataType::Int64, true),
            ("name".into(), DataType::String, false),
            ("small".into(), DataType::Int8, false),
        ]
    );
    let b = r.read_batch(100).unwrap();
    assert_eq!(ids(&b[0]), (0..12).collect::<Vec<_>>());
    assert_eq!(
        b[1],
        Tensor::from_vec(&[12], (0..12).map(|i| i as f64).collect()).unwrap()
    );
    assert_eq!(
        b[3].array::<i32>()
            .unwrap()
            .iter()
            .map(|&l| l as i64)
            .collect::<Vec<_>>(),
        (0..12).map(|i| i % 3).collect::<Vec<_>>()
    );
    assert_eq!(ids(&b[4]), want_items);
    assert_eq!(b[5].array::<Vec<u8>>().unwrap()[2], "é".as_bytes().to_vec());
    assert_eq!(
        b[6].array::<i8>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>()[..3],
        [-1, 0, 1]
    );
}

#[test]
fn writer_errors_name_the_file_and_column() {
    let s = Scratch::new();
    let e = ParquetWriter::new(
        &s.0.join("no/such/dir/x.parquet").display().to_string(),
        "snappy",
        10,
        false,
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io);
    assert!(
        e.message.contains("x.parquet") && e.message.contains("folder does not exist"),
        "{}",
        e.message
    );
    assert!(ParquetWriter::new(&s.path("x.parquet"), "brotli", 10, false).is_err());

    let p = s.path("x.parquet");
    let w = ParquetWriter::new(&p, "snappy", 10, false).unwrap();
    let fields = vec!["id".to_string(), "v".to_string()];
    let ok = [
        Tensor::from_vec(&[2], vec![1i64, 2]).unwrap(),
        Tensor::from_vec(&[2], vec![0.5f32, 1.5]).unwrap(),
    ];
    w.write(&fields, &ok.iter().collect::<Vec<_>>()).unwrap();
    let wrong = [
        Tensor::from_vec(&[1], vec![3i64]).unwrap(),
        Tensor::from_vec(&[1], vec![0.5f64]).unwrap(),
    ];
    let e = w
        .write(&fields, &wrong.iter().collect::<Vec<_>>())
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    assert!(
        e.message.contains("column 'v'")
            && e.message.contains(&p)
            && e.message.contains("float64 values but"),
        "{}",
        e.message
    );
    let ragged = [
        Tensor::from_vec(&[1], vec![3i64]).unwrap(),
        Tensor::from_vec(&[2], vec![0.5f32, 1.]).unwrap(),
    ];
    let e = w
        .write(&fields, &ragged.iter().collect::<Vec<_>>())
        .unwrap_err();
    assert!(
        e.message.contains("column 'v'") && e.message.contains("2 records"),
        "{}",
        e.message
    );
    let e = w.write(&["id".to_string()], &[&ok[0]]).unwrap_err();
    assert!(
        e.message.contains("has the columns [id, v]"),
        "{}",
        e.message
    );
    let f2 = vec!["l:lengths".to_string(), "l:values".to_string()];
    let w2 = ParquetWriter::new(&s.path("l.parquet"), "snappy", 10, false).unwrap();
    let bad = [
        Tensor::from_vec(&[2], vec![1i32, 1]).unwrap(),
        Tensor::from_vec(&[3], vec![1i64, 2, 3]).unwrap(),
    ];
    let e = w2.write(&f2, &bad.iter().collect::<Vec<_>>()).unwrap_err();
    assert!(
        e.message.contains("add up to 2 but there are 3 values"),
        "{}",
        e.message
    );
    let e = w2
        .write(
            &["s".to_string()],
            &[&Tensor::from_vec(&[1], vec![vec![0xffu8]]).unwrap()],
        )
        .unwrap_err();
    assert!(e.message.contains("has the columns"), "{}", e.message);
    let w3 = ParquetWriter::new(&s.path("s.parquet"), "snappy", 10, false).unwrap();
    let e = w3
        .write(
            &["s".to_string()],
            &[&Tensor::from_vec(&[1], vec![vec![0xffu8]]).unwrap()],
        )
        .unwrap_err();
    assert!(
        e.message.contains("column 's'") && e.message.contains("not UTF-8"),
        "{}",
        e.message
    );
    // Nothing was buffered by the failed writes.
    w.close().unwrap();
    let r = ParquetReader::open(std::slice::from_ref(&p), &[], 10).unwrap();
    assert_eq!(ids(&r.read_batch(10).unwrap()[0]), vec![1, 2]);
    // A writer that never learnt its columns cannot make a file; one
    // dropped unclosed leaves nothing behind.
    let w4 = ParquetWriter::new(&s.path("none.parquet"), "snappy", 10, false).unwrap();
    assert!(w4
        .close()
        .unwrap_err()
        .message
        .contains("columns were never given"));
    drop(w2);
    drop(w3);
    let left: Vec<_> = fs::read_dir(&s.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(left.iter().all(|n| !n.contains(".tmp-")), "{left:?}");
    assert!(!Path::new(&s.path("l.parquet")).exists());
}

#[test]
fn writer_ops_write_a_schema_even_with_no_records() {
    let s = Scratch::new();
    let p = s.path("empty.parquet");
    let ws = Workspace::new();
    run(
        &ws,
        op(
            "CreateParquetWriter",
            &[],
            &["w"],
            vec![string_arg("path", &p)],
        ),
    )
    .unwrap();
    let schema = vec![
        strings_arg("fields", &["k", "l:lengths", "l:values"]),
        ints_arg("dtypes", &[10, 2, 1]),
    ];
    run(
        &ws,
        op("SetParquetWriterSchema", &["w"], &[], schema.clone()),
    )
    .unwrap();
    run(&ws, op("SetParquetWriterSchema", &["w"], &[], schema)).unwrap();
    let e = run(
        &ws,
        op(
            "SetParquetWriterSchema",
            &["w"],
            &[],
            vec![strings_arg("fields", &["k"]), ints_arg("dtypes", &[2])],
        ),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Type);
    run(&ws, op("CloseParquetWriter", &["w"], &[], vec![])).unwrap();
    let r = ParquetReader::open(&[p], &[], 10).unwrap();
    assert_eq!(
        r.columns(),
        vec![
            ("k".into(), DataType::Int64, false),
            ("l".into(), DataType::Float, true)
        ]
    );
    assert_eq!(r.total_records(), 0);

    let p = s.path("ops.parquet");
    run(
        &ws,
        op(
            "CreateParquetWriter",
            &[],
            &["w2"],
            vec![string_arg("path", &p), string_arg("compression", "gzip")],
        ),
    )
    .unwrap();
    ws.feed(
        "k",
        BlobValue::Tensor(Tensor::from_vec(&[2], vec![7i64, 8]).unwrap()),
    );
    run(
        &ws,
        op(
            "WriteParquetBatch",
            &["w2", "k"],
            &[],
            vec![strings_arg("fields", &["key"])],
        ),
    )
    .unwrap();
    let e = run(
        &ws,
        op(
            "WriteParquetBatch",
            &["w2", "k"],
            &[],
            vec![strings_arg("fields", &[])],
        ),
    )
    .unwrap_err();
    assert!(e.message.contains("1 inputs, 0 names"), "{}", e.message);
    run(&ws, op("CloseParquetWriter", &["w2"], &[], vec![])).unwrap();
    let r = ParquetReader::open(&[p], &[], 10).unwrap();
    assert_eq!(ids(&r.read_batch(10).unwrap()[0]), vec![7, 8]);
}

// ------------------------------------------------------------ npy --

/// A .npy file (format 1.0) from a descr, shape and raw data.
fn npy(path: &str, descr: &str, shape: &[usize], data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(data);
    fs::write(path, b).unwrap();
}

fn le<T: Copy, const W: usize>(v: &[T], f: fn(T) -> [u8; W]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

#[test]
fn npy_files_read_as_columns_of_rows() {
    let s = Scratch::new();
    let a = s.path("a.npy");
    let b = s.path("b.npy");
    let c = s.path("c.npy");
    let d = s.path("d.npy");
    let e = s.path("e.npy");
    npy(
        &a,
        "<f4",
        &[5, 2],
        &le(
            &(0..10).map(|i| i as f32).collect::<Vec<_>>(),
            f32::to_le_bytes,
        ),
    );
    npy(
        &b,
        ">i8",
        &[5],
        &le(&[10i64, 11, 12, 13, 14], i64::to_be_bytes),
    );
    npy(&c, "|S3", &[5], b"ab\0xyzq\0\0\0\0\0k\0\0");
    npy(
        &d,
        "<U2",
        &[5],
        &le(
            &[0x48u32, 0xe9, 0x1f600, 0, 0, 0, 0x61, 0, 0x62, 0x63],
            u32::to_le_bytes,
        ),
    );
    npy(&e, "|b1", &[5], &[1, 0, 1, 1, 0]);
    let paths: Vec<String> = [&a, &b, &c, &d, &e].iter().map(|s| s.to_string()).collect();
    let r = NpyReader::open(&paths, 2).unwrap();
    let t = r.read_batch(2).unwrap();
    assert_eq!(
        t[0],
        Tensor::from_vec(&[2, 2], vec![0f32, 1., 2., 3.]).unwrap()
    );
    assert_eq!(t[1], Tensor::from_vec(&[2], vec![10i64, 11]).unwrap());
    assert_eq!(
        t[2],
        Tensor::from_vec(&[2], vec![b"ab".to_vec(), b"xyz".to_vec()]).unwrap()
    );
    assert_eq!(
        t[3],
        Tensor::from_vec(
            &[2],
            vec!["Hé".as_bytes().to_vec(), "😀".as_bytes().to_vec()]
        )
        .unwrap()
    );
    assert_eq!(t[4], Tensor::from_vec(&[2], vec![true, false]).unwrap());
    let t = r.read_batch(2).unwrap();
    assert_eq!(
        t[2],
        Tensor::from_vec(&[2], vec![b"q".to_vec(), b"".to_vec()]).unwrap()
    );
    assert_eq!(
        t[3],
        Tensor::from_vec(&[2], vec![b"".to_vec(), b"a".to_vec()]).unwrap()
    );

    // Save mid-way, restore, continue.
    let bytes = crate::storage::serialize_blob("r", &BlobValue::Object(Arc::new(r))).unwrap();
    let back = crate::storage::deserialize_blob(&bytes)
        .unwrap()
        .object::<NpyReader>("NpyReader")
        .unwrap();
    assert_eq!(back.position(), 4);
    let t = back.read_batch(2).unwrap();
    assert_eq!(t[0], Tensor::from_vec(&[1, 2], vec![8f32, 9.]).unwrap());
    assert_eq!(t[3], Tensor::from_vec(&[1], vec![b"bc".to_vec()]).unwrap());
    let t = back.read_batch(2).unwrap();
    assert_eq!(t[0].shape(), &[0, 2]);
    assert_eq!(t[1].shape(), &[0]);
    back.reset();
    assert_eq!(back.read_batch(10).unwrap()[1].shape(), &[5]);
}

#[test]
fn npy_threads_get_every_row_once() {
    let s = Scratch::new();
    let a = s.path("a.npy");
    npy(
        &a,
        "<i4",
        &[1000],
        &le(&(0..1000).collect::<Vec<i32>>(), i32::to_le_bytes),
    );
    let r = NpyReader::open(&[a], 7).unwrap();
    let mut got: Vec<i32> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                sc.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let t = r.read_batch(7).unwrap();
                        if t[0].shape()[0] == 0 {
                            return mine;
                        }
                        mine.extend(t[0].array::<i32>().unwrap().iter().copied());
                    }
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    got.sort_unstable();
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
}

#[test]
fn a_failed_npy_read_loses_no_rows() {
    let s = Scratch::new();
    let p = s.path("rows.npy");
    let all: Vec<i32> = (0..6).collect();
    let whole = || npy(&p, "<i4", &[6], &le(&all, i32::to_le_bytes));
    whole();
    let r = NpyReader::open(std::slice::from_ref(&p), 2).unwrap();
    let rows = |t: &[Tensor]| {
        t[0].array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>()
    };
    assert_eq!(rows(&r.read_batch(2).unwrap()), vec![0, 1]);
    // The file is cut short (as by a copy in progress): the read fails.
    let bytes = fs::read(&p).unwrap();
    fs::write(&p, &bytes[..bytes.len() - 12]).unwrap();
    let e = r.read_batch(2).unwrap_err();
    assert!(e.message.contains(&p), "{}", e.message);
    assert_eq!(r.position(), 2);
    // Whole again: the next read hands out rows 2 and 3, not 4 and 5.
    whole();
    assert_eq!(rows(&r.read_batch(2).unwrap()), vec![2, 3]);
    assert_eq!(rows(&r.read_batch(2).unwrap()), vec![4, 5]);
    assert_eq!(r.read_batch(2).unwrap()[0].shape(), &[0]);
}

#[test]
fn bad_npy_files_name_the_file() {
    let s = Scratch::new();
    let good = s.path("good.npy");
    npy(&good, "<i4", &[3], &le(&[1i32, 2, 3], i32::to_le_bytes));
    type Make = Box<dyn Fn(&str)>;
    let cases: Vec<(&str, Make, &str)> = vec![
        ("missing.npy", Box::new(|_: &str| {}), "No such file"),
        (
            "magic.npy",
            Box::new(|p: &str| fs::write(p, b"PK\x03\x04 not numpy").unwrap()),
            "bad magic",
        ),
        (
            "short.npy",
            Box::new(|p: &str| npy(p, "<i4", &[3], &[0u8; 8])),
            "truncated or corrupt",
        ),
        (
            "obj.npy",
            Box::new(|p: &str| npy(p, "|O", &[1], &[0u8; 8])),
            "object arrays",
        ),
        (
            "u4.npy",
            Box::new(|p: &str| npy(p, "<u4", &[1], &[0u8; 4])),
            "'<u4' is not supported",
        ),
        (
            "f2.npy",
            Box::new(|p: &str| npy(p, "<f2", &[1], &[0u8; 2])),
            "'<f2' is not supported",
        ),
        (
            "scalar.npy",
            Box::new(|p: &str| npy(p, "<i4", &[], &[0u8; 4])),
            "0-dimensional",
        ),
        (
            "empty.npy",
            Box::new(|p: &str| fs::write(p, b"").unwrap()),
            "bad magic",
        ),
        // 4 * n wraps to 0 in 64 bits: a zero-size item, and a panic
        // on the first read, before sizes were checked.
        (
            "u_wraps.npy",
            Box::new(|p: &str| npy(p, "<U4611686018427387904", &[1], &[])),
            "too large",
        ),
        // 4 * n = 2**31: over numpy's limit of 2**31 - 1 bytes.
        (
            "u_big.npy",
            Box::new(|p: &str| npy(p, "<U536870912", &[1], &[])),
            "too large",
        ),
        (
            "s_huge.npy",
            Box::new(|p: &str| npy(p, "|S99999999999999999999999", &[1], &[])),
            "too large",
        ),
    ];
    for (name, make, want) in cases {
        let p = s.path(name);
        make(&p);
        let e = NpyReader::open(std::slice::from_ref(&p), 2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io, "{name}");
        assert!(
            e.message.contains(&p) && e.message.contains(want),
            "{name}: {}",
            e.message
        );
    }
    let other = s.path("four.npy");
    npy(&other, "<i4", &[4], &[0u8; 16]);
    let e = NpyReader::open(&[good.clone(), other.clone()], 2).unwrap_err();
    assert!(
        e.message.contains("same number of rows") && e.message.contains(&other),
        "{}",
        e.message
    );

    let ws = Workspace::new();
    run(
        &ws,
        op(
            "CreateNpyReader",
            &[],
            &["r"],
            vec![strings_arg("paths", &[&good]), int_arg("batch_size", 2)],
        ),
    )
    .unwrap();
    run(&ws, op("ReadNpyBatch", &["r"], &["x"], vec![])).unwrap();
    assert_eq!(
        get(&ws, "x"),
        Tensor::from_vec(&[2], vec![1i32, 2]).unwrap()
    );
    // The file shrinks under a reader: the read fails, naming it.
    npy(&good, "<i4", &[1], &[0u8; 4]);
    let e = run(&ws, op("ReadNpyBatch", &["r"], &["x"], vec![])).unwrap_err();
    assert!(e.message.contains(&good), "{}", e.message);
    run(&ws, op("ResetNpyReader", &["r"], &[], vec![])).unwrap();
    let e = run(&ws, op("ReadNpyBatch", &["r"], &["x", "y"], vec![])).unwrap_err();
    assert!(
        e.message.contains("needs 1 outputs, got 2"),
        "{}",
        e.message
    );
}
