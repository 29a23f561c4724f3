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
    check_files(path)?;
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

/// Stores one record (key, value).
type Put<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;
/// Gives a db its records through a [`Put`].
type Fill<'a> = dyn FnMut(&mut Put<'_>) -> Result<()> + 'a;

/// Writes a new LevelDB in the (new, empty) directory `dir`, its records
/// given by `fill`.
fn write_dir(dir: &Path, path: &str, fill: &mut Fill<'_>) -> Result<()> {
    guarded(path, || {
        let o = Options {
            create_if_missing: true,
            error_if_exists: false,
            ..options()
        };
        let mut db = DB::open(dir, o).map_err(|s| ldb_error(path, s))?;
        fill(&mut |key, value| db.put(key, value).map_err(|s| ldb_error(path, s)))?;
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

/// Writes a LevelDB at `path` whose records are `records` (raw keys and
/// values, as Caffe2's `Transaction::Put`), crash-safely as a save does,
/// replacing a LevelDB there.
pub fn write_leveldb_records(path: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    save_leveldb(path, &mut |put| {
        for (k, v) in records {
            put(k, v)?;
        }
        Ok(())
    })
}

fn save_leveldb(path: &str, fill: &mut Fill<'_>) -> Result<()> {
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
        write_dir(&tmp, path, fill)?;
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
        save_leveldb(path, &mut |put| {
            write_records(entries, opts, &mut |key, value| put(key.as_bytes(), value))
        })
    }
    fn exists(&self, path: &str) -> bool {
        is_leveldb(Path::new(path))
    }
    /// The sum of the sizes of the directory's files.
    fn size(&self, path: &str) -> Result<u64> {
        let mut total = 0;
        for e in fs::read_dir(path).map_err(|e| Error::io(&e, path))? {
            let e = e.map_err(|e| Error::io(&e, path))?;
            let meta = e.metadata().map_err(|e| Error::io(&e, path))?;
            if meta.is_file() {
                total += meta.len();
            }
        }
        Ok(total)
    }
    fn remove(&self, path: &str) -> Result<()> {
        match fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(&e, path)),
            _ => Ok(()),
        }
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
    /// Any bytes, in key order.
    fn read_kv(&self, path: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        read_all(path)
    }
    /// A key given twice keeps its last value (LevelDB's `Put`).
    fn write_kv(&self, path: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        write_leveldb_records(path, records)
    }
}

// ------------------------------------------------------ integrity check --
//
// rusty-leveldb skips a block whose CRC is wrong (and stops recovering a log
// at a bad record) without an error, which would drop records silently. So
// before a db is opened, every block of its tables and every record of its
// logs and manifests is checked against its CRC-32C here (LevelDB's file
// formats: `table_format.md` and `log_format.md` of LevelDB's docs).

/// LevelDB's table magic number (the footer's last 8 bytes, little-endian).
const TABLE_MAGIC: u64 = 0xdb47_7524_8b80_fb57;
const LOG_BLOCK: usize = 32768;

fn unmask_crc(m: u32) -> u32 {
    let rot = m.wrapping_sub(0xa282_ead8);
    rot.rotate_right(17)
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// A table block's contents (decompressed), after checking its CRC.
fn table_block(b: &[u8], off: u64, size: u64) -> std::result::Result<Vec<u8>, String> {
    let (off, size) = (off as usize, size as usize);
    let end = off
        .checked_add(size)
        .and_then(|e| e.checked_add(5))
        .filter(|&e| e <= b.len())
        .ok_or_else(|| format!("a block at byte {off} runs past the end of the file"))?;
    let data = &b[off..off + size];
    let kind = b[off + size];
    let want = unmask_crc(u32::from_le_bytes([
        b[end - 4],
        b[end - 3],
        b[end - 2],
        b[end - 1],
    ]));
    let got = crc32c::crc32c_append(crc32c::crc32c(data), &[kind]);
    if got != want {
        return Err(format!("the block at byte {off} fails its CRC"));
    }
    match kind {
        0 => Ok(data.to_vec()),
        1 => snap::raw::Decoder::new()
            .decompress_vec(data)
            .map_err(|e| format!("the block at byte {off} does not decompress: {e}")),
        k => Err(format!(
            "the block at byte {off} has an unknown compression {k}"
        )),
    }
}

/// Checks a table's footer, index and every data block it points to.
fn check_table(b: &[u8]) -> std::result::Result<(), String> {
    if b.len() < 48 {
        return Err("the table is shorter than its footer".into());
    }
    let foot = &b[b.len() - 48..];
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&foot[40..]);
    if u64::from_le_bytes(magic) != TABLE_MAGIC {
        return Err("the table has no LevelDB footer".into());
    }
    let mut at = 0;
    let handles: Option<[u64; 4]> = (|| {
        Some([
            varint(foot, &mut at)?,
            varint(foot, &mut at)?,
            varint(foot, &mut at)?,
            varint(foot, &mut at)?,
        ])
    })();
    let [meta_off, meta_size, index_off, index_size] =
        handles.ok_or("the table's footer is malformed")?;
    table_block(b, meta_off, meta_size)?;
    let index = table_block(b, index_off, index_size)?;
    let bad_index = || "the table's index block is malformed".to_string();
    if index.len() < 4 {
        return Err(bad_index());
    }
    let n = index.len() - 4;
    let restarts =
        u32::from_le_bytes([index[n], index[n + 1], index[n + 2], index[n + 3]]) as usize;
    let entries_end = restarts
        .checked_mul(4)
        .and_then(|r| n.checked_sub(r))
        .ok_or_else(bad_index)?;
    let e = &index[..entries_end];
    let mut at = 0;
    while at < e.len() {
        let _shared = varint(e, &mut at).ok_or_else(bad_index)?;
        let key_len = varint(e, &mut at).ok_or_else(bad_index)? as usize;
        let value_len = varint(e, &mut at).ok_or_else(bad_index)? as usize;
        at = at
            .checked_add(key_len)
            .filter(|&a| a.saturating_add(value_len) <= e.len())
            .ok_or_else(bad_index)?;
        let v = &e[at..at + value_len];
        at += value_len;
        let mut vat = 0;
        let off = varint(v, &mut vat).ok_or_else(bad_index)?;
        let size = varint(v, &mut vat).ok_or_else(bad_index)?;
        table_block(b, off, size)?;
    }
    Ok(())
}

/// Checks every record of a LevelDB log (a `.log` or a `MANIFEST`).
fn check_log(b: &[u8]) -> std::result::Result<(), String> {
    let mut block = 0;
    while block < b.len() {
        let end = (block + LOG_BLOCK).min(b.len());
        let mut at = block;
        while end - at >= 7 {
            let len = usize::from(u16::from_le_bytes([b[at + 4], b[at + 5]]));
            let kind = b[at + 6];
            if kind == 0 && len == 0 {
                // Zero padding (preallocated space) up to the block's end.
                break;
            }
            if at + 7 + len > end {
                return Err(format!("the log record at byte {at} is cut off"));
            }
            let want = unmask_crc(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]));
            let got = crc32c::crc32c_append(crc32c::crc32c(&[kind]), &b[at + 7..at + 7 + len]);
            if got != want {
                return Err(format!("the log record at byte {at} fails its CRC"));
            }
            at += 7 + len;
        }
        if end - at > 0 && end == b.len() && b[at..end].iter().any(|&x| x != 0) {
            return Err(format!("the log ends inside a record header at byte {at}"));
        }
        block += LOG_BLOCK;
    }
    Ok(())
}

/// Checks every table, log and manifest of the LevelDB directory `path`.
fn check_files(path: &str) -> Result<()> {
    for entry in fs::read_dir(path).map_err(io_error(path))? {
        let entry = entry.map_err(io_error(path))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let table = name.ends_with(".ldb") || name.ends_with(".sst");
        let log = name.ends_with(".log") && name != "LOG" || name.starts_with("MANIFEST-");
        if !table && !log {
            continue;
        }
        let bytes = fs::read(entry.path()).map_err(io_error(path))?;
        let checked = if table {
            check_table(&bytes)
        } else {
            check_log(&bytes)
        };
        checked.map_err(|m| corrupt(path, format!("the LevelDB is damaged: {name}: {m}")))?;
    }
    Ok(())
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
        // Flip bytes in the middle of every table (the data is in tables).
        let mut flipped = 0;
        for entry in fs::read_dir(&p).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let mut b = fs::read(&path).unwrap();
            if (name.ends_with(".ldb") || name.ends_with(".sst")) && b.len() > 1024 {
                flipped += 1;
                let mid = b.len() / 2;
                for x in &mut b[mid..mid + 64] {
                    *x ^= 0x5a;
                }
                fs::write(&path, b).unwrap();
            }
        }
        assert!(flipped > 0);
        let e = load_db(&p, "leveldb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint, "{e}");
        assert!(e.to_string().contains(&p), "{e}");

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

    /// A db whose records are still in its log (as another writer may leave
    /// it): read through the log, and a damaged log record is an error.
    #[test]
    fn records_in_a_log_are_checked_too() {
        let s = Scratch::new("ldb-log");
        let p = s.file("db");
        let big: Vec<f32> = (0..30_000).map(|i| i as f32).collect();
        let entries = [("x".to_string(), t(&[30_000], big.clone()))];
        let refs: Vec<(&str, &BlobValue)> = entries.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let prepared = prepare(&refs, &LevelDb).unwrap();
        {
            let mut db = DB::open(&p, options()).unwrap();
            write_records(&prepared, &SaveOptions::default(), &mut |k, v| {
                db.put(k.as_bytes(), v).map_err(|e| ldb_error(&p, e))
            })
            .unwrap();
            db.flush().unwrap();
            // Dropped without a compaction: the record stays in the log.
        }
        let log = fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|f| f.extension().is_some_and(|x| x == "log"))
            .unwrap();
        let intact = fs::read(&log).unwrap();
        assert!(intact.len() > 3 * LOG_BLOCK, "{}", intact.len());
        let copy = s.file("copy");
        fs::create_dir(&copy).unwrap();
        for e in fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), Path::new(&copy).join(e.file_name())).unwrap();
        }
        let back = load_db(&p, "leveldb").unwrap();
        assert_eq!(
            back[0].1.tensor().unwrap(),
            &Tensor::from_vec(&[30_000], big).unwrap()
        );

        let mut b = intact;
        b[LOG_BLOCK + 100] ^= 1;
        fs::write(Path::new(&copy).join(log.file_name().unwrap()), b).unwrap();
        let e = load_db(&copy, "leveldb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint, "{e}");
        assert!(e.message.contains("fails its CRC"), "{e}");
    }

    #[test]
    fn raw_records_round_trip_in_key_order() {
        let s = Scratch::new("ldb-kv");
        let p = s.file("db");
        // Any bytes as keys and values; a key given twice keeps its last value.
        let recs: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"k2".to_vec(), b"two".to_vec()),
            (vec![0xff, 0x00], vec![1, 2, 3]),
            (b"k1".to_vec(), b"one".to_vec()),
            (b"k2".to_vec(), b"TWO".to_vec()),
            (b"".to_vec(), b"".to_vec()),
        ];
        write_kv(&p, "LevelDB", &recs).unwrap();
        assert!(Path::new(&p).join("CURRENT").is_file());
        let back = read_kv(&p, "leveldb").unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"".to_vec(), b"".to_vec()),
            (b"k1".to_vec(), b"one".to_vec()),
            (b"k2".to_vec(), b"TWO".to_vec()),
            (vec![0xff, 0x00], vec![1, 2, 3]),
        ];
        assert_eq!(back, want);
        // An empty db, written over the first.
        write_kv(&p, "leveldb", &[]).unwrap();
        assert!(read_kv(&p, "leveldb").unwrap().is_empty());
    }

    #[test]
    fn saved_blobs_read_as_records_in_every_format_and_back() {
        let s = Scratch::new("kv-all");
        let entries = vec![
            ("w".to_string(), t(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])),
            ("s".to_string(), BlobValue::Bytes(b"xyz".to_vec())),
        ];
        for (i, f) in FORMATS.iter().enumerate() {
            let a = s.file(&format!("a{i}"));
            save_blobs(&a, f.name(), &entries).unwrap();
            let recs = read_kv(&a, f.name()).unwrap();
            let mut keys: Vec<&[u8]> = recs.iter().map(|(k, _)| k.as_slice()).collect();
            keys.sort();
            assert_eq!(keys, [b"s".as_slice(), b"w#%0".as_slice()], "{}", f.name());
            // The records written again, in this format and the others, hold
            // the same blobs.
            for g in FORMATS {
                let b = s.file(&format!("b{i}-{}", g.name()));
                write_kv(&b, g.name(), &recs).unwrap();
                let mut back = load_db(&b, g.name()).unwrap();
                back.sort_by(|x, y| x.0.cmp(&y.0));
                assert_eq!(back.len(), 2);
                assert!(matches!(&back[0].1, BlobValue::Bytes(v) if v == b"xyz"));
                assert_eq!(
                    back[1].1.tensor().unwrap(),
                    &Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap()
                );
            }
        }
        // ferro holds blobs: a value that is not a BlobProto is refused.
        let c = s.file("c");
        let e = write_kv(&c, "ferro", &[(b"k".to_vec(), vec![0xff; 3])]).unwrap_err();
        assert!(e.to_string().contains("BlobProto"), "{e}");
        assert!(!Path::new(&c).exists());
        let e = read_kv(&c, "rocksdb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn both_caffe2_names_are_registered() {
        let names = registered_dbs();
        for n in ["ferro", "minidb", "leveldb", "LevelDB"] {
            assert!(names.contains(&n), "{names:?}");
        }
    }
}
