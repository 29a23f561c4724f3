//! `"leveldb"` (also `"LevelDB"`): Caffe2's LevelDB db, a LevelDB directory
//! whose keys are those of a minidb (a blob's name, or `name#%<chunk>` for
//! a tensor's chunks) and whose values are serialized `BlobProto`s, so any
//! LevelDB implementation reads it. It is written and read with the pure-Rust
//! `rusty-leveldb` crate (tables snappy-compressed, 64 KiB blocks, as
//! Caffe2's writer). LevelDB keeps its keys sorted bytewise: records are read
//! in key order, as Caffe2's LevelDB cursor did.
//!
//! A save builds the db in a temporary directory beside `path`, fsyncs it
//! and renames it into place; an existing LevelDB at `path` is replaced
//! (Caffe2 refused to save over one), anything else there is refused. A db
//! is read whole and closed at once, so no lock is held between ops.

use super::*;
use rusty_leveldb::{LdbIterator, Options, Status, StatusCode, DB};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Caffe2's `caffe2_leveldb_block_size` default.
const BLOCK_SIZE: usize = 65536;
/// `rusty-leveldb`'s id of snappy compression (LevelDB's own default).
const SNAPPY: u8 = 1;

/// A LevelDB error as ferrocaffe's: damage is `CorruptCheckpoint`, anything
/// else an I/O error; both name the path.
fn ldb_error(path: &str, s: Status) -> Error {
    match s.code {
        StatusCode::Corruption | StatusCode::InvalidData | StatusCode::CompressionError => {
            corrupt(path, format!("the LevelDB is damaged: {}", s.err))
        }
        StatusCode::NotFound => Error::io(
            &std::io::Error::new(std::io::ErrorKind::NotFound, s.err),
            path,
        ),
        _ => Error::new(ErrorKind::Io, format!("{path}: LevelDB: {}", s.err)).with_file(path),
    }
}

/// Runs a LevelDB call; a panic inside the crate (on data it did not expect)
/// becomes a corruption error instead of unwinding into the caller.
fn guarded<T>(path: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(corrupt(
            path,
            "the LevelDB could not be read (its files are damaged or not LevelDB's)",
        ))
    })
}

fn options() -> Options {
    Options {
        block_size: BLOCK_SIZE,
        compressor: SNAPPY,
        ..Options::default()
    }
}

/// Whether `path` is a LevelDB directory (it has LevelDB's CURRENT file).
fn is_leveldb(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) && path.join("CURRENT").is_file()
}

/// Every record of the LevelDB at `path`, in key order.
fn read_all(path: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::new(
                ErrorKind::Io,
                format!("{path}: is not a directory, so not a LevelDB"),
            )
            .with_file(path))
        }
        Err(e) => return Err(Error::io(&e, path)),
    }
    if !Path::new(path).join("CURRENT").is_file() {
        return Err(corrupt(
            path,
            "the directory is not a LevelDB (it has no CURRENT file)",
        ));
    }
    guarded(path, || {
        let opts = Options {
            create_if_missing: false,
            paranoid_checks: true,
            ..options()
        };
        let mut db = DB::open(path, opts).map_err(|s| ldb_error(path, s))?;
        let mut it = db.new_iter().map_err(|s| ldb_error(path, s))?;
        let mut out = Vec::new();
        while it.advance() {
            if let Some((k, v)) = it.current() {
                out.push((k.to_vec(), v.to_vec()));
            }
        }
        drop(it);
        db.close().map_err(|s| ldb_error(path, s))?;
        Ok(out)
    })
}

fn records(path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<MiniRecord>> {
    read_all(path)?
        .into_iter()
        .map(|(k, v)| {
            let key = String::from_utf8(k).map_err(|e| {
                corrupt(
                    path,
                    format!(
                        "the LevelDB has a key that is not UTF-8 ({:?}), so not a blob name",
                        String::from_utf8_lossy(e.as_bytes())
                    ),
                )
            })?;
            Ok(MiniRecord::whole(key, v, select))
        })
        .collect()
}

/// Writes `entries` as a new LevelDB in the (new, empty) directory `dir`.
fn write_dir(
    dir: &Path,
    path: &str,
    entries: &[(&str, Prepared<'_>)],
    opts: &SaveOptions,
) -> Result<()> {
    guarded(path, || {
        let o = Options {
            create_if_missing: true,
            error_if_exists: false,
            ..options()
        };
        let mut db = DB::open(dir, o).map_err(|s| ldb_error(path, s))?;
        write_records(entries, opts, &mut |key, value| {
            db.put(key.as_bytes(), value)
                .map_err(|s| ldb_error(path, s))
        })?;
        // Everything into tables, whose blocks carry CRCs that every read
        // checks (a damaged log would be skipped silently on recovery).
        db.compact_range(b"", b"\xff")
            .map_err(|s| ldb_error(path, s))?;
        db.close().map_err(|s| ldb_error(path, s))
    })?;
    for entry in fs::read_dir(dir).map_err(io_error(path))? {
        let entry = entry.map_err(io_error(path))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            File::open(entry.path())
                .and_then(|f| f.sync_all())
                .map_err(io_error(path))?;
        }
    }
    sync_dir(dir).map_err(io_error(path))
}

/// A new directory beside `path` with a temporary's name.
fn temp_dir_for(path: &Path, shown: &str) -> Result<PathBuf> {
    loop {
        let tmp = temp_path_for(path);
        match fs::create_dir(&tmp) {
            Ok(()) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&e, shown)),
        }
    }
}

fn save_leveldb(path: &str, entries: &[(&str, Prepared<'_>)], opts: &SaveOptions) -> Result<()> {
    let p = Path::new(path);
    if p.file_name().is_none() {
        return Err(Error::invalid_arg(format!("'{path}' does not name a db")).with_file(path));
    }
    let replacing = match fs::symlink_metadata(p) {
        Ok(_) if is_leveldb(p) => true,
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory that is not a LevelDB"
            } else {
                "not a directory"
            };
            return Err(Error::new(
                ErrorKind::Io,
                format!("{path}: is {what}; a LevelDB save only replaces a LevelDB"),
            )
            .with_file(path));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(Error::io(&e, path)),
    };
    let parent = dir_of(p);
    let tmp = temp_dir_for(p, path)?;
    let result = (|| {
        write_dir(&tmp, path, entries, opts)?;
        if replacing {
            // Two renames: a directory cannot be renamed over a full one.
            let old = temp_path_for(p);
            fs::rename(p, &old).map_err(io_error(path))?;
            if let Err(e) = fs::rename(&tmp, p) {
                let _ = fs::rename(&old, p);
                return Err(Error::io(&e, path));
            }
            let _ = fs::remove_dir_all(&old);
        } else {
            fs::rename(&tmp, p).map_err(io_error(path))?;
        }
        sync_dir(&parent).map_err(io_error(path))
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// A LevelDB read as Caffe2's key-value db (for a DB reader): every record,
/// in key order, read when it is opened.
pub struct LevelDbRecords {
    path: String,
    records: Vec<(String, Vec<u8>)>,
}

impl LevelDbRecords {
    pub fn open(path: &str) -> Result<LevelDbRecords> {
        let records = read_all(path)?
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
            .collect();
        Ok(LevelDbRecords {
            path: path.to_string(),
            records,
        })
    }
}

impl KvRecords for LevelDbRecords {
    fn path(&self) -> &str {
        &self.path
    }
    fn len(&self) -> usize {
        self.records.len()
    }
    fn key(&self, i: usize) -> &str {
        &self.records[i].0
    }
    fn value(&self, i: usize) -> Result<Vec<u8>> {
        Ok(self.records[i].1.clone())
    }
}

/// Caffe2's LevelDB format.
pub struct LevelDb;

impl DbFormat for LevelDb {
    fn name(&self) -> &'static str {
        "leveldb"
    }
    fn aliases(&self) -> &'static [&'static str] {
        &["LevelDB"]
    }
    fn about(&self) -> &'static str {
        "Caffe2's LevelDB directory"
    }
    fn allows_chunk_separator(&self) -> bool {
        false
    }
    fn save(&self, path: &str, entries: &[(&str, Prepared<'_>)], opts: &SaveOptions) -> Result<()> {
        save_leveldb(path, entries, opts)
    }
    fn exists(&self, path: &str) -> bool {
        is_leveldb(Path::new(path))
    }
    fn load(&self, path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<(String, BlobValue)>> {
        load_records(path, records(path, select)?)
    }
    fn list(&self, path: &str) -> Result<Vec<EntryInfo>> {
        list_records(path, records(path, &|_| true)?)
    }
    /// LevelDB checks its blocks' CRCs as it reads; every blob is decoded.
    fn verify(&self, path: &str) -> Result<()> {
        self.load(path, &|_| true).map(|_| ())
    }
    fn records(&self, path: &str) -> Result<Box<dyn KvRecords>> {
        Ok(Box::new(LevelDbRecords::open(path)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Scratch;
    use super::*;

    fn t<T: crate::tensor::Element>(shape: &[usize], v: Vec<T>) -> BlobValue {
        BlobValue::Tensor(Tensor::from_vec(shape, v).unwrap())
    }

    #[test]
    fn round_trip_in_key_order_with_chunks() {
        let s = Scratch::new("ldb");
        let p = s.file("db");
        let entries = vec![
            (
                "w".to_string(),
                t(&[2, 3], vec![1.5f32, -2.0, 0.0, 4.0, 5.0, 6.25]),
            ),
            ("b".to_string(), t(&[3], vec![7i64, -8, 1 << 40])),
            ("s".to_string(), BlobValue::Bytes(b"hello".to_vec())),
        ];
        let opts = SaveOptions {
            chunk_size: 4,
            ..SaveOptions::default()
        };
        save_blobs_with(&p, "LevelDB", &entries, &opts).unwrap();
        assert!(Path::new(&p).join("CURRENT").is_file());
        assert!(db_exists(&p, "leveldb").unwrap());
        // Keys sorted bytewise: b#%0, s, w#%0, w#%1.
        let r = LevelDbRecords::open(&p).unwrap();
        let keys: Vec<&str> = (0..r.len()).map(|i| r.key(i)).collect();
        assert_eq!(keys, ["b#%0", "s", "w#%0", "w#%1"]);
        let back = load_db(&p, "leveldb").unwrap();
        let names: Vec<&str> = back.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["b", "s", "w"]);
        let get = |n: &str| back.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(
            get("w").tensor().unwrap(),
            &Tensor::from_vec(&[2, 3], vec![1.5f32, -2.0, 0.0, 4.0, 5.0, 6.25]).unwrap()
        );
        assert_eq!(
            get("b").tensor().unwrap(),
            &Tensor::from_vec(&[3], vec![7i64, -8, 1 << 40]).unwrap()
        );
        assert!(matches!(get("s"), BlobValue::Bytes(b) if b == b"hello"));
        // Saving again replaces the db.
        save_blobs(&p, "leveldb", &entries[2..]).unwrap();
        let back = load_db(&p, "leveldb").unwrap();
        assert_eq!(back.len(), 1);
    }

    #[test]
    fn missing_damaged_and_foreign_paths_are_typed_errors() {
        let s = Scratch::new("ldb-bad");
        let missing = s.file("none");
        let e = load_db(&missing, "leveldb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(e.to_string().contains(&missing), "{e}");
        assert!(!db_exists(&missing, "leveldb").unwrap());

        let p = s.file("db");
        let big: Vec<f32> = (0..20_000).map(|i| i as f32 * 0.5).collect();
        save_blobs(&p, "leveldb", &[("x".to_string(), t(&[20_000], big))]).unwrap();
        // Without its CURRENT file, a directory is not a LevelDB.
        fs::remove_file(Path::new(&p).join("CURRENT")).unwrap();
        let e = load_db(&p, "leveldb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint, "{e}");
        assert!(e.to_string().contains(&p), "{e}");

        let plain = s.file("plain");
        fs::write(&plain, b"not a db").unwrap();
        assert_eq!(load_db(&plain, "leveldb").unwrap_err().kind, ErrorKind::Io);
        assert!(save_blobs(&plain, "leveldb", &[("a".into(), t(&[1], vec![1f32]))]).is_err());
        assert_eq!(fs::read(&plain).unwrap(), b"not a db");
    }

    #[test]
    fn both_caffe2_names_are_registered() {
        let names = registered_dbs();
        for n in ["ferro", "minidb", "leveldb", "LevelDB"] {
            assert!(names.contains(&n), "{names:?}");
        }
    }
}
