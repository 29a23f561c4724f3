//! Input from key-value dbs (Caffe2's `caffe2/db` and
//! `TensorProtosDBInput`): `CreateDB` opens a db for reading and writes a
//! DB reader blob; `TensorProtosDBInput` reads `TensorProtos` records from
//! it, `batch_size` at a time, one output per tensor of a record.
//!
//! The db type is any key-value format of `storage::FORMATS`: `minidb`
//! (Caffe2's own record file) or `leveldb`/`LevelDB`, each read through the
//! format's [`storage::KvRecords`]; Caffe2's lmdb and rocksdb are not
//! available. As Caffe2's `DBReader::Read`, a reader hands out its records
//! in the db's order (a minidb's file order, a LevelDB's key order) and starts over at the first one after the last (with
//! `num_shards`, reader `shard_id` takes records `shard_id`,
//! `shard_id + num_shards`, ...). Unlike Caffe2, a batch is read atomically
//! (two ops sharing a reader never interleave their records), and there is
//! no prefetch thread: the op reads its batch when it runs.

use super::kit::by_dtype;
use super::kit::kernel;
use super::queue::{BlobsQueue, ReadOutcome};
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{BlobProto, TensorProtos};
use crate::operator::{OpDefCtx, OpSchema, Operator, MANY};
use crate::readers::{Dec, Enc};
use crate::storage::{self, KvRecords};
use crate::tensor::{concatenate, Element, Tensor};
use parking_lot::Mutex;
use prost::Message;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The type tag of a saved [`DbReader`].
pub const DB_READER_TAG: &str = "ferrocaffe::DBReader";

pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    vec![(DB_READER_TAG, decode_db_reader)]
}

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateBlobsQueueDB", create_blobs_queue_db)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[
                arg!("key_blob_index", "int", "-1 (keys are empty)", "the record's blob holding the key"),
                arg!("value_blob_index", "int", "0", "the record's blob holding the value"),
                arg!("timeout_secs", "float", "0 (wait for good)", "how long a read waits for a record"),
            ])
            .doc(
                "Input a blobs queue; outputs a DB reader (for TensorProtosDBInput) whose records are taken from \
                 the queue, each value a byte string or a one-element string tensor. A read that finds the queue \
                 closed and empty, or waits longer than timeout_secs, fails.",
            ),
        OpSchema::new("CreateDB", create_db)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("db", "string", "(required)", "the db's path"),
                arg!("db_type", "string", "\"leveldb\"", "the db's type: 'minidb' or 'leveldb'/'LevelDB'"),
                arg!("num_shards", "int", "1", "read every num_shards-th record ..."),
                arg!("shard_id", "int", "0", "... starting with this one (0 <= shard_id < num_shards)"),
            ])
            .doc(
                "Opens a db for reading and writes a DB reader: the input of TensorProtosDBInput. \
                 The reader hands out the records in order and starts over after the last.",
            ),
        OpSchema::new("TensorProtosDBInput", tensor_protos_db_input)
            .inputs(1, 1)
            .outputs(1, MANY)
            .args(&[arg!(
                "batch_size",
                "int",
                "0",
                "records per batch: each output is [batch_size, ...] (the records' tensors stacked along a new \
                 first axis); 0: one record, its tensors as they are"
            )])
            .doc(
                "Input a DB reader (CreateDB) whose records are serialized TensorProtos, each holding one tensor \
                 per output; outputs the next batch_size records' tensors. The db is read in a cycle.",
            ),
    ]
}

/// A reader over a key-value db (Caffe2's `db::DBReader`).
pub struct DbReader {
    db_type: String,
    records: Box<dyn KvRecords>,
    num_shards: usize,
    shard_id: usize,
    /// The index of the next record.
    pos: Mutex<usize>,
}

impl fmt::Debug for DbReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DBReader({} '{}', shard {} of {}, at record {:?} of {})",
            self.db_type,
            self.records.path(),
            self.shard_id,
            self.num_shards,
            self.pos.try_lock().map(|p| *p),
            self.records.len()
        )
    }
}

impl BlobObject for DbReader {
    fn kind_name(&self) -> &'static str {
        "DBReader"
    }
    fn serialize(&self) -> Option<BlobProto> {
        Some(object_proto(DB_READER_TAG, self.to_bytes()))
    }
}

const DB_READER_MAGIC: &[u8; 4] = b"FCDB";

impl DbReader {
    pub fn open(db_type: &str, path: &str, num_shards: usize, shard_id: usize) -> Result<DbReader> {
        if num_shards == 0 || shard_id >= num_shards {
            return Err(Error::invalid_arg(format!(
                "a DB reader needs 0 <= shard_id < num_shards, got shard_id {shard_id} and num_shards {num_shards}"
            )));
        }
        let records = storage::db_format(db_type)
            .map_err(|e| e.with_file(path))?
            .records(path)?;
        if shard_id >= records.len() {
            return Err(Error::invalid_arg(format!(
                "the db has fewer records ({}) than the reader's shard_id ({shard_id})",
                records.len()
            ))
            .with_file(path));
        }
        Ok(DbReader {
            db_type: db_type.to_string(),
            records,
            num_shards,
            shard_id,
            pos: Mutex::new(shard_id),
        })
    }

    pub fn path(&self) -> &str {
        self.records.path()
    }

    /// The next `n` records, `(key, value)`, taken at once: the position
    /// moves only if every value was read.
    pub fn read(&self, n: usize) -> Result<Vec<(String, Vec<u8>)>> {
        let mut pos = self.pos.lock();
        let mut at = *pos;
        // n records are read (in a cycle): room for them, fallibly.
        let mut out = crate::tensor::try_vec(n, format_args!("a batch of {n} records"))?;
        for _ in 0..n {
            out.push((self.records.key(at).to_string(), self.records.value(at)?));
            at += self.num_shards;
            if at >= self.records.len() {
                at = self.shard_id;
            }
        }
        *pos = at;
        Ok(out)
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut e = Enc::new(DB_READER_MAGIC);
        e.str(&self.db_type);
        e.str(self.records.path());
        e.u64(self.num_shards as u64);
        e.u64(self.shard_id as u64);
        e.u64(self.records.len() as u64);
        e.u64(*self.pos.lock() as u64);
        e.0
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<DbReader> {
        let mut d = Dec::new("DBReader", DB_READER_MAGIC, bytes)?;
        let db_type = d.str()?;
        let path = d.str()?;
        let int = |d: &mut Dec<'_>| -> Result<usize> {
            usize::try_from(d.u64()?).map_err(|_| d.bad("a number is out of range"))
        };
        let num_shards = int(&mut d)?;
        let shard_id = int(&mut d)?;
        let len = int(&mut d)?;
        let pos = int(&mut d)?;
        d.finish()?;
        if num_shards == 0 || shard_id >= num_shards || pos >= len {
            return Err(d.bad("its shard or position is out of range"));
        }
        let r = DbReader::open(&db_type, &path, num_shards, shard_id)?;
        if r.records.len() != len {
            return Err(Error::invalid_arg(format!(
                "cannot restore a DB reader: '{path}' now holds {} records but held {len} when the reader was saved",
                r.records.len()
            ))
            .with_file(&path));
        }
        *r.pos.lock() = pos;
        Ok(r)
    }
}

fn decode_db_reader(p: &BlobProto) -> Result<BlobValue> {
    let r = DbReader::from_bytes(p.content.as_deref().unwrap_or_default())?;
    Ok(BlobValue::Object(Arc::new(r)))
}

// ------------------------------------------------------------------- ops --

/// A DB whose records are taken from a blobs queue (Caffe2's
/// `BlobsQueueDB`): read once each, in queue order.
pub struct QueueDb {
    queue: Arc<BlobsQueue>,
    queue_name: String,
    key_index: Option<usize>,
    value_index: usize,
    timeout: Option<Duration>,
}

impl fmt::Debug for QueueDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobsQueueDB(queue '{}')", self.queue_name)
    }
}

impl BlobObject for QueueDb {
    fn kind_name(&self) -> &'static str {
        "BlobsQueueDB"
    }
}

/// A record's blob as bytes: a byte string or a one-element string tensor.
fn record_bytes(v: &BlobValue, what: &str) -> Result<Vec<u8>> {
    match v {
        BlobValue::Bytes(b) => Ok(b.to_vec()),
        BlobValue::Tensor(Tensor::Str(a)) if a.len() == 1 => {
            Ok(a.iter().next().cloned().unwrap_or_default())
        }
        other => Err(Error::type_error(format!(
            "the record's {what} must be a byte string or a one-element string tensor, got {}",
            other.kind_name()
        ))),
    }
}

impl QueueDb {
    /// The next `n` records, each `(key, value)`.
    fn read(
        &self,
        n: usize,
        cancel: &crate::cancel::CancelToken,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        // Up to n records, as the queue has them: the batch size is a bound.
        let mut out = Vec::with_capacity(n.min(1024));
        let mut slots = vec![BlobValue::Empty; self.queue.num_blobs()];
        for _ in 0..n {
            match self.queue.blocking_read(&mut slots, self.timeout, cancel)? {
                ReadOutcome::Read => {}
                ReadOutcome::Closed => {
                    return Err(Error::new(
                        ErrorKind::OperatorFailed,
                        format!("the queue '{}' is closed and empty", self.queue_name),
                    ))
                }
                ReadOutcome::TimedOut => {
                    return Err(Error::new(
                        ErrorKind::OperatorFailed,
                        format!(
                            "no record came from the queue '{}' in time",
                            self.queue_name
                        ),
                    ))
                }
            }
            let key = match self.key_index {
                Some(k) => String::from_utf8_lossy(&record_bytes(&slots[k], "key")?).into_owned(),
                None => String::new(),
            };
            out.push((key, record_bytes(&slots[self.value_index], "value")?));
        }
        Ok(out)
    }
}

fn create_blobs_queue_db(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let key_index = usize::try_from(ctx.args.i64("key_blob_index", -1)?).ok();
    let value_index = ctx.args.i64("value_blob_index", 0)?;
    let value_index = usize::try_from(value_index)
        .map_err(|_| ctx.bad_arg(format!("value_blob_index must be >= 0, got {value_index}")))?;
    let secs = ctx.args.f32("timeout_secs", 0.0)?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(ctx.bad_arg(format!("timeout_secs must be finite and >= 0, got {secs}")));
    }
    let timeout = (secs > 0.0).then(|| Duration::from_secs_f32(secs));
    Ok(kernel(move |cx| {
        let name = cx.io.input_names[0].clone();
        let queue = cx
            .input_blob(0)
            .read()
            .object::<BlobsQueue>("BlobsQueue")
            .map_err(|e| e.with_blob(&name))?;
        for i in key_index.iter().chain(std::iter::once(&value_index)) {
            if *i >= queue.num_blobs() {
                return Err(Error::invalid_arg(format!(
                    "the queue's records have {} blobs; index {i} is out of range",
                    queue.num_blobs()
                ))
                .with_blob(&name));
            }
        }
        let db = QueueDb {
            queue,
            queue_name: name,
            key_index,
            value_index,
            timeout,
        };
        cx.output_blob(0).set(BlobValue::Object(Arc::new(db)));
        Ok(true)
    }))
}

fn create_db(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let db = ctx.args.string("db", "")?;
    if db.is_empty() {
        return Err(ctx.bad_arg("Must specify a db name (argument 'db')"));
    }
    let db_type = ctx.args.string("db_type", "leveldb")?;
    storage::db_format(&db_type).map_err(|e| e.with_op(ctx.op_type(), None))?;
    let num_shards = ctx.args.i64("num_shards", 1)?;
    let shard_id = ctx.args.i64("shard_id", 0)?;
    if num_shards < 1 || shard_id < 0 || shard_id >= num_shards {
        return Err(ctx.bad_arg(format!(
            "needs num_shards >= 1 and 0 <= shard_id < num_shards, got num_shards {num_shards} and shard_id {shard_id}"
        )));
    }
    let (num_shards, shard_id) = (num_shards as usize, shard_id as usize);
    Ok(kernel(move |cx| {
        let r = DbReader::open(&db_type, &db, num_shards, shard_id)?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(r)));
        Ok(true)
    }))
}

fn stack<T: Element>(items: &[Tensor]) -> Result<Tensor> {
    let views = items
        .iter()
        .map(|t| Ok(t.array::<T>()?.view().insert_axis(ndarray::Axis(0))))
        .collect::<Result<Vec<_>>>()?;
    Ok(T::wrap(concatenate(0, &views)?))
}

fn tensor_protos_db_input(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = ctx.args.i64("batch_size", 0)?;
    if batch < 0 {
        return Err(ctx.bad_arg(format!("batch_size must be >= 0, got {batch}")));
    }
    let batch = usize::try_from(batch)
        .map_err(|_| ctx.bad_arg(format!("batch_size {batch} is too large")))?;
    Ok(kernel(move |cx| {
        let reader_name = &cx.io.input_names[0];
        let value = cx.input_blob(0).read();
        let (path, records) = match value.object::<QueueDb>("BlobsQueueDB") {
            Ok(q) => {
                drop(value);
                (
                    q.queue_name.clone(),
                    q.read(batch.max(1), cx.cancel)
                        .map_err(|e| e.with_blob(reader_name))?,
                )
            }
            Err(_) => {
                let r = value
                    .object::<DbReader>("DBReader")
                    .map_err(|e| e.with_blob(reader_name))?;
                drop(value);
                (r.path().to_string(), r.read(batch.max(1))?)
            }
        };
        let nout = cx.num_outputs();
        let mut columns: Vec<Vec<Tensor>> = (0..nout)
            .map(|_| Vec::with_capacity(records.len()))
            .collect();
        for (key, value) in records {
            let bad = |msg: String| {
                Error::new(
                    ErrorKind::CorruptCheckpoint,
                    format!("the record '{key}': {msg}"),
                )
                .with_file(&path)
                .with_blob(reader_name)
            };
            let protos = TensorProtos::decode(value.as_slice())
                .map_err(|e| bad(format!("cannot parse it as TensorProtos: {e}")))?;
            if protos.protos.len() != nout {
                return Err(Error::invalid_arg(format!(
                    "the record '{key}' holds {} tensors but the op has {nout} outputs (one per tensor)",
                    protos.protos.len()
                ))
                .with_file(&path)
                .with_blob(reader_name));
            }
            for (column, tp) in columns.iter_mut().zip(&protos.protos) {
                let t = storage::tensor_from_proto(tp).map_err(|e| bad(e.message.clone()))?;
                column.push(t);
            }
        }
        for (j, column) in columns.into_iter().enumerate() {
            let out = if batch == 0 {
                column
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::internal("no record read"))?
            } else {
                let first = &column[0];
                if let Some(other) = column
                    .iter()
                    .find(|t| t.dtype() != first.dtype() || t.shape() != first.shape())
                {
                    return Err(Error::shape(format!(
                        "the records of a batch must hold tensors of one shape and type for output {j} ('{}'): \
                         {:?} {} and {:?} {} were read",
                        cx.io.output_names[j],
                        first.shape(),
                        first.dtype(),
                        other.shape(),
                        other.dtype()
                    ))
                    .with_file(&path)
                    .with_blob(reader_name));
                }
                by_dtype!(first.dtype(), stack(&column))?
            };
            cx.output_blob(j).set(BlobValue::Tensor(out));
        }
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::TensorProto;
    use crate::test_util::{get, op, run};
    use crate::workspace::Workspace;
    use std::io::Write;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ferrocaffe-db-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("db")
    }

    fn str_arg(name: &str, v: &str) -> crate::ir::Argument {
        crate::ir::Argument {
            name: Some(name.into()),
            s: Some(v.as_bytes().to_vec()),
            ..Default::default()
        }
    }

    fn int_arg(name: &str, v: i64) -> crate::ir::Argument {
        crate::ir::Argument {
            name: Some(name.into()),
            i: Some(v),
            ..Default::default()
        }
    }

    /// A minidb of `n` records: record i holds a float [2] (i, -i) and an
    /// int32 scalar-shaped [1] label i % 3.
    fn write_db(path: &std::path::Path, n: usize) {
        let mut f = std::fs::File::create(path).unwrap();
        for i in 0..n {
            let x = TensorProto {
                dims: vec![2],
                data_type: Some(1),
                float_data: vec![i as f32, -(i as f32)],
                ..Default::default()
            };
            let y = TensorProto {
                dims: vec![1],
                data_type: Some(2),
                int32_data: vec![(i % 3) as i32],
                ..Default::default()
            };
            let v = TensorProtos { protos: vec![x, y] }.encode_to_vec();
            let k = format!("{i:04}");
            f.write_all(&(k.len() as i32).to_ne_bytes()).unwrap();
            f.write_all(&(v.len() as i32).to_ne_bytes()).unwrap();
            f.write_all(k.as_bytes()).unwrap();
            f.write_all(&v).unwrap();
        }
    }

    /// The CreateDB op that opens `path` (of `db_type`) into the reader `r`.
    fn create_db_op(path: &str, db_type: &str) -> crate::ir::OperatorDef {
        op(
            "CreateDB",
            &[],
            &["r"],
            vec![str_arg("db", path), str_arg("db_type", db_type)],
        )
    }

    /// Runs TensorProtosDBInput on the reader `r` (batch_size `batch`).
    fn read_batch(ws: &Arc<Workspace>, outputs: &[&str], batch: i64) {
        let read = op(
            "TensorProtosDBInput",
            &["r"],
            outputs,
            vec![int_arg("batch_size", batch)],
        );
        run(ws, read).unwrap();
    }

    /// The shape and values of the tensor in blob `name`.
    fn values<T: Element + Copy>(ws: &Arc<Workspace>, name: &str) -> (Vec<usize>, Vec<T>) {
        let t = get(ws, name);
        let a = t.array::<T>().unwrap();
        (a.shape().to_vec(), a.iter().copied().collect())
    }

    #[test]
    fn batches_cycle_through_the_records() {
        let path = scratch("cycle");
        write_db(&path, 5);
        let ws = Workspace::new();
        run(&ws, create_db_op(path.to_str().unwrap(), "minidb")).unwrap();
        read_batch(&ws, &["x", "y"], 3);
        assert_eq!(values::<f32>(&ws, "x").0, [3, 2]);
        // Records 3, 4 and (starting over) 0; labels i % 3.
        read_batch(&ws, &["x", "y"], 3);
        assert_eq!(
            values::<f32>(&ws, "x").1,
            vec![3.0, -3.0, 4.0, -4.0, 0.0, -0.0]
        );
        assert_eq!(values::<i32>(&ws, "y"), (vec![3, 1], vec![0, 1, 0]));
    }

    /// Caffe2's LevelDB data dbs: TensorProtos records, read in key order.
    #[test]
    fn a_leveldb_of_tensor_protos_is_read_in_key_order() {
        let path = scratch("leveldb");
        let p = path.to_str().unwrap();
        // Written out of order; keys sort bytewise: "a", "b", "c".
        let recs: Vec<(Vec<u8>, Vec<u8>)> = [("c", 3.0f32), ("a", 1.0), ("b", 2.0)]
            .iter()
            .map(|(k, x)| {
                let t = TensorProto {
                    dims: vec![1],
                    data_type: Some(1),
                    float_data: vec![*x],
                    ..Default::default()
                };
                (
                    k.as_bytes().to_vec(),
                    TensorProtos { protos: vec![t] }.encode_to_vec(),
                )
            })
            .collect();
        storage::write_leveldb_records(p, &recs).unwrap();
        let ws = Workspace::new();
        run(&ws, create_db_op(p, "LevelDB")).unwrap();
        read_batch(&ws, &["x"], 2);
        assert_eq!(values::<f32>(&ws, "x").1, vec![1.0, 2.0]);
        read_batch(&ws, &["x"], 2);
        assert_eq!(values::<f32>(&ws, "x").1, vec![3.0, 1.0]);
    }

    #[test]
    fn bad_arguments_and_mismatched_outputs_are_errors() {
        let path = scratch("errors");
        write_db(&path, 2);
        let p = path.to_str().unwrap();
        let ws = Workspace::new();
        // The default db_type is Caffe2's 'leveldb': a minidb file is not one.
        let e = run(&ws, op("CreateDB", &[], &["r"], vec![str_arg("db", p)])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(e.to_string().contains("not a LevelDB"), "{e}");
        assert!(e.to_string().contains(p), "{e}");
        let e = run(
            &ws,
            op("CreateDB", &[], &["r"], vec![str_arg("db_type", "minidb")]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        run(&ws, create_db_op(p, "minidb")).unwrap();
        let e = run(&ws, op("TensorProtosDBInput", &["r"], &["x"], vec![])).unwrap_err();
        assert!(e.to_string().contains("holds 2 tensors"), "{e}");
        let e = run(
            &ws,
            op(
                "CreateDB",
                &[],
                &["s"],
                vec![
                    str_arg("db", p),
                    str_arg("db_type", "minidb"),
                    int_arg("shard_id", 2),
                    int_arg("num_shards", 3),
                ],
            ),
        )
        .unwrap_err();
        assert!(e.to_string().contains("fewer records"), "{e}");
    }
}

/// A saved object's BlobProto: its type tag and content.
fn object_proto(tag: &str, content: Vec<u8>) -> crate::ir::BlobProto {
    crate::ir::BlobProto {
        r#type: Some(tag.to_string()),
        content: Some(content),
        ..Default::default()
    }
}
