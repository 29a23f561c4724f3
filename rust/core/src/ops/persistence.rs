//! Save, Load and DBExists: blobs to and from dbs on disk (formats and crash
//! safety in [`crate::storage`]).
//!
//! Save snapshots each input under a short read lock and writes the file
//! afterwards, so no blob stays locked during file I/O. Load decodes every
//! db completely before it touches a single output, so a failed Load leaves
//! the workspace as it was.

use super::kit::kernel;
use crate::arg;
use crate::blob::BlobValue;
use crate::error::{Error, Result};
use crate::operator::{OpDefCtx, OpSchema, Operator, MANY};
use crate::storage::{self, SaveOptions};
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

const DB_TYPE_DOC: &str =
    "'ferro' (ferrocaffe's checked format), 'minidb' or 'leveldb'/'LevelDB' (Caffe2's); lmdb and rocksdb are not supported";

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("Save", save)
            .inputs(1, MANY)
            .outputs(0, 0)
            .args(&[
                arg!("db", "string", "required", "the db path; see absolute_path"),
                arg!("db_type", "string", "required", DB_TYPE_DOC),
                arg!("absolute_path", "int", "0", "non-zero: use db as is; else '<workspace root folder>/<db>' (fixed when the op is built)"),
                arg!("strip_prefix", "string", "\"\"", "stored name = the input name after the first occurrence of this (names without it are kept)"),
                arg!("blob_name_overrides", "list of strings", "[]", "stored names, one per input; not with strip_prefix"),
                arg!("chunk_size", "int", "-1", "tensor elements per minidb record: -1 = 1,000,000, 0 = no chunking; ignored by 'ferro'"),
                arg!(
                    "options",
                    "string (a serialized SerializationOptions)",
                    "none",
                    "per-blob options, the first whose blob_name_regex matches the whole stored name (empty: every \
                     blob) applies: chunk_size (0 = 1,000,000, -1 = no chunking; before the chunk_size argument, which \
                     applies to the blobs no option matches) and float_format (FLOAT_BFLOAT16: float32 tensors stored \
                     as bfloat16 in a minidb; ferro keeps every bit)"
                ),
            ])
            .doc(
                "Writes its inputs to a new db, replacing any db at that path atomically (a db that exists is \
                 complete). Tensors, byte strings and objects with a serializer (counters, mutexes, cursors) can be saved.",
            ),
        OpSchema::new("Checkpoint", checkpoint)
            .inputs(1, MANY)
            .outputs(0, 0)
            .args(&[
                arg!("db", "string", "required", "the db path pattern, a printf format with one integer conversion (e.g. %05d) that the iteration fills; see absolute_path"),
                arg!("db_type", "string", "required", DB_TYPE_DOC),
                arg!("every", "int", "1", "save only at iterations that are a multiple of this (positive)"),
                arg!("absolute_path", "int", "0", "non-zero: use db as is; else '<workspace root folder>/<db>'"),
                arg!("strip_prefix", "string", "\"\"", "as for Save"),
                arg!("blob_name_overrides", "list of strings", "[]", "as for Save"),
                arg!("chunk_size", "int", "-1", "as for Save"),
                arg!("options", "string (a serialized SerializationOptions)", "none", "as for Save"),
            ])
            .doc(
                "Input 0 is the iteration (an int64 tensor, as written by Iter). When it is a multiple of every, \
                 saves every input (the iteration too) as Save does, to the db named by the db pattern formatted \
                 with the iteration; otherwise does nothing.",
            ),
        OpSchema::new("Load", load)
            .inputs(0, MANY)
            .outputs(0, MANY)
            .args(&[
                arg!("db", "string", "\"\"", "the db path (one of db and dbs is required); see absolute_path"),
                arg!("dbs", "list of strings", "[]", "several db paths, unique; used instead of db"),
                arg!("db_type", "string", "required", DB_TYPE_DOC),
                arg!("absolute_path", "int", "0", "non-zero: use the paths as they are; else '<workspace root folder>/<db>'"),
                arg!("add_prefix", "string", "\"\"", "prepended to every stored name"),
                arg!("strip_prefix", "string", "\"\"", "removed, with everything before its first occurrence, from stored names"),
                arg!("keep_device", "int", "0", "accepted for compatibility; everything is on the CPU"),
                arg!("load_all", "int", "0", "non-zero: load every blob of the db(s) into the workspace; each output must be among them"),
                arg!("allow_incomplete", "bool", "false", "do not fail when some outputs are not in the db(s)"),
                arg!("source_blob_names", "list of strings", "[]", "the names to load, one per output; not with strip_prefix or load_all"),
            ])
            .ignores(&[arg!("shape", "list of int", "[]", "read by Caffe2's Load but never used; accepted and ignored")])
            .doc(
                "Loads blobs from one or more dbs into its outputs (matched by name). Everything is decoded and checked \
                 before any output is written. DBReader inputs are not supported.",
            ),
        OpSchema::new("DBExists", db_exists)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("db_name", "string", "required", "the db path; see absolute_path"),
                arg!("db_type", "string", "required", DB_TYPE_DOC),
                arg!("absolute_path", "int", "0", "non-zero: use db_name as is; else '<workspace root folder>/<db_name>'"),
            ])
            .doc("Outputs a bool scalar: whether the db exists (saves are atomic, so an existing db is complete)."),
    ]
}

/// Caffe2's path rule: relative names live under the workspace root folder.
fn full_path(root: &str, db: &str, absolute: bool) -> String {
    if absolute {
        db.to_string()
    } else {
        format!("{root}/{db}")
    }
}

/// A required, known db type.
fn db_type_arg(ctx: &OpDefCtx<'_>) -> Result<String> {
    let db_type = ctx.args.string("db_type", "")?;
    if db_type.is_empty() {
        return Err(ctx.bad_arg(format!(
            "{} needs a 'db_type' argument (Must specify a db type.)",
            ctx.op_type()
        )));
    }
    storage::db_format(&db_type).map_err(|e| e.with_op(ctx.op_type(), None))?;
    Ok(db_type)
}

/// Everything after the first occurrence of `prefix`; the name itself if it
/// does not occur (Caffe2's strip_prefix).
fn strip<'a>(name: &'a str, prefix: &str) -> &'a str {
    if prefix.is_empty() {
        return name;
    }
    match name.find(prefix) {
        Some(at) => &name[at + prefix.len()..],
        None => name,
    }
}

// ------------------------------------------------------------------ Save --

fn save(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    save_op(ctx, None)
}

/// Caffe2's Checkpoint: a Save whose db path is a pattern formatted with the
/// iteration (input 0), run every `every` iterations.
fn checkpoint(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let every = ctx.args.i64("every", 1)?;
    if every <= 0 {
        return Err(ctx.bad_arg(format!(
            "Checkpoint interval should be positive: 'every' is {every}"
        )));
    }
    let db = ctx.args.string("db", "")?;
    // The pattern is checked now, with a sample iteration.
    format_iteration(&db, 0).map_err(|m| ctx.bad_arg(m))?;
    save_op(ctx, Some(every))
}

/// Caffe2's `FormatString(pattern, iter)` for the patterns that make sense
/// with one integer: exactly one conversion among %d, %i, %u (with l, ll or
/// j length modifiers), with flags `-`, `0`, `+`, ` ` and a width; `%%` is
/// a percent sign. Anything else is refused (C's sprintf would read garbage).
pub(crate) fn format_iteration(pattern: &str, iter: i64) -> std::result::Result<String, String> {
    let bad = |why: &str| {
        format!("the checkpoint db pattern '{pattern}' {why}: it needs exactly one integer conversion such as %d or %05d")
    };
    let mut out = String::new();
    let mut used = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let (mut left, mut zero, mut plus, mut space) = (false, false, false, false);
        while let Some(&f) = chars.peek() {
            match f {
                '-' => left = true,
                '0' => zero = true,
                '+' => plus = true,
                ' ' => space = true,
                _ => break,
            }
            chars.next();
        }
        let mut width = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(d);
            chars.next();
        }
        while matches!(chars.peek(), Some('l') | Some('j')) {
            chars.next();
        }
        let conv = chars.next();
        if !matches!(conv, Some('d') | Some('i') | Some('u')) {
            return Err(bad("has a conversion that is not an integer one"));
        }
        if used {
            return Err(bad("has more than one conversion"));
        }
        used = true;
        let width: usize = if width.is_empty() {
            0
        } else {
            width
                .parse()
                .ok()
                .filter(|w| *w <= 4096)
                .ok_or_else(|| bad("has a width that is too large"))?
        };
        let mut digits = if conv == Some('u') {
            (iter as u64).to_string()
        } else {
            iter.unsigned_abs().to_string()
        };
        let sign = if conv != Some('u') && iter < 0 {
            "-"
        } else if plus && conv != Some('u') {
            "+"
        } else if space && conv != Some('u') {
            " "
        } else {
            ""
        };
        let len = sign.len() + digits.len();
        if len < width {
            if left {
                digits = format!("{sign}{digits}{}", " ".repeat(width - len));
            } else if zero {
                digits = format!("{sign}{}{digits}", "0".repeat(width - len));
            } else {
                digits = format!("{}{sign}{digits}", " ".repeat(width - len));
            }
        } else {
            digits = format!("{sign}{digits}");
        }
        out.push_str(&digits);
    }
    if !used {
        return Err(bad("has no conversion"));
    }
    Ok(out)
}

fn save_op(ctx: &OpDefCtx<'_>, every: Option<i64>) -> Result<Box<dyn Operator>> {
    let op_name = ctx.op_type();
    let db = ctx.args.string("db", "")?;
    if db.is_empty() {
        return Err(ctx.bad_arg(format!(
            "{op_name} needs a non-empty 'db' argument (Must specify a db name.)"
        )));
    }
    let db_type = db_type_arg(ctx)?;
    let absolute = ctx.args.bool("absolute_path", false)?;
    let strip_prefix = ctx.args.string("strip_prefix", "")?;
    let overrides = ctx
        .args
        .string_list("blob_name_overrides")?
        .unwrap_or_default();
    let chunk_size = ctx.args.i64("chunk_size", -1)?;
    if chunk_size < -1 {
        return Err(ctx.bad_arg(format!(
            "chunk_size must be -1 (the default), 0 (no chunking) or positive, got {chunk_size}"
        )));
    }
    let names: Vec<String> = if overrides.is_empty() {
        ctx.def
            .input
            .iter()
            .map(|n| strip(n, &strip_prefix).to_string())
            .collect()
    } else {
        if overrides.len() != ctx.num_inputs() {
            return Err(ctx.bad_arg(format!(
                "Number of blobs and blob_name_overrides mismatch: {} inputs, {} names",
                ctx.num_inputs(),
                overrides.len()
            )));
        }
        if !strip_prefix.is_empty() {
            return Err(ctx.bad_arg("strip_prefix and blob_name_overrides are mutually exclusive."));
        }
        overrides
    };
    let mut seen = HashSet::new();
    for n in &names {
        if !seen.insert(n.as_str()) {
            return Err(ctx
                .bad_arg(format!(
                    "Duplicated feature: more than one input would be stored as '{n}'"
                ))
                .with_blob(n));
        }
    }
    // Caffe2 fixes the path when the op is built (a checkpoint's pattern is
    // filled in when it runs).
    let root = ctx.ws.root_folder();
    let path = full_path(&root, &db, absolute);
    let opts = SaveOptions {
        chunk_size,
        per_blob: serialization_options(ctx)?,
    };
    Ok(kernel(move |cx| {
        // Write straight from the blobs (no copy of the data), holding their
        // read locks in the global lock order for the duration of the save:
        // writers of these blobs wait, readers do not.
        let locked = cx.lock();
        let path = match every {
            None => Cow::Borrowed(path.as_str()),
            Some(every) => {
                let t = locked
                    .input(0)
                    .tensor()
                    .map_err(|e| e.with_blob(&names[0]))?;
                let iter = t
                    .array::<i64>()
                    .ok()
                    .and_then(|a| a.iter().copied().next())
                    .ok_or_else(|| {
                        Error::type_error(format!(
                            "Checkpoint's input 0 must be the iteration, an int64 tensor with an element; got {} of shape {:?}",
                            t.dtype(),
                            t.shape()
                        ))
                        .with_blob(&names[0])
                    })?;
                if iter % every != 0 {
                    return Ok(true);
                }
                let db = format_iteration(&db, iter).map_err(Error::invalid_arg)?;
                Cow::Owned(full_path(&root, &db, absolute))
            }
        };
        let entries: Vec<(&str, &BlobValue)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), locked.input(i)))
            .collect();
        cx.cancel.check()?;
        storage::save_blob_refs_with(&path, &db_type, &entries, &opts)?;
        Ok(true)
    }))
}

/// Save's `options` argument (Caffe2's serialized `SerializationOptions`),
/// checked when the op is built.
fn serialization_options(ctx: &OpDefCtx<'_>) -> Result<Vec<storage::BlobOptions>> {
    use prost::Message;
    let Some(bytes) = ctx.args.bytes_opt("options")? else {
        return Ok(Vec::new());
    };
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let parsed = crate::ir::SerializationOptions::decode(bytes.as_slice())
        .map_err(|e| ctx.bad_arg(format!("unable to parse serialization options: {e}")))?;
    let mut out = Vec::with_capacity(parsed.options.len());
    for (i, o) in parsed.options.iter().enumerate() {
        let regex = o.blob_name_regex.as_deref().unwrap_or("");
        let pattern = if regex.is_empty() {
            None
        } else {
            Some(regex::Regex::new(&format!("^(?:{regex})$")).map_err(|e| {
                ctx.bad_arg(format!(
                    "options entry {i}: blob_name_regex '{regex}' is not a valid regular expression: {e}"
                ))
            })?)
        };
        let chunk_size = o.chunk_size.unwrap_or(0);
        if chunk_size < -1 {
            return Err(ctx.bad_arg(format!(
                "options entry {i}: chunk_size must be 0 (the default), -1 (no chunking) or positive, got {chunk_size}"
            )));
        }
        let bfloat16 = match o.float_format.unwrap_or(0) {
            0 | 1 => false,
            2 => true,
            f => {
                return Err(ctx.bad_arg(format!(
                    "options entry {i}: float_format must be FLOAT_DEFAULT (0), FLOAT_PROTOBUF (1) or FLOAT_BFLOAT16 (2), got {f}"
                )))
            }
        };
        out.push(storage::BlobOptions {
            pattern,
            chunk_size,
            bfloat16,
        });
    }
    Ok(out)
}

// ------------------------------------------------------------------ Load --

struct LoadSpec {
    dbs: Vec<String>,
    db_type: String,
    absolute: bool,
    add_prefix: String,
    strip_prefix: String,
    load_all: bool,
    allow_incomplete: bool,
    /// Blob name (after prefixing) -> output index; empty with load_all.
    wanted: HashMap<String, usize>,
}

impl LoadSpec {
    /// The blob name a stored name loads into (Caffe2's buildBlobNameFromDbKey;
    /// the chunk suffix is already gone).
    fn target(&self, stored: &str) -> String {
        format!("{}{}", self.add_prefix, strip(stored, &self.strip_prefix))
    }
}

fn load(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    if ctx.num_inputs() > 0 {
        return Err(ctx.bad_arg(
            "Load from DBReader inputs is not supported by ferrocaffe: give the db path with the 'db' or 'dbs' argument",
        ));
    }
    let db_type = db_type_arg(ctx)?;
    let db = ctx.args.string("db", "")?;
    let mut dbs = ctx.args.string_list("dbs")?.unwrap_or_default();
    if dbs.is_empty() {
        if db.is_empty() {
            return Err(
                ctx.bad_arg("Load needs a 'db' or 'dbs' argument (Must specify a db name.)")
            );
        }
        dbs.push(db);
    } else {
        let mut seen = HashSet::new();
        for d in &dbs {
            if d.is_empty() {
                return Err(ctx.bad_arg("Db name should not be empty."));
            }
            if !seen.insert(d.as_str()) {
                return Err(ctx.bad_arg(format!("Duplicated db name: {d}")));
            }
        }
    }
    let absolute = ctx.args.bool("absolute_path", false)?;
    let add_prefix = ctx.args.string("add_prefix", "")?;
    let strip_prefix = ctx.args.string("strip_prefix", "")?;
    let _keep_device = ctx.args.bool("keep_device", false)?;
    let load_all = ctx.args.bool("load_all", false)?;
    let allow_incomplete = ctx.args.bool("allow_incomplete", false)?;
    let sources = ctx
        .args
        .string_list("source_blob_names")?
        .unwrap_or_default();
    if !sources.is_empty() {
        if sources.len() != ctx.num_outputs() {
            return Err(ctx.bad_arg(format!(
                "Number of output blobs and source_blob_names mismatch: {} outputs, {} names",
                ctx.num_outputs(),
                sources.len()
            )));
        }
        if !strip_prefix.is_empty() {
            return Err(ctx.bad_arg("strip_prefix and source_blob_names are mutually exclusive."));
        }
        if load_all {
            return Err(ctx.bad_arg("cannot use load_all together with source_blob_names."));
        }
    }
    let mut wanted = HashMap::new();
    if !load_all {
        let names = if sources.is_empty() {
            &ctx.def.output
        } else {
            &sources
        };
        for (i, n) in names.iter().enumerate() {
            if wanted.insert(n.clone(), i).is_some() {
                return Err(ctx
                    .bad_arg(format!("Duplicated source blob name: {n}"))
                    .with_blob(n));
            }
        }
    }
    let spec = LoadSpec {
        dbs,
        db_type,
        absolute,
        add_prefix,
        strip_prefix,
        load_all,
        allow_incomplete,
        wanted,
    };
    Ok(kernel(move |cx| {
        let spec = &spec;
        let root = cx.ws.root_folder();
        let paths: Vec<String> = spec
            .dbs
            .iter()
            .map(|d| full_path(&root, d, spec.absolute))
            .collect();
        // 1. Decode everything; no blob is touched until all of it checks out.
        let mut found: Vec<(String, BlobValue)> = Vec::new();
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (i, path) in paths.iter().enumerate() {
            cx.cancel.check()?;
            let select =
                |stored: &str| spec.load_all || spec.wanted.contains_key(&spec.target(stored));
            for (stored, value) in storage::load_db_select(path, &spec.db_type, &select)? {
                let target = spec.target(&stored);
                if let Some(&j) = owner.get(&target) {
                    let msg = if j == i {
                        format!(
                            "Duplicate Key {target} is found! (two blobs of '{path}' load into it)"
                        )
                    } else {
                        format!(
                            "Duplicate Key {target} is found! (in both '{}' and '{path}')",
                            paths[j]
                        )
                    };
                    return Err(Error::failed(msg).with_blob(&target).with_file(path));
                }
                owner.insert(target.clone(), i);
                found.push((target, value));
            }
        }
        // 2. Check that every output is there.
        let files = paths.join(", ");
        if spec.load_all {
            if let Some(name) = cx.io.output_names.iter().find(|n| !owner.contains_key(*n)) {
                return Err(Error::failed(format!(
                    "Output blob name {name} does not exist in the db(s)."
                ))
                .with_blob(name)
                .with_file(&files));
            }
        } else if found.len() != spec.wanted.len() && !spec.allow_incomplete {
            let mut missing: Vec<(usize, &String)> = spec
                .wanted
                .iter()
                .filter(|(n, _)| !owner.contains_key(*n))
                .map(|(n, &i)| (i, n))
                .collect();
            missing.sort();
            let list: Vec<String> = missing
                .iter()
                .map(|&(i, src)| {
                    let out = &cx.io.output_names[i];
                    if out == src {
                        format!("'{out}'")
                    } else {
                        format!("'{out}' (stored as '{src}')")
                    }
                })
                .collect();
            let first = &cx.io.output_names[missing[0].0];
            return Err(Error::failed(format!(
                "Expected to load {} blobs, got {} only. Not found: {}",
                spec.wanted.len(),
                found.len(),
                list.join(", ")
            ))
            .with_blob(first)
            .with_file(&files));
        }
        // 3. Assign, one short write lock per blob.
        for (target, value) in found {
            if spec.load_all {
                cx.ws.create_blob(&target).set(value);
            } else {
                cx.output_blob(spec.wanted[&target]).set(value);
            }
        }
        Ok(true)
    }))
}

// -------------------------------------------------------------- DBExists --

fn db_exists(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let db_name = ctx.args.string("db_name", "")?;
    if db_name.is_empty() {
        return Err(ctx.bad_arg("DBExists needs a non-empty 'db_name' argument"));
    }
    let db_type = db_type_arg(ctx)?;
    let absolute = ctx.args.bool("absolute_path", false)?;
    Ok(kernel(move |cx| {
        let path = full_path(&cx.ws.root_folder(), &db_name, absolute);
        let exists = storage::db_exists(&path, &db_type)?;
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::scalar(exists)));
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use crate::blob::{BlobMutex, BlobValue, Counter};
    use crate::error::{Error, ErrorKind};
    use crate::ir::{Argument, BlobProto, OperatorDef};
    use crate::operator::create_operator;
    use crate::tensor::Tensor;
    use crate::test_util::{get as out, int_arg, op, run, string_arg, strings_arg, tensor};
    use crate::workspace::Workspace;
    use prost::Message;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            static N: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "ferrocaffe-persistence-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
        fn root(&self) -> String {
            self.0.to_string_lossy().into_owned()
        }
        fn file(&self, name: &str) -> String {
            self.0.join(name).to_string_lossy().into_owned()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn build_err(ws: &Arc<Workspace>, d: &OperatorDef) -> Error {
        create_operator(d, ws).err().expect("building should fail")
    }
    fn save_op(ins: &[&str], db: &str, db_type: &str, mut more: Vec<Argument>) -> OperatorDef {
        more.extend([string_arg("db", db), string_arg("db_type", db_type)]);
        op("Save", ins, &[], more)
    }
    fn load_op(outs: &[&str], db: &str, db_type: &str, mut more: Vec<Argument>) -> OperatorDef {
        more.extend([string_arg("db", db), string_arg("db_type", db_type)]);
        op("Load", &[], outs, more)
    }

    /// A workspace rooted in the scratch dir holding one blob of every kind.
    fn filled(dir: &Scratch) -> Arc<Workspace> {
        let ws = Workspace::with_root(&dir.root());
        ws.feed(
            "w",
            BlobValue::Tensor(tensor(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])),
        );
        ws.feed("ids", BlobValue::Tensor(tensor(&[2], vec![7i64, -8])));
        ws.feed(
            "names",
            BlobValue::Tensor(tensor(&[2], vec![b"a".to_vec(), b"bc".to_vec()])),
        );
        ws.feed("empty", BlobValue::Tensor(tensor::<f64>(&[0, 2], vec![])));
        ws.feed("scalar", BlobValue::Tensor(Tensor::scalar(true)));
        ws.feed("counter", BlobValue::Object(Arc::new(Counter::new(11))));
        ws.feed("mutex", BlobValue::Object(Arc::new(BlobMutex::default())));
        ws.feed("bytes", BlobValue::Bytes(b"raw\x00".to_vec()));
        ws
    }

    const ALL: [&str; 8] = [
        "w", "ids", "names", "empty", "scalar", "counter", "mutex", "bytes",
    ];

    fn check_restored(ws: &Arc<Workspace>) {
        assert_eq!(
            out(ws, "w"),
            tensor(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        assert_eq!(out(ws, "ids"), tensor(&[2], vec![7i64, -8]));
        assert_eq!(
            out(ws, "names"),
            tensor(&[2], vec![b"a".to_vec(), b"bc".to_vec()])
        );
        assert_eq!(out(ws, "empty"), tensor::<f64>(&[0, 2], vec![]));
        assert_eq!(out(ws, "scalar"), Tensor::scalar(true));
        assert_eq!(
            ws.fetch("counter")
                .unwrap()
                .object::<Counter>("Counter")
                .unwrap()
                .get(),
            11
        );
        ws.fetch("mutex")
            .unwrap()
            .object::<BlobMutex>("Mutex")
            .unwrap();
        assert!(matches!(ws.fetch("bytes").unwrap(), BlobValue::Bytes(b) if b == b"raw\x00"));
    }

    #[test]
    fn save_then_load_restores_every_kind() {
        let dir = Scratch::new();
        for db_type in ["ferro", "minidb"] {
            let ws = filled(&dir);
            run(&ws, &save_op(&ALL, "ckpt", db_type, vec![])).unwrap();
            assert!(std::path::Path::new(&dir.file("ckpt")).is_file());
            let fresh = Workspace::with_root(&dir.root());
            run(&fresh, &load_op(&ALL, "ckpt", db_type, vec![])).unwrap();
            check_restored(&fresh);
            // load_all brings everything, by stored name.
            let all = Workspace::with_root(&dir.root());
            run(
                &all,
                &load_op(
                    &[],
                    "ckpt",
                    db_type,
                    vec![int_arg("load_all", 1), int_arg("keep_device", 1)],
                ),
            )
            .unwrap();
            check_restored(&all);
            // absolute paths skip the root folder.
            let other = Workspace::new();
            run(
                &other,
                &load_op(
                    &["w"],
                    &dir.file("ckpt"),
                    db_type,
                    vec![int_arg("absolute_path", 1)],
                ),
            )
            .unwrap();
            assert_eq!(out(&other, "w").shape(), &[2, 3]);
        }
    }

    #[test]
    fn saved_minidb_is_caffe2s_format() {
        let dir = Scratch::new();
        let ws = filled(&dir);
        run(
            &ws,
            &save_op(
                &["w", "counter"],
                "m",
                "minidb",
                vec![int_arg("chunk_size", 4)],
            ),
        )
        .unwrap();
        let bytes = std::fs::read(dir.file("m")).unwrap();
        let mut at = 0;
        let mut keys = Vec::new();
        while at < bytes.len() {
            let kl = i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let vl = i32::from_ne_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            keys.push(String::from_utf8(bytes[at + 8..at + 8 + kl].to_vec()).unwrap());
            let bp = BlobProto::decode(&bytes[at + 8 + kl..at + 8 + kl + vl]).unwrap();
            assert!(bp.r#type.is_some());
            at += 8 + kl + vl;
        }
        assert_eq!(keys, ["w#%0", "w#%1", "counter"]);
    }

    #[test]
    fn save_names_strip_prefix_and_overrides() {
        let dir = Scratch::new();
        let ws = Workspace::with_root(&dir.root());
        ws.feed("gpu_0/w", BlobValue::Tensor(Tensor::scalar(1i32)));
        ws.feed("b", BlobValue::Tensor(Tensor::scalar(2i32)));
        run(
            &ws,
            &save_op(
                &["gpu_0/w", "b"],
                "s",
                "ferro",
                vec![string_arg("strip_prefix", "/")],
            ),
        )
        .unwrap();
        let names: Vec<String> = crate::storage::list_db(&dir.file("s"), "ferro")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["w", "b"]);
        run(
            &ws,
            &save_op(
                &["gpu_0/w", "b"],
                "o",
                "ferro",
                vec![strings_arg("blob_name_overrides", &["x", "y"])],
            ),
        )
        .unwrap();
        let names: Vec<String> = crate::storage::list_db(&dir.file("o"), "ferro")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["x", "y"]);

        let e = build_err(
            &ws,
            &save_op(
                &["gpu_0/w", "b"],
                "o",
                "ferro",
                vec![strings_arg("blob_name_overrides", &["x"])],
            ),
        );
        assert!(e.message.contains("blob_name_overrides mismatch"), "{e}");
        let e = build_err(
            &ws,
            &save_op(
                &["gpu_0/w"],
                "o",
                "ferro",
                vec![
                    strings_arg("blob_name_overrides", &["x"]),
                    string_arg("strip_prefix", "/"),
                ],
            ),
        );
        assert!(e.message.contains("mutually exclusive"), "{e}");
        let e = build_err(
            &ws,
            &save_op(
                &["gpu_0/w", "b"],
                "o",
                "ferro",
                vec![strings_arg("blob_name_overrides", &["x", "x"])],
            ),
        );
        assert!(e.message.contains("Duplicated feature"), "{e}");
        ws.feed("gpu_1/b", BlobValue::Tensor(Tensor::scalar(3i32)));
        let e = build_err(
            &ws,
            &save_op(
                &["b", "gpu_1/b"],
                "o",
                "ferro",
                vec![string_arg("strip_prefix", "/")],
            ),
        );
        assert!(e.message.contains("'b'"), "{e}");
    }

    #[test]
    fn save_checks_its_arguments_and_inputs() {
        let dir = Scratch::new();
        let ws = filled(&dir);
        let e = build_err(
            &ws,
            &op("Save", &["w"], &[], vec![string_arg("db_type", "ferro")]),
        );
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("'db'"), "{e}");
        let e = build_err(&ws, &op("Save", &["w"], &[], vec![string_arg("db", "x")]));
        assert!(e.message.contains("db_type"), "{e}");
        let e = build_err(&ws, &save_op(&["w"], "x", "lmdb", vec![]));
        assert!(e.message.contains("db_type 'lmdb' is not supported"), "{e}");
        let e = build_err(&ws, &save_op(&["w"], "x", "parquet", vec![]));
        assert!(e.message.contains("unknown db_type 'parquet'"), "{e}");
        let e = build_err(
            &ws,
            &save_op(&["w"], "x", "ferro", vec![int_arg("chunk_size", -3)]),
        );
        assert!(e.message.contains("chunk_size"), "{e}");
        assert!(build_err(
            &ws,
            &op(
                "Save",
                &[],
                &[],
                vec![string_arg("db", "x"), string_arg("db_type", "ferro")]
            )
        )
        .message
        .contains("at least 1"));
        // An empty blob cannot be saved; nothing is written.
        ws.create_blob("nothing");
        let e = run(&ws, &save_op(&["w", "nothing"], "x", "ferro", vec![])).unwrap_err();
        assert_eq!(e.context.blob.as_deref(), Some("nothing"));
        assert_eq!(e.context.file.as_deref(), Some(dir.file("x").as_str()));
        assert_eq!(e.context.op_type.as_deref(), Some("Save"));
        assert!(!std::path::Path::new(&dir.file("x")).exists());
    }

    #[test]
    fn load_maps_names() {
        let dir = Scratch::new();
        let ws = Workspace::with_root(&dir.root());
        ws.feed("gpu_0/w", BlobValue::Tensor(Tensor::scalar(1i32)));
        ws.feed("gpu_0/b", BlobValue::Tensor(Tensor::scalar(2i32)));
        run(
            &ws,
            &save_op(&["gpu_0/w", "gpu_0/b"], "db", "minidb", vec![]),
        )
        .unwrap();

        // strip_prefix then add_prefix.
        let l = Workspace::with_root(&dir.root());
        run(
            &l,
            &load_op(
                &["gpu_1/w", "gpu_1/b"],
                "db",
                "minidb",
                vec![
                    string_arg("strip_prefix", "gpu_0/"),
                    string_arg("add_prefix", "gpu_1/"),
                ],
            ),
        )
        .unwrap();
        assert_eq!(out(&l, "gpu_1/w"), Tensor::scalar(1i32));
        assert_eq!(out(&l, "gpu_1/b"), Tensor::scalar(2i32));
        // source_blob_names pick stored names for each output.
        run(
            &l,
            &load_op(
                &["x", "y"],
                "db",
                "minidb",
                vec![strings_arg("source_blob_names", &["gpu_0/b", "gpu_0/w"])],
            ),
        )
        .unwrap();
        assert_eq!(out(&l, "x"), Tensor::scalar(2i32));
        assert_eq!(out(&l, "y"), Tensor::scalar(1i32));
        // load_all with prefixes, into the workspace.
        run(
            &l,
            &load_op(
                &[],
                "db",
                "minidb",
                vec![
                    int_arg("load_all", 1),
                    string_arg("strip_prefix", "/"),
                    string_arg("add_prefix", "p_"),
                ],
            ),
        )
        .unwrap();
        assert_eq!(out(&l, "p_w"), Tensor::scalar(1i32));
        assert_eq!(out(&l, "p_b"), Tensor::scalar(2i32));
        // load_all into a child writes the parent's blob when the name is visible there.
        let child = Workspace::new_child(&l);
        run(
            &child,
            &load_op(
                &[],
                &dir.file("db"),
                "minidb",
                vec![
                    int_arg("load_all", 1),
                    int_arg("absolute_path", 1),
                    string_arg("strip_prefix", "/"),
                    string_arg("add_prefix", "p_"),
                ],
            ),
        )
        .unwrap();
        assert_eq!(child.local_blob_names(), Vec::<String>::new());

        let bad = |args: Vec<Argument>, outs: &[&str], msg: &str| {
            let e = build_err(&l, &load_op(outs, "db", "minidb", args));
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains(msg), "{e}");
        };
        bad(
            vec![strings_arg("source_blob_names", &["a"])],
            &["x", "y"],
            "source_blob_names mismatch",
        );
        bad(
            vec![
                strings_arg("source_blob_names", &["a"]),
                string_arg("strip_prefix", "/"),
            ],
            &["x"],
            "mutually exclusive",
        );
        bad(
            vec![
                strings_arg("source_blob_names", &["a"]),
                int_arg("load_all", 1),
            ],
            &["x"],
            "load_all",
        );
        bad(
            vec![strings_arg("source_blob_names", &["a", "a"])],
            &["x", "y"],
            "Duplicated source blob name: a",
        );
        let e = build_err(
            &l,
            &op("Load", &[], &["x"], vec![string_arg("db_type", "minidb")]),
        );
        assert!(e.message.contains("'db' or 'dbs'"), "{e}");
        let e = build_err(
            &l,
            &op(
                "Load",
                &[],
                &["x"],
                vec![
                    string_arg("db_type", "minidb"),
                    strings_arg("dbs", &["a", "a"]),
                ],
            ),
        );
        assert!(e.message.contains("Duplicated db name: a"), "{e}");
        let e = build_err(
            &l,
            &op(
                "Load",
                &["x"],
                &["y"],
                vec![string_arg("db", "db"), string_arg("db_type", "minidb")],
            ),
        );
        assert!(
            e.message.contains("DBReader inputs is not supported"),
            "{e}"
        );
    }

    #[test]
    fn load_reports_missing_blobs_and_duplicates() {
        let dir = Scratch::new();
        let ws = Workspace::with_root(&dir.root());
        ws.feed("a", BlobValue::Tensor(Tensor::scalar(1i32)));
        ws.feed("b", BlobValue::Tensor(Tensor::scalar(2i32)));
        run(&ws, &save_op(&["a"], "one", "ferro", vec![])).unwrap();
        run(&ws, &save_op(&["a", "b"], "two", "ferro", vec![])).unwrap();
        run(&ws, &save_op(&["b"], "three", "ferro", vec![])).unwrap();

        let l = Workspace::with_root(&dir.root());
        l.feed("c", BlobValue::Tensor(Tensor::scalar(-1i32)));
        let e = run(&l, &load_op(&["a", "b", "c"], "one", "ferro", vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OperatorFailed);
        assert!(
            e.message.contains("Expected to load 3 blobs, got 1 only."),
            "{e}"
        );
        assert!(e.message.contains("'b', 'c'"), "{e}");
        assert_eq!(e.context.blob.as_deref(), Some("b"));
        // Nothing was written: "a" does not exist, "c" is unchanged.
        assert!(!l.fetch("a").map(|v| !v.is_empty()).unwrap_or(false));
        assert_eq!(out(&l, "c"), Tensor::scalar(-1i32));
        // allow_incomplete loads what is there.
        run(
            &l,
            &load_op(
                &["a", "b", "c"],
                "one",
                "ferro",
                vec![int_arg("allow_incomplete", 1)],
            ),
        )
        .unwrap();
        assert_eq!(out(&l, "a"), Tensor::scalar(1i32));
        assert_eq!(out(&l, "c"), Tensor::scalar(-1i32));
        // Several dbs.
        let dbs = |v: &[&str]| {
            op(
                "Load",
                &[],
                &["a", "b"],
                vec![strings_arg("dbs", v), string_arg("db_type", "ferro")],
            )
        };
        run(&l, &dbs(&["one", "three"])).unwrap();
        assert_eq!(out(&l, "b"), Tensor::scalar(2i32));
        let e = run(&l, &dbs(&["one", "two"])).unwrap_err();
        assert!(e.message.contains("Duplicate Key a is found!"), "{e}");
        assert_eq!(e.context.blob.as_deref(), Some("a"));
        // load_all: every declared output must be in the db.
        let e = run(
            &l,
            &load_op(&["a", "zzz"], "one", "ferro", vec![int_arg("load_all", 1)]),
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("Output blob name zzz does not exist in the db(s)."),
            "{e}"
        );
    }

    #[test]
    fn failed_loads_leave_outputs_untouched() {
        let dir = Scratch::new();
        let ws = Workspace::with_root(&dir.root());
        ws.feed("a", BlobValue::Tensor(tensor(&[4], vec![1.0f32; 4])));
        ws.feed("b", BlobValue::Tensor(tensor(&[4], vec![2.0f32; 4])));
        run(&ws, &save_op(&["a", "b"], "db", "ferro", vec![])).unwrap();
        // Damage "b" (the second payload, at byte 128).
        let path = dir.file("db");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[130] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let l = Workspace::with_root(&dir.root());
        l.feed("a", BlobValue::Tensor(Tensor::scalar(0i32)));
        let e = run(&l, &load_op(&["a", "b"], "db", "ferro", vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint);
        assert_eq!(
            (e.context.blob.as_deref(), e.context.file.as_deref()),
            (Some("b"), Some(path.as_str()))
        );
        assert_eq!(out(&l, "a"), Tensor::scalar(0i32));
        // The undamaged blob alone still loads.
        run(&l, &load_op(&["a"], "db", "ferro", vec![])).unwrap();
        assert_eq!(out(&l, "a"), tensor(&[4], vec![1.0f32; 4]));
        // Truncated and missing files.
        std::fs::write(&path, &bytes[..100]).unwrap();
        let e = run(&l, &load_op(&["a"], "db", "ferro", vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.file.as_deref()),
            (ErrorKind::CorruptCheckpoint, Some(path.as_str()))
        );
        let e = run(&l, &load_op(&["a"], "nope", "ferro", vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert_eq!(e.context.file.as_deref(), Some(dir.file("nope").as_str()));
    }

    #[test]
    fn every_kind_round_trips_through_leveldb() {
        for db_type in ["leveldb", "LevelDB"] {
            let dir = Scratch::new();
            let ws = filled(&dir);
            run(
                &ws,
                &save_op(&ALL, "ldb", db_type, vec![int_arg("chunk_size", 2)]),
            )
            .unwrap();
            assert!(std::path::Path::new(&dir.file("ldb"))
                .join("CURRENT")
                .is_file());
            let fresh = Workspace::with_root(&dir.root());
            run(&fresh, &load_op(&ALL, "ldb", "leveldb", vec![])).unwrap();
            check_restored(&fresh);
        }
    }

    #[test]
    fn checkpoint_saves_every_n_iterations_to_the_formatted_path() {
        let dir = Scratch::new();
        let ws = filled(&dir);
        let d = op(
            "Checkpoint",
            &["it", "w"],
            &[],
            vec![
                string_arg("db", "ck_%05d"),
                string_arg("db_type", "leveldb"),
                int_arg("every", 10),
            ],
        );
        for i in 1..=25i64 {
            ws.feed("it", BlobValue::Tensor(tensor(&[1], vec![i])));
            run(&ws, &d).unwrap();
        }
        let mut made: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        made.sort();
        assert_eq!(made, ["ck_00010", "ck_00020"]);
        let fresh = Workspace::with_root(&dir.root());
        run(
            &fresh,
            &load_op(&["it", "w"], "ck_00020", "leveldb", vec![]),
        )
        .unwrap();
        assert_eq!(out(&fresh, "it"), tensor(&[1], vec![20i64]));
        assert_eq!(
            out(&fresh, "w"),
            tensor(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        let bad = |args: Vec<Argument>| build_err(&ws, &op("Checkpoint", &["it"], &[], args));
        let e = bad(vec![
            string_arg("db", "x_%d"),
            string_arg("db_type", "leveldb"),
            int_arg("every", 0),
        ]);
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = bad(vec![
            string_arg("db", "x_%s"),
            string_arg("db_type", "minidb"),
        ]);
        assert!(e.message.contains("integer conversion"), "{e}");
        ws.feed("f", BlobValue::Tensor(tensor(&[1], vec![1.0f32])));
        let d = op(
            "Checkpoint",
            &["f"],
            &[],
            vec![string_arg("db", "y%d"), string_arg("db_type", "minidb")],
        );
        assert_eq!(run(&ws, &d).unwrap_err().kind, ErrorKind::Type);
    }

    #[test]
    fn checkpoint_patterns_follow_printf() {
        use super::format_iteration as f;
        assert_eq!(f("a_%05d", 42).unwrap(), "a_00042");
        assert_eq!(f("%d%%", -3).unwrap(), "-3%");
        assert_eq!(f("[%4d]", 7).unwrap(), "[   7]");
        assert_eq!(f("[%-4d]", 7).unwrap(), "[7   ]");
        assert_eq!(f("%lld", 123).unwrap(), "123");
        assert_eq!(f("%05d", -42).unwrap(), "-0042");
        assert!(f("plain", 1).is_err());
        assert!(f("%d_%d", 1).is_err());
    }

    #[test]
    fn db_exists_checks_the_path() {
        let dir = Scratch::new();
        let ws = filled(&dir);
        let exists = |ws: &Arc<Workspace>, name: &str, abs: i64| {
            let d = op(
                "DBExists",
                &[],
                &["e"],
                vec![
                    string_arg("db_name", name),
                    string_arg("db_type", "minidb"),
                    int_arg("absolute_path", abs),
                ],
            );
            run(ws, &d).unwrap();
            out(ws, "e")
        };
        assert_eq!(exists(&ws, "ckpt", 0), Tensor::scalar(false));
        run(&ws, &save_op(&["w"], "ckpt", "minidb", vec![])).unwrap();
        assert_eq!(exists(&ws, "ckpt", 0), Tensor::scalar(true));
        assert_eq!(exists(&ws, &dir.file("ckpt"), 1), Tensor::scalar(true));
        assert_eq!(exists(&ws, "ckpt", 1), Tensor::scalar(false));
        let e = build_err(
            &ws,
            &op(
                "DBExists",
                &[],
                &["e"],
                vec![string_arg("db_name", "x"), string_arg("db_type", "lmdb")],
            ),
        );
        assert!(e.message.contains("not supported"), "{e}");
        let e = build_err(
            &ws,
            &op(
                "DBExists",
                &[],
                &["e"],
                vec![string_arg("db_type", "ferro")],
            ),
        );
        assert!(e.message.contains("db_name"), "{e}");
    }
}
