//! `Workspace`: named blobs and the nets created in them.

use crate::convert::{
    array_to_tensor, copy_into_existing, decode, path_string, utf8, value_to_py, PyObjectBlob,
};
use crate::errors::to_py_err;
use crate::runner::{run_detached, run_here};
use ferrocaffe::blob::{BlobValue, Counter};
use ferrocaffe::ir;
use ferrocaffe::workspace::Workspace;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::path::PathBuf;
use std::sync::Arc;

/// A workspace: named blobs and the nets created in them.
#[pyclass(name = "Workspace", module = "ferrocaffe._core", frozen)]
pub struct PyWorkspace {
    pub(crate) ws: Arc<Workspace>,
}

#[pymethods]
impl PyWorkspace {
    #[new]
    #[pyo3(signature = (parent=None, root_folder=None))]
    fn new(
        py: Python<'_>,
        parent: Option<PyRef<'_, PyWorkspace>>,
        root_folder: Option<PathBuf>,
    ) -> PyResult<Self> {
        let ws = match parent {
            Some(p) => Workspace::new_child(&p.ws),
            None => Workspace::new(),
        };
        if let Some(r) = root_folder {
            ws.set_root_folder(&path_string(py, r)?);
        }
        Ok(PyWorkspace { ws })
    }

    #[getter]
    fn root_folder(&self) -> String {
        self.ws.root_folder()
    }

    #[setter]
    fn set_root_folder(&self, py: Python<'_>, root: PathBuf) -> PyResult<()> {
        self.ws.set_root_folder(&path_string(py, root)?);
        Ok(())
    }

    /// The parent workspace, if this is a child.
    #[getter]
    fn parent(&self) -> Option<PyWorkspace> {
        self.ws.parent().map(|p| PyWorkspace { ws: p.clone() })
    }

    /// Whether two handles refer to the same workspace.
    fn is_same(&self, other: PyRef<'_, PyWorkspace>) -> bool {
        Arc::ptr_eq(&self.ws, &other.ws)
    }

    fn has_blob(&self, name: &str) -> bool {
        self.ws.has_blob(name)
    }

    /// Every visible blob name (local and parents'), sorted.
    fn blobs(&self) -> Vec<String> {
        self.ws.blob_names()
    }

    /// Every visible blob as shape inference starts from it: a tensor's
    /// `(dims, TensorProto data type)`, None for anything else.
    fn blob_shapes(&self) -> std::collections::HashMap<String, crate::registry::PyShape> {
        self.ws
            .blob_names()
            .into_iter()
            .filter_map(|name| {
                let b = self.ws.get_blob(&name)?;
                let v = b.read();
                // A quantised tensor is known by its data's dims and dtype.
                let t = match &*v {
                    BlobValue::Tensor(t) => Some(t),
                    o @ BlobValue::Object(_) => o
                        .object_ref::<ferrocaffe::ops::int8::Int8Tensor>(
                            ferrocaffe::ops::int8::INT8_TAG,
                        )
                        .ok()
                        .map(|q| &q.data),
                    _ => None,
                };
                let s = t.map(|t| {
                    (
                        t.shape().iter().map(|&d| d as i64).collect(),
                        t.dtype() as i32,
                    )
                });
                Some((name, s))
            })
            .collect()
    }

    fn local_blobs(&self) -> Vec<String> {
        self.ws.local_blob_names()
    }

    /// Creates the blob if no blob of that name is visible.
    fn create_blob(&self, name: &str) {
        self.ws.create_blob(name);
    }

    /// Empties a blob's content (it keeps existing).
    fn reset_blob(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let b = self.ws.blob(name).map_err(|e| to_py_err(py, e))?;
        b.set(BlobValue::Empty);
        Ok(())
    }

    fn remove_blob(&self, name: &str) -> bool {
        self.ws.remove_blob(name)
    }

    /// What the blob holds: "Tensor<float32>", "Counter", "bytes", ...
    fn blob_kind(&self, py: Python<'_>, name: &str) -> PyResult<String> {
        let b = self.ws.blob(name).map_err(|e| to_py_err(py, e))?;
        let k = b.read().kind_name();
        Ok(k)
    }

    /// Feeds a numpy array, str or bytes into a blob (created if needed).
    fn feed_blob(&self, py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = if let Ok(b) = value.cast::<PyBytes>() {
            BlobValue::Bytes(b.as_bytes().to_vec())
        } else if let Ok(s) = value.cast::<PyString>() {
            BlobValue::Bytes(utf8(py, s, name)?)
        } else {
            if let Some(blob) = self.ws.get_blob(name) {
                if copy_into_existing(value, &blob) {
                    return Ok(());
                }
            }
            BlobValue::Tensor(array_to_tensor(py, value, name)?)
        };
        let ws = self.ws.clone();
        let name = name.to_string();
        py.detach(move || ws.feed(&name, v));
        Ok(())
    }

    /// Stores an arbitrary Python object in a blob.
    fn feed_object(&self, name: &str, value: Py<PyAny>) {
        self.ws
            .feed(name, BlobValue::Object(Arc::new(PyObjectBlob(value))));
    }

    /// A copy of a blob's content: a numpy array for tensors, bytes for byte
    /// strings, the object for Python objects, a description otherwise.
    /// With `copy=False` a tensor comes as a read-only numpy array viewing
    /// the tensor's own (shared, copy-on-write) buffer: nothing is copied,
    /// and later writes to the blob copy the buffer instead of changing
    /// the array.
    #[pyo3(signature = (name, copy = true))]
    fn fetch_blob(&self, py: Python<'_>, name: &str, copy: bool) -> PyResult<Py<PyAny>> {
        let b = self.ws.blob(name).map_err(|e| to_py_err(py, e))?;
        let g = b.read();
        value_to_py(py, name, &g, copy)
    }

    /// The value of a Counter blob.
    fn fetch_counter(&self, py: Python<'_>, name: &str) -> PyResult<i64> {
        let b = self.ws.blob(name).map_err(|e| to_py_err(py, e))?;
        let c = b
            .read()
            .object::<Counter>("Counter")
            .map_err(|e| to_py_err(py, e.with_blob(name)))?;
        Ok(c.get())
    }

    /// Caffe2's `SerializeBlob`: the blob as one serialised `BlobProto`.
    fn serialize_blob(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyBytes>> {
        let ws = self.ws.clone();
        let key = name.to_string();
        let bytes = run_here(py, move |_| {
            let b = ws.blob(&key)?;
            let v = b.read();
            ferrocaffe::storage::serialize_blob(&key, &v).map_err(|e| e.with_blob(&key))
        })?;
        Ok(PyBytes::new(py, &bytes).unbind())
    }

    /// Caffe2's `DeserializeBlob`: stores the value of a serialised
    /// `BlobProto` (a tensor in one chunk, a byte string, or an object with
    /// a registered codec) in blob `name`. Malformed bytes raise a typed
    /// error and leave the blob as it was.
    fn deserialize_blob(&self, py: Python<'_>, name: &str, data: &[u8]) -> PyResult<()> {
        let ws = self.ws.clone();
        let key = name.to_string();
        run_here(py, move |_| {
            let v = ferrocaffe::storage::deserialize_blob(data).map_err(|e| e.with_blob(&key))?;
            ws.feed(&key, v);
            Ok(())
        })
    }

    #[pyo3(signature = (net, overwrite=false))]
    fn create_net(&self, py: Python<'_>, net: &[u8], overwrite: bool) -> PyResult<String> {
        let def: ir::NetDef = decode(py, net, "NetDef")?;
        let ws = self.ws.clone();
        run_here(py, move |_| ws.create_net(&def, overwrite).map(|_| ()))?;
        Ok(String::new())
    }

    fn has_net(&self, name: &str) -> bool {
        self.ws.has_net(name)
    }

    fn nets(&self) -> Vec<String> {
        self.ws.net_names()
    }

    fn delete_net(&self, name: &str) -> bool {
        self.ws.delete_net(name)
    }

    /// Runs a created net `num_iter` times; False if an op failed softly.
    /// Runs a created net `num_iter` times (none if <= 0); False if an op
    /// failed softly. Interruptible with Ctrl-C.
    #[pyo3(signature = (name, num_iter=1))]
    fn run_net(&self, py: Python<'_>, name: &str, num_iter: i64) -> PyResult<bool> {
        let ws = self.ws.clone();
        let name = name.to_string();
        let n = num_iter.max(0) as usize;
        run_here(py, move |t| ws.run_net(&name, n, t))
    }

    /// Times a created net (Caffe2's `TEST_Benchmark`): `(times, op_types)`,
    /// times in ms: per main run, then (with `run_individual`) per op.
    fn benchmark_net(
        &self,
        py: Python<'_>,
        name: &str,
        warmup_runs: usize,
        main_runs: usize,
        run_individual: bool,
    ) -> PyResult<(Vec<f64>, Vec<String>)> {
        let ws = self.ws.clone();
        let name = name.to_string();
        run_here(py, move |t| {
            ws.benchmark_net(&name, warmup_runs, main_runs, run_individual, t)
        })
    }

    fn run_net_once(&self, py: Python<'_>, net: &[u8]) -> PyResult<bool> {
        let def: ir::NetDef = decode(py, net, "NetDef")?;
        let ws = self.ws.clone();
        run_here(py, move |t| ws.run_net_once(&def, t))
    }

    fn run_operator_once(&self, py: Python<'_>, op: &[u8]) -> PyResult<bool> {
        let def: ir::OperatorDef = decode(py, op, "OperatorDef")?;
        let ws = self.ws.clone();
        run_here(py, move |t| ws.run_operator_once(&def, t))
    }

    /// Runs a serialised PlanDef; Ctrl-C cancels it and raises KeyboardInterrupt.
    fn run_plan(&self, py: Python<'_>, plan: &[u8]) -> PyResult<bool> {
        let def: ir::PlanDef = decode(py, plan, "PlanDef")?;
        let ws = self.ws.clone();
        if ferrocaffe::plan::calls_off_thread(&def, &|op| {
            matches!(op.op_type(), "Python" | "PythonGradient")
        }) {
            run_detached(py, move |t| ws.run_plan(&def, t))
        } else {
            run_here(py, move |t| ws.run_plan(&def, t))
        }
    }

    /// Removes every blob and net of this workspace (not its parent's).
    fn clear(&self) {
        self.ws.clear();
    }

    fn __repr__(&self) -> String {
        format!(
            "Workspace(blobs={}, nets={})",
            self.ws.local_blob_names().len(),
            self.ws.net_names().len()
        )
    }
}
