//! Dbs and files: list, verify, map, atomic writes.

use crate::convert::{path_string, value_to_py};
use crate::errors::to_py_err;
use crate::runner::run_here;
use ferrocaffe::error::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use std::path::PathBuf;

/// The entries of a db: a list of dicts (name, kind, type, dtype, shape, bytes).
#[pyfunction]
#[pyo3(signature = (path, db_type=String::from("ferro")))]
pub(crate) fn list_db(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<Vec<Py<PyDict>>> {
    let path = path_string(py, path)?;
    let entries = run_here(py, move |_| ferrocaffe::storage::list_db(&path, &db_type))?;
    entries
        .into_iter()
        .map(|e| {
            let d = PyDict::new(py);
            d.set_item("name", e.name)?;
            d.set_item("kind", format!("{:?}", e.kind))?;
            d.set_item("type", e.type_tag)?;
            d.set_item("dtype", e.dtype.map(|t| t.name()))?;
            d.set_item("shape", e.shape)?;
            d.set_item("bytes", e.bytes)?;
            Ok(d.unbind())
        })
        .collect()
}

/// What a db is, as a checkpoint manifest records it: `{"db_type", "bytes",
/// "checksum"}` (the type given, or detected; the CRC-32 of a format without
/// checksums of its own when `checksum` is asked for, else None).
#[pyfunction]
#[pyo3(signature = (path, db_type=None, checksum=false))]
pub(crate) fn db_info(
    py: Python<'_>,
    path: PathBuf,
    db_type: Option<String>,
    checksum: bool,
) -> PyResult<Py<PyDict>> {
    let path = path_string(py, path)?;
    let info = run_here(py, move |_| {
        ferrocaffe::storage::db_info(&path, db_type.as_deref(), checksum)
    })?;
    let d = PyDict::new(py);
    d.set_item("db_type", info.db_type)?;
    d.set_item("bytes", info.bytes)?;
    d.set_item("checksum", info.checksum)?;
    Ok(d.unbind())
}

/// The format of the db at `path` judged from what is there, or None.
#[pyfunction]
pub(crate) fn detect_db_type(py: Python<'_>, path: PathBuf) -> PyResult<Option<&'static str>> {
    let path = path_string(py, path)?;
    Ok(py.detach(move || ferrocaffe::storage::detect_db_type(&path)))
}

/// Deletes the db of type `db_type` at `path` (a missing one is no error).
#[pyfunction]
pub(crate) fn remove_db(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<()> {
    let path = path_string(py, path)?;
    run_here(py, move |_| ferrocaffe::storage::remove_db(&path, &db_type))
}

/// Checks every checksum of a db; raises CorruptCheckpointError on damage.
#[pyfunction]
#[pyo3(signature = (path, db_type=String::from("ferro")))]
pub(crate) fn verify_db(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<()> {
    let path = path_string(py, path)?;
    run_here(py, move |_| ferrocaffe::storage::verify_db(&path, &db_type))
}

/// Checks a ferro db held in a uint8 array (a read-only memory map of the
/// file at `path`, made by `ferrocaffe.checkpoint.mmap_db`) without copying
/// numeric tensors, and lists its blobs in file order as `(name, kind,
/// info)`: kind "mapped", info `(dtype, shape, offset)`, for numeric and bool
/// tensors left in place; "value", info the decoded copy (an object array of
/// bytes, or bytes), for string tensors and byte strings; "object", info the
/// Caffe2 type tag, for runtime objects. `verify` also checks every payload's
/// CRC, reading the whole array (Ctrl-C interrupts it).
#[pyfunction]
#[pyo3(signature = (data, path, verify=false))]
pub(crate) fn map_ferro(
    py: Python<'_>,
    data: numpy::PyReadonlyArray1<'_, u8>,
    path: PathBuf,
    verify: bool,
) -> PyResult<Vec<(String, &'static str, Py<PyAny>)>> {
    use ferrocaffe::storage::MappedData;
    let path = path_string(py, path)?;
    let bytes = data.as_slice().map_err(|e| {
        to_py_err(
            py,
            Error::invalid_arg(format!("map_ferro needs a contiguous uint8 array: {e}")),
        )
    })?;
    // Checked on this thread while `data` keeps the array borrowed
    // read-only. (A mapped file can still be changed by a process writing
    // it in place, as with any memory map; ferrocaffe never does: saves
    // replace files by rename.)
    let blobs = run_here(py, move |cancel| {
        ferrocaffe::storage::map_ferro(&path, bytes, verify, cancel)
    })?;
    blobs
        .into_iter()
        .map(|b| {
            let (kind, info) = match b.data {
                MappedData::InPlace {
                    dtype,
                    shape,
                    offset,
                    ..
                } => (
                    "mapped",
                    (dtype.name(), shape, offset)
                        .into_pyobject(py)?
                        .into_any()
                        .unbind(),
                ),
                MappedData::Decoded(v) => ("value", value_to_py(py, &b.name, &v, true)?),
                MappedData::Object { type_tag } => {
                    ("object", PyString::new(py, &type_tag).into_any().unbind())
                }
            };
            Ok((b.name, kind, info))
        })
        .collect()
}

/// Every `db_type` name the core's formats accept (Caffe2's
/// `registered_dbs()`), from `storage::FORMATS`.
#[pyfunction]
pub(crate) fn registered_dbs() -> Vec<&'static str> {
    ferrocaffe::storage::registered_dbs()
}

/// The key-value records of a db of any registered type, `[(key, value)]`
/// as bytes, in the db's order (`workspace.C.create_db`'s cursor; see
/// `storage::DbFormat::read_kv`).
#[pyfunction]
pub(crate) fn read_kv_db(
    py: Python<'_>,
    path: PathBuf,
    db_type: String,
) -> PyResult<Vec<(Py<PyBytes>, Py<PyBytes>)>> {
    let path = path_string(py, path)?;
    let records = run_here(py, move |_| ferrocaffe::storage::read_kv(&path, &db_type))?;
    Ok(records
        .into_iter()
        .map(|(k, v)| (PyBytes::new(py, &k).unbind(), PyBytes::new(py, &v).unbind()))
        .collect())
}

/// A db's raw key-value records in the db's order, each value read when
/// asked (`storage::kv_cursor`; what `workspace.C.create_db`'s cursor walks
/// in read mode): `len(c)`, `c.key(i)`, `c.value(i)`.
#[pyclass(name = "KvCursor", module = "ferrocaffe._core", frozen)]
pub(crate) struct PyKvCursor {
    inner: Box<dyn ferrocaffe::storage::KvCursor>,
    path: String,
}

impl PyKvCursor {
    fn check(&self, py: Python<'_>, i: usize) -> PyResult<()> {
        if i < self.inner.len() {
            return Ok(());
        }
        Err(to_py_err(
            py,
            Error::new(
                ferrocaffe::error::ErrorKind::IndexOutOfRange,
                format!(
                    "{}: record #{i} does not exist (the db has {} records)",
                    self.path,
                    self.inner.len()
                ),
            ),
        ))
    }
}

#[pymethods]
impl PyKvCursor {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn key<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        self.check(py, i)?;
        Ok(PyBytes::new(py, self.inner.key(i)))
    }

    fn value<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        self.check(py, i)?;
        let v = run_here(py, |_| self.inner.value(i))?;
        Ok(PyBytes::new(py, &v))
    }
}

/// Opens a [`PyKvCursor`] over the db at `path` of type `db_type`.
#[pyfunction]
pub(crate) fn open_kv_cursor(
    py: Python<'_>,
    path: PathBuf,
    db_type: String,
) -> PyResult<PyKvCursor> {
    let path = path_string(py, path)?;
    let p = path.clone();
    let inner = run_here(py, move |_| ferrocaffe::storage::kv_cursor(&p, &db_type))?;
    Ok(PyKvCursor { inner, path })
}

/// Writes `records` (`(key, value)` bytes pairs) as the db at `path`,
/// crash-safely, replacing a db of that type there
/// (`storage::DbFormat::write_kv`).
#[pyfunction]
pub(crate) fn write_kv_db(
    py: Python<'_>,
    path: PathBuf,
    db_type: String,
    records: Vec<(Vec<u8>, Vec<u8>)>,
) -> PyResult<()> {
    let path = path_string(py, path)?;
    run_here(py, move |_| {
        ferrocaffe::storage::write_kv(&path, &db_type, &records)
    })
}

#[pyfunction]
#[pyo3(signature = (path, db_type=String::from("ferro")))]
pub(crate) fn db_exists(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<bool> {
    let path = path_string(py, path)?;
    run_here(py, move |_| ferrocaffe::storage::db_exists(&path, &db_type))
}

/// Removes the stale temporaries that interrupted saves of the file at
/// `path` left beside it (see `storage::sweep_stale_temporaries`).
#[pyfunction]
pub(crate) fn sweep_stale_temporaries(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    run_here(py, move |_| {
        ferrocaffe::storage::sweep_stale_temporaries(&path)
    })
}

/// Writes `data` to `path` as saves write dbs: a temporary, fsynced and
/// renamed over `path` (only a regular file is replaced), then the directory
/// fsynced.
#[pyfunction]
pub(crate) fn write_file_atomically(py: Python<'_>, path: PathBuf, data: Vec<u8>) -> PyResult<()> {
    let path = path_string(py, path)?;
    run_here(py, move |_| ferrocaffe::storage::write_file(&path, &data))
}
