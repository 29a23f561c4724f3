//! The thin PyO3 layer: `ferrocaffe._core`.
//!
//! Calls into the runtime go through [`run_here`] (or, for plans that may run
//! Python ops on threads of their own, [`run_detached`]): the GIL is released,
//! Ctrl-C is noticed, and errors are converted once into the
//! `ferrocaffe.errors` classes. Values cross the boundary as numpy arrays (one
//! copy each way) or protobuf bytes.

use crate::blob::{BlobValue, Counter};
use crate::cancel::CancelToken;
use crate::error::{from_panic, Error, ErrorKind};
use crate::ir;
use crate::tensor::Tensor;
use crate::workspace::Workspace;
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ errors --

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn kind_name(k: ErrorKind) -> &'static str {
    match k {
        ErrorKind::BlobNotFound => "BlobNotFound",
        ErrorKind::NetNotFound => "NetNotFound",
        ErrorKind::Type => "Type",
        ErrorKind::Shape => "Shape",
        ErrorKind::InvalidArgument => "InvalidArgument",
        ErrorKind::UnknownOperator => "UnknownOperator",
        ErrorKind::InvalidPlan => "InvalidPlan",
        ErrorKind::IndexOutOfRange => "IndexOutOfRange",
        ErrorKind::DivisionByZero => "DivisionByZero",
        ErrorKind::OperatorFailed => "OperatorFailed",
        ErrorKind::Cancelled => "Cancelled",
        ErrorKind::Io => "Io",
        ErrorKind::CorruptCheckpoint => "CorruptCheckpoint",
        ErrorKind::OutOfMemory => "OutOfMemory",
        ErrorKind::Internal => "Internal",
    }
}

/// Converts a runtime error into its Python exception (once, here).
pub(crate) fn to_py_err(py: Python<'_>, e: Error) -> PyErr {
    if let Some(payload) = &e.payload {
        if let Some(err) = payload.downcast_ref::<PyErr>() {
            return err.clone_ref(py);
        }
    }
    let build = || -> PyResult<PyErr> {
        let module = ERRORS_MODULE
            .get_or_try_init(py, || py.import("ferrocaffe.errors").map(|m| m.unbind()))?;
        let classes = module.bind(py).getattr("_BY_KIND")?;
        let cls = classes.get_item(kind_name(e.kind))?;
        let kwargs = PyDict::new(py);
        let c = &e.context;
        kwargs.set_item("op", c.op_type.clone())?;
        kwargs.set_item("op_index", c.op_index)?;
        kwargs.set_item("net", c.net.clone())?;
        kwargs.set_item("step", c.step.clone())?;
        kwargs.set_item("blob", c.blob.clone())?;
        kwargs.set_item("file", c.file.clone())?;
        let exc = cls.call((e.full_message(),), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|err| err)
}

fn guarded<T>(f: impl FnOnce() -> crate::Result<T>) -> crate::Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(from_panic(p)))
}

// ---------------------------------------------------------------- dispatch --
//
// A call runs on the calling thread with the GIL released (`run_here`): no
// hand-off to another thread, so its cost does not depend on whether a
// spare core exists. On Python's main thread the run's token polls for
// Ctrl-C (`cancel.rs`: blocking waits at every slice, busy loops when the
// watchdog asks), and a Python op in the run runs on this same thread,
// where a signal interrupts `time.sleep`, lock waits and loops as in plain
// Python. Only a plan that may run Python ops on threads it starts goes to
// a runner thread (`run_detached`), because such an op cannot be
// interrupted from outside and must be left behind if it does not return.

thread_local! {
    /// The token of the Python op running on this thread, if any: a run it
    /// starts (a re-entrant run) is cancelled with the run that called it.
    static CALLER: std::cell::RefCell<Option<CancelToken>> =
        const { std::cell::RefCell::new(None) };
}

/// Sets [`CALLER`] for the duration of a Python op's call.
struct CallerGuard(Option<CancelToken>);

impl CallerGuard {
    fn set(tok: &CancelToken) -> CallerGuard {
        CallerGuard(CALLER.with(|c| c.replace(Some(tok.clone()))))
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        CALLER.with(|c| *c.borrow_mut() = previous);
    }
}

fn caller_token() -> Option<CancelToken> {
    CALLER.with(|c| c.borrow().clone())
}

fn os_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// Whether this is Python's main thread, the one that runs signal handlers.
fn on_main_thread(py: Python<'_>) -> bool {
    static MAIN: PyOnceLock<u64> = PyOnceLock::new();
    let main = MAIN.get_or_init(py, || {
        (|| -> PyResult<u64> {
            py.import("threading")?
                .call_method0("main_thread")?
                .getattr("ident")?
                .extract()
        })()
        .unwrap_or(0)
    });
    *main == os_thread()
}

/// A call's token, and on the main thread where a signal's exception goes.
struct RunToken {
    tok: CancelToken,
    interrupt: Option<Arc<parking_lot::Mutex<Option<PyErr>>>>,
    _watched: Option<crate::cancel::Watched>,
}

impl RunToken {
    fn new(py: Python<'_>) -> RunToken {
        if let Some(parent) = caller_token() {
            // Nested in a Python op: the outer run polls (and is cancelled).
            return RunToken {
                tok: parent.child(),
                interrupt: None,
                _watched: None,
            };
        }
        if !on_main_thread(py) {
            return RunToken {
                tok: CancelToken::new(),
                interrupt: None,
                _watched: None,
            };
        }
        let slot = Arc::new(parking_lot::Mutex::new(None));
        let s2 = slot.clone();
        let tok = CancelToken::with_interrupt_check(move || {
            Python::attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    *s2.lock() = Some(e);
                    true
                }
            })
        });
        // Without the watchdog (no thread to be had) blocking waits still
        // poll; only busy loops then run to their end before Ctrl-C shows.
        let watched = crate::cancel::watch(&tok).ok();
        RunToken {
            tok,
            interrupt: Some(slot),
            _watched: watched,
        }
    }

    fn finish<T>(self, py: Python<'_>, r: crate::Result<T>) -> PyResult<T> {
        // A signal handler ran (and consumed the signal) inside the run: its
        // exception is raised even if the run finished first. Otherwise a
        // cancelled run (one nested in a Python op of a cancelled run) is
        // CancelledError, like every other error converted once.
        if let Some(e) = self.interrupt.as_ref().and_then(|s| s.lock().take()) {
            return Err(e);
        }
        r.map_err(|e| to_py_err(py, e))
    }
}

/// Runs `f` on this thread with the GIL released; see the section comment.
fn run_here<T: Send>(
    py: Python<'_>,
    f: impl FnOnce(&CancelToken) -> crate::Result<T> + Send,
) -> PyResult<T> {
    let run = RunToken::new(py);
    let tok = &run.tok;
    let r = py.detach(|| guarded(|| f(tok)));
    run.finish(py, r)
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Idle runner threads, each waiting on its own channel, and the process
/// they belong to (a forked child has the records but not the threads).
static IDLE_RUNNERS: parking_lot::Mutex<(u32, Vec<mpsc::Sender<Job>>)> =
    parking_lot::Mutex::new((0, Vec::new()));

fn submit(job: Job) -> crate::Result<()> {
    let idle = {
        let mut g = IDLE_RUNNERS.lock();
        let pid = std::process::id();
        if g.0 != pid {
            *g = (pid, Vec::new());
        }
        g.1.pop()
    };
    let job = match idle {
        Some(tx) => match tx.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (tx, rx) = mpsc::channel::<Job>();
    crate::threads::spawn("ferrocaffe-runner", move || {
        // Give the runner a Python thread state once and release the GIL:
        // Python ops on this thread then re-acquire it cheaply, instead of
        // creating and destroying a thread state on every call. Runs are
        // long here (see `run_detached`), so the runner sleeps between jobs.
        Python::attach(|py| {
            py.detach(move || {
                let mut next = Some(job);
                while let Some(job) = next.take() {
                    job();
                    IDLE_RUNNERS.lock().1.push(tx.clone());
                    next = rx.recv().ok();
                }
            })
        })
    })
    .map(|_| ())
    .map_err(|e| crate::threads::cannot_start("a plan run", &e))
}

/// How long an interrupted detached run may take to stop before its caller
/// stops waiting for it.
const GRACE: Duration = Duration::from_millis(250);

/// Runs `f` on a runner thread, the caller polling for Ctrl-C (and for the
/// cancellation of the run that called it) every 10 ms. When interrupted,
/// the run is cancelled and its Python ops are sent KeyboardInterrupt; if it
/// has not finished after [`GRACE`], it is abandoned: the call raises
/// KeyboardInterrupt and the run finishes in the background when its last
/// op returns (a net it holds says so until then, see `net::NetCell`).
fn run_detached<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce(&CancelToken) -> crate::Result<T> + Send + 'static,
) -> PyResult<T> {
    let tok = caller_token().map_or_else(CancelToken::new, |p| p.child());
    let (tx, rx) = mpsc::channel::<crate::Result<T>>();
    let tok2 = tok.clone();
    submit(Box::new(move || {
        let _ = tx.send(guarded(|| f(&tok2)));
    }))
    .map_err(|e| to_py_err(py, e))?;
    let tok3 = tok.clone();
    let (result, interrupt) = py.detach(move || {
        let mut interrupt: Option<PyErr> = None;
        let mut give_up_at: Option<Instant> = None;
        loop {
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok(r) => return (Some(r), interrupt),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return (
                        Some(Err(Error::internal("the runner thread died"))),
                        interrupt,
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            match give_up_at {
                None => {
                    interrupt = Python::attach(|py| py.check_signals().err());
                    if interrupt.is_some() || tok3.is_cancelled() {
                        tok3.cancel();
                        Python::attach(|py| interrupt_python_ops(py, &tok3));
                        give_up_at = Some(Instant::now() + GRACE);
                    }
                }
                Some(t) if Instant::now() >= t => return (None, interrupt),
                Some(_) => {}
            }
        }
    });
    match (result, interrupt) {
        (_, Some(e)) if !e.is_instance_of::<PyKeyboardInterrupt>(py) => Err(e),
        (Some(_), Some(e)) => Err(e),
        (Some(r), None) => r.map_err(|e| to_py_err(py, e)),
        (None, _) => {
            tok.abandon();
            Err(PyKeyboardInterrupt::new_err(format!(
                "the run was interrupted, but a Python op in it has not returned within {} ms: it was sent KeyboardInterrupt, the run is cancelled and finishes when that op returns; until then the net running it stays busy (running that net again raises an error saying so)",
                GRACE.as_millis()
            )))
        }
    }
}

/// Raises KeyboardInterrupt in the Python ops of the run of `tok` that are
/// running now (on other threads: blocked ones see it when they next run
/// Python code, a busy loop at once).
fn interrupt_python_ops(_py: Python<'_>, tok: &CancelToken) {
    for t in crate::cancel::interrupt_external_calls_under(tok) {
        // SAFETY: the GIL is held; `t` is the ident of a thread inside a
        // Python op, which stays registered (and so inside the op) while
        // the GIL is held here (it unregisters holding the GIL).
        unsafe {
            pyo3::ffi::PyThreadState_SetAsyncExc(
                t as std::os::raw::c_long,
                pyo3::ffi::PyExc_KeyboardInterrupt,
            );
        }
    }
}

fn feed_error(py: Python<'_>, msg: String, blob: &str) -> PyErr {
    let e = Error::type_error(msg).with_blob(blob);
    let err = to_py_err(py, e);
    // Re-class as FeedError (a DataTypeError).
    let build = || -> PyResult<PyErr> {
        let m = py.import("ferrocaffe.errors")?;
        let exc = m
            .getattr("FeedError")?
            .call((err.value(py).str()?.to_string(),), None)?;
        exc.setattr("blob", blob)?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or(err)
}

// --------------------------------------------------------- value convert --

/// A str as UTF-8 bytes; a str that has no UTF-8 form is a FeedError.
fn utf8(py: Python<'_>, s: &Bound<'_, PyString>, blob: &str) -> PyResult<Vec<u8>> {
    s.to_str().map(|s| s.as_bytes().to_vec()).map_err(|_| {
        feed_error(
            py,
            format!("cannot feed a str that has no UTF-8 encoding into blob '{blob}'"),
            blob,
        )
    })
}

fn array_to_tensor(py: Python<'_>, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Tensor> {
    macro_rules! try_dtype {
        ($t:ty) => {
            if let Ok(a) = obj.cast::<PyArrayDyn<$t>>() {
                let ro = a
                    .try_readonly()
                    .map_err(|e| feed_error(py, e.to_string(), name))?;
                let a = crate::tensor::copy_array(ro.as_array())
                    .map_err(|e| to_py_err(py, e.with_blob(name)))?;
                return Ok(Tensor::from(a));
            }
        };
    }
    try_dtype!(f32);
    try_dtype!(f64);
    try_dtype!(i32);
    try_dtype!(i64);
    try_dtype!(bool);
    try_dtype!(u8);
    try_dtype!(i8);
    try_dtype!(i16);
    try_dtype!(u16);
    if let Ok(a) = obj.cast::<PyArrayDyn<Py<PyAny>>>() {
        let ro = a
            .try_readonly()
            .map_err(|e| feed_error(py, e.to_string(), name))?;
        let view = ro.as_array();
        let mut out = Vec::with_capacity(view.len());
        for item in view.iter() {
            let item = item.bind(py);
            if let Ok(b) = item.cast::<PyBytes>() {
                out.push(b.as_bytes().to_vec());
            } else if let Ok(s) = item.cast::<PyString>() {
                out.push(utf8(py, s, name)?);
            } else {
                return Err(feed_error(
                    py,
                    format!("cannot feed an object array holding {}: only str and bytes elements are supported", item.get_type().name()?),
                    name,
                ));
            }
        }
        let shape = view.shape().to_vec();
        return Ok(Tensor::Str(
            ArrayD::from_shape_vec(IxDyn(&shape), out).expect("shape matches"),
        ));
    }
    let desc = match obj.cast::<PyUntypedArray>() {
        Ok(a) => format!("a numpy array of dtype {}", a.dtype().str()?),
        Err(_) => format!("an object of type {}", obj.get_type().name()?),
    };
    Err(feed_error(
        py,
        format!("cannot feed {desc} into blob '{name}': supported are numpy arrays of float32, float64, int32, int64, bool, uint8, int8, int16, uint16 and str/bytes, and str or bytes"),
        name,
    ))
}

/// Feeding an array over a tensor of the same dtype and shape copies into the
/// existing buffer (one copy into warm memory, as Caffe2 reused a tensor's
/// capacity). Only when the blob's lock is free right now: never wait for a
/// running op while holding the GIL. Returns whether it did.
fn copy_into_existing(obj: &Bound<'_, PyAny>, blob: &crate::blob::Blob) -> bool {
    macro_rules! try_dtype {
        ($t:ty) => {
            if let Ok(a) = obj.cast::<PyArrayDyn<$t>>() {
                let Ok(ro) = a.try_readonly() else {
                    return false;
                };
                let src = ro.as_array();
                let Some(mut g) = blob.try_write() else {
                    return false;
                };
                if let BlobValue::Tensor(t) = &mut *g {
                    if let Some(dst) = <$t as crate::tensor::Element>::view_mut(t) {
                        if dst.shape() == src.shape() {
                            match (dst.as_slice_mut(), src.as_slice()) {
                                (Some(d), Some(s)) => d.copy_from_slice(s),
                                _ => dst.assign(&src),
                            }
                            return true;
                        }
                    }
                }
                return false;
            }
        };
    }
    try_dtype!(f32);
    try_dtype!(f64);
    try_dtype!(i32);
    try_dtype!(i64);
    try_dtype!(bool);
    try_dtype!(u8);
    try_dtype!(i8);
    try_dtype!(i16);
    try_dtype!(u16);
    false
}

/// A numpy copy of a tensor. The destination is allocated by numpy itself
/// (which asks the kernel for huge pages on large arrays), then filled with
/// one copy: as fast as `arr.copy()` in numpy.
/// Arrays at least this large are copied out by the kernel pool's threads.
const PARALLEL_COPY_BYTES: usize = 4 << 20;

/// A numpy copy of `a`. A large contiguous array is copied in parallel
/// pieces: the copy into fresh memory (page faults included) is what a
/// fetch costs, and one core does it at a fraction of the memory's speed.
/// The GIL stays held, as for any copy (the pool's threads do not need it),
/// so nothing else can see the array before it is complete.
fn array_to_py<T>(py: Python<'_>, a: &ArrayD<T>) -> Py<PyAny>
where
    T: numpy::Element + Copy + Send + Sync,
{
    let bytes = a.len().saturating_mul(std::mem::size_of::<T>());
    let src = match a.as_slice() {
        // The pool's threads copy; without a pool, one copy on this thread.
        Some(src) if bytes >= PARALLEL_COPY_BYTES && crate::threads::pool_available() => src,
        _ => return PyArrayDyn::from_array(py, a).into_any().unbind(),
    };
    // SAFETY: every element is written below before the array is returned.
    let out = unsafe { PyArrayDyn::<T>::new(py, a.shape(), false) };
    // SAFETY: a fresh C-contiguous array of src.len() elements, not yet
    // shared with Python code.
    let dst = unsafe { out.as_slice_mut() }.expect("a new array is contiguous");
    use rayon::prelude::*;
    let piece = (PARALLEL_COPY_BYTES / std::mem::size_of::<T>()).max(1);
    dst.par_chunks_mut(piece)
        .zip(src.par_chunks(piece))
        .for_each(|(d, s)| d.copy_from_slice(s));
    out.into_any().unbind()
}

fn tensor_to_py(py: Python<'_>, t: &Tensor) -> PyResult<Py<PyAny>> {
    Ok(match t {
        Tensor::F32(a) => array_to_py(py, a),
        Tensor::F64(a) => array_to_py(py, a),
        Tensor::I32(a) => array_to_py(py, a),
        Tensor::I64(a) => array_to_py(py, a),
        Tensor::Bool(a) => array_to_py(py, a),
        Tensor::U8(a) => array_to_py(py, a),
        Tensor::I8(a) => array_to_py(py, a),
        Tensor::I16(a) => array_to_py(py, a),
        Tensor::U16(a) => array_to_py(py, a),
        Tensor::Str(a) => {
            let objs = a.map(|b| PyBytes::new(py, b).into_any().unbind());
            PyArrayDyn::from_owned_array(py, objs).into_any().unbind()
        }
    })
}

fn value_to_py(py: Python<'_>, name: &str, v: &BlobValue) -> PyResult<Py<PyAny>> {
    Ok(match v {
        BlobValue::Tensor(t) => tensor_to_py(py, t)?,
        BlobValue::Bytes(b) => PyBytes::new(py, b).into_any().unbind(),
        BlobValue::Empty => PyBytes::new(
            py,
            format!("{name}, a C++ native class of type nullptr (uninitialized).").as_bytes(),
        )
        .into_any()
        .unbind(),
        BlobValue::Object(o) => {
            if let Some(obj) = crate::bindings::python_object(py, o) {
                return Ok(obj);
            }
            PyBytes::new(
                py,
                format!("{name}, a C++ native class of type {}.", o.kind_name()).as_bytes(),
            )
            .into_any()
            .unbind()
        }
    })
}

/// A Python object stored in a blob (by Python ops, or fed by users).
#[derive(Debug)]
pub(crate) struct PyObjectBlob(pub Py<PyAny>);

impl crate::blob::BlobObject for PyObjectBlob {
    fn kind_name(&self) -> &'static str {
        "PythonObject"
    }
}

fn python_object(py: Python<'_>, o: &Arc<dyn crate::blob::BlobObject>) -> Option<Py<PyAny>> {
    let any: Arc<dyn std::any::Any + Send + Sync> = o.clone();
    any.downcast::<PyObjectBlob>()
        .ok()
        .map(|p| p.0.clone_ref(py))
}

fn decode<M: prost::Message + Default>(py: Python<'_>, bytes: &[u8], what: &str) -> PyResult<M> {
    ir::decode(bytes, what).map_err(|e| to_py_err(py, e))
}

// --------------------------------------------------------------- Workspace --

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
    fn fetch_blob(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let b = self.ws.blob(name).map_err(|e| to_py_err(py, e))?;
        let g = b.read();
        value_to_py(py, name, &g)
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
            crate::storage::serialize_blob(&key, &v).map_err(|e| e.with_blob(&key))
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
            let v = crate::storage::deserialize_blob(data).map_err(|e| e.with_blob(&key))?;
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
        if crate::plan::calls_off_thread(&def, &|op| op.op_type() == "Python") {
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

/// A plan running on a background thread (RunPlanInBackground).
#[pyclass(name = "BackgroundPlan", module = "ferrocaffe._core", frozen)]
pub struct PyBackgroundPlan {
    tok: CancelToken,
    state: Arc<parking_lot::Mutex<Option<crate::Result<bool>>>>,
    handle: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[pymethods]
impl PyBackgroundPlan {
    fn is_done(&self) -> bool {
        self.state.lock().is_some()
    }
    /// True when finished and successful; False while running or after failure.
    fn is_succeeded(&self) -> bool {
        matches!(*self.state.lock(), Some(Ok(true)))
    }
    fn cancel(&self) {
        self.tok.cancel();
    }
    /// Waits for the plan; raises its error, returns its result.
    fn wait(&self, py: Python<'_>) -> PyResult<bool> {
        let h = self.handle.lock().take();
        if let Some(h) = h {
            py.detach(|| {
                let _ = h.join();
            });
        }
        match self.state.lock().clone() {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(to_py_err(py, e)),
            None => Ok(false),
        }
    }
}

#[pyfunction]
fn run_plan_in_background(
    py: Python<'_>,
    ws: PyRef<'_, PyWorkspace>,
    plan: &[u8],
) -> PyResult<PyBackgroundPlan> {
    let def: ir::PlanDef = decode(py, plan, "PlanDef")?;
    let ws = ws.ws.clone();
    let tok = CancelToken::new();
    let state = Arc::new(parking_lot::Mutex::new(None));
    let (t2, s2) = (tok.clone(), state.clone());
    let handle = crate::threads::spawn("ferrocaffe-background-plan", move || {
        let r = guarded(|| ws.run_plan(&def, &t2));
        *s2.lock() = Some(r);
    })
    .map_err(|e| to_py_err(py, crate::threads::cannot_start("a background plan", &e)))?;
    Ok(PyBackgroundPlan {
        tok,
        state,
        handle: parking_lot::Mutex::new(Some(handle)),
    })
}

/// `core.Net`'s pending ops, serialised as the `op` fields of a NetDef (to
/// be merged into its NetDef). Each item is a serialised OperatorDef
/// (bytes) or a tuple `(type, inputs, outputs, args)`: two lists of str
/// and a list of serialised Arguments, for an op whose name is "" and whose
/// other fields are unset (see `ir::append_net_op`).
#[pyfunction]
fn encode_net_ops<'py>(py: Python<'py>, ops: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyBytes>> {
    fn all<'py, T: pyo3::type_object::PyTypeCheck>(
        list: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, T>>> {
        list.cast::<PyList>()?
            .iter()
            .map(|item| item.cast_into::<T>().map_err(PyErr::from))
            .collect()
    }
    let mut out = Vec::with_capacity(ops.len() * 48);
    let mut scratch = Vec::new();
    for item in ops.iter() {
        if let Ok(op) = item.cast::<PyBytes>() {
            ir::append_net_op_bytes(&mut out, op.as_bytes());
            continue;
        }
        let t = item.cast::<PyTuple>()?;
        let (op_type, inputs, outputs, args) = (
            t.get_item(0)?,
            t.get_item(1)?,
            t.get_item(2)?,
            t.get_item(3)?,
        );
        let (inputs, outputs) = (all::<PyString>(&inputs)?, all::<PyString>(&outputs)?);
        let args = all::<PyBytes>(&args)?;
        let ins: Vec<&str> = inputs.iter().map(|s| s.to_str()).collect::<PyResult<_>>()?;
        let outs: Vec<&str> = outputs
            .iter()
            .map(|s| s.to_str())
            .collect::<PyResult<_>>()?;
        let arg_bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        ir::append_net_op(
            &mut out,
            &mut scratch,
            &ir::OpFields {
                op_type: op_type.cast::<PyString>()?.to_str()?,
                name: "",
                inputs: &ins,
                outputs: &outs,
                args: &arg_bytes,
            },
        );
    }
    Ok(PyBytes::new(py, &out))
}

/// Every registered operator type, sorted.
#[pyfunction]
fn registered_operators() -> Vec<&'static str> {
    crate::operator::registered_ops()
}

/// An operator's schema as a dict (counts, args, the arguments it accepts
/// and ignores, doc), or None.
#[pyfunction]
fn operator_schema(py: Python<'_>, op_type: &str) -> PyResult<Option<Py<PyDict>>> {
    let Some(s) = crate::operator::schema(op_type) else {
        return Ok(None);
    };
    // usize::MAX (no upper bound) becomes None.
    let bound = |n: usize| (n != usize::MAX).then_some(n);
    let d = PyDict::new(py);
    d.set_item("name", s.name)?;
    d.set_item("min_inputs", s.min_inputs)?;
    d.set_item("max_inputs", bound(s.max_inputs))?;
    d.set_item("min_outputs", s.min_outputs)?;
    d.set_item("max_outputs", bound(s.max_outputs))?;
    d.set_item("doc", s.doc)?;
    let args = PyList::empty(py);
    for a in s.args {
        args.append((a.name, a.ty, a.default, a.doc))?;
    }
    d.set_item("args", args)?;
    // Accepted and ignored: the op's own list, then the engine hints.
    let ignored = PyList::empty(py);
    for a in s.ignored.iter().chain(crate::operator::ENGINE_HINTS) {
        if !s.args.iter().any(|own| own.name == a.name) {
            ignored.append((a.name, a.ty, a.default, a.doc))?;
        }
    }
    d.set_item("ignored", ignored)?;
    Ok(Some(d.unbind()))
}

/// A path argument (a str or any os.PathLike, such as pathlib.Path) as the
/// UTF-8 string the core's paths are.
fn path_string(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    path.into_os_string().into_string().map_err(|p| {
        to_py_err(
            py,
            Error::invalid_arg(format!("the path {p:?} is not valid UTF-8")),
        )
    })
}

/// The entries of a db: a list of dicts (name, kind, type, dtype, shape, bytes).
#[pyfunction]
#[pyo3(signature = (path, db_type=String::from("ferro")))]
fn list_db(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<Vec<Py<PyDict>>> {
    let path = path_string(py, path)?;
    let entries = run_here(py, move |_| crate::storage::list_db(&path, &db_type))?;
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

/// Checks every checksum of a db; raises CorruptCheckpointError on damage.
#[pyfunction]
#[pyo3(signature = (path, db_type=String::from("ferro")))]
fn verify_db(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<()> {
    let path = path_string(py, path)?;
    run_here(py, move |_| crate::storage::verify_db(&path, &db_type))
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
fn map_ferro(
    py: Python<'_>,
    data: numpy::PyReadonlyArray1<'_, u8>,
    path: PathBuf,
    verify: bool,
) -> PyResult<Vec<(String, &'static str, Py<PyAny>)>> {
    use crate::storage::MappedData;
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
        crate::storage::map_ferro(&path, bytes, verify, cancel)
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
                MappedData::Decoded(v) => ("value", value_to_py(py, &b.name, &v)?),
                MappedData::Object { type_tag } => {
                    ("object", PyString::new(py, &type_tag).into_any().unbind())
                }
            };
            Ok((b.name, kind, info))
        })
        .collect()
}

#[pyfunction]
#[pyo3(signature = (path, db_type=String::from("ferro")))]
fn db_exists(py: Python<'_>, path: PathBuf, db_type: String) -> PyResult<bool> {
    let path = path_string(py, path)?;
    run_here(py, move |_| crate::storage::db_exists(&path, &db_type))
}

/// Removes the stale temporaries that interrupted saves of the file at
/// `path` left beside it (see `storage::sweep_stale_temporaries`).
#[pyfunction]
fn sweep_stale_temporaries(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    run_here(py, move |_| crate::storage::sweep_stale_temporaries(&path))
}

/// Writes `data` to `path` as saves write dbs: a temporary, fsynced and
/// renamed over `path` (only a regular file is replaced), then the directory
/// fsynced.
#[pyfunction]
fn write_file_atomically(py: Python<'_>, path: PathBuf, data: Vec<u8>) -> PyResult<()> {
    let path = path_string(py, path)?;
    run_here(py, move |_| crate::storage::write_file(&path, &data))
}

/// Fixes the size of the kernel (rayon) pool; see `crate::threads`.
#[pyfunction]
fn set_num_threads(py: Python<'_>, n: usize) -> PyResult<bool> {
    crate::threads::set_num_threads(n).map_err(|e| to_py_err(py, e))
}

/// Threads in the kernel (rayon) pool.
#[pyfunction]
fn num_threads() -> usize {
    crate::threads::num_threads()
}

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWorkspace>()?;
    m.add_class::<PyBackgroundPlan>()?;
    m.add_class::<PyTensorWrapper>()?;
    register_python_op();
    m.add_function(wrap_pyfunction!(run_plan_in_background, m)?)?;
    m.add_function(wrap_pyfunction!(registered_operators, m)?)?;
    m.add_function(wrap_pyfunction!(operator_schema, m)?)?;
    m.add_function(wrap_pyfunction!(list_db, m)?)?;
    m.add_function(wrap_pyfunction!(map_ferro, m)?)?;
    m.add_function(wrap_pyfunction!(verify_db, m)?)?;
    m.add_function(wrap_pyfunction!(db_exists, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_stale_temporaries, m)?)?;
    m.add_function(wrap_pyfunction!(write_file_atomically, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(encode_net_ops, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // caffe2.proto, compiled: Python makes its caffe2_pb2 classes from it.
    m.add(
        "CAFFE2_FILE_DESCRIPTOR_SET",
        pyo3::types::PyBytes::new(m.py(), ir::FILE_DESCRIPTOR_SET),
    )?;
    Ok(())
}

// --------------------------------------------------------------- Python op --

/// The arrays a Python op's function got through `.data` during one call.
///
/// Caffe2 handed out views of the tensors, so writes reached the blobs. A
/// view is not safe here: the op holds no lock while Python runs (the
/// function may feed, or run nets on, the same blobs), so the buffer under a
/// view could be replaced or freed mid-call. Instead `.data` hands out a copy,
/// the same array for every `.data` of one blob during the call, and when the
/// function returns, each array that differs (bit for bit) from what it was
/// made from is written to its blob. Arrays whose blob was replaced since
/// (`feed`, `reshape`) and every array once the call is over become
/// read-only, so a late write raises instead of vanishing.
#[derive(Default)]
struct HandedArrays {
    /// Whether the function is still running (arrays handed out now are
    /// written back when it returns).
    open: bool,
    entries: Vec<Handed>,
}

struct Handed {
    blob: crate::blob::Blob,
    name: String,
    array: Py<PyAny>,
    /// The tensor the array was copied from.
    before: Tensor,
}

type CallArrays = Arc<parking_lot::Mutex<HandedArrays>>;

fn set_read_only(py: Python<'_>, array: &Py<PyAny>) -> PyResult<()> {
    array.call_method1(py, "setflags", (false,)).map(|_| ())
}

impl HandedArrays {
    /// Forgets the array of `blob`, which is being replaced, making it
    /// read-only (its writes are superseded by the new content).
    fn supersede(call: &CallArrays, py: Python<'_>, blob: &crate::blob::Blob) -> PyResult<()> {
        let gone: Vec<Handed> = {
            let mut g = call.lock();
            let (gone, kept) = std::mem::take(&mut g.entries)
                .into_iter()
                .partition(|h| Arc::ptr_eq(&h.blob, blob));
            g.entries = kept;
            gone
        };
        gone.iter().try_for_each(|h| set_read_only(py, &h.array))
    }

    /// Ends the call: writes back every changed array when the function
    /// succeeded (`write_back`), then makes all of them read-only.
    fn close(call: &CallArrays, py: Python<'_>, write_back: bool) -> PyResult<()> {
        let entries = {
            let mut g = call.lock();
            g.open = false;
            std::mem::take(&mut g.entries)
        };
        let mut result = Ok(());
        for h in &entries {
            if write_back && result.is_ok() {
                result = array_to_tensor(py, h.array.bind(py), &h.name).map(|after| {
                    if !after.same_bits(&h.before) {
                        py.detach(|| h.blob.set(BlobValue::Tensor(after)));
                    }
                });
            }
            set_read_only(py, &h.array)?;
        }
        result
    }
}

/// One blob as seen by a Python op: Caffe2's TensorCPU wrapper.
#[pyclass(name = "TensorWrapper", module = "ferrocaffe._core", frozen)]
pub struct PyTensorWrapper {
    blob: crate::blob::Blob,
    name: String,
    call: CallArrays,
}

#[pymethods]
impl PyTensorWrapper {
    /// The tensor as a numpy array. Writes to it reach the blob when the
    /// op's function returns (see `HandedArrays`); after the call, or after
    /// `feed`/`reshape` of this blob, the array is read-only.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(h) = self
            .call
            .lock()
            .entries
            .iter()
            .find(|h| Arc::ptr_eq(&h.blob, &self.blob))
        {
            return Ok(h.array.clone_ref(py));
        }
        let v = py.detach(|| self.blob.get());
        let t = match v {
            BlobValue::Tensor(t) => t,
            BlobValue::Empty => {
                // Nothing to write into: reshape (or feed) first.
                let a = PyArrayDyn::<f32>::zeros(py, IxDyn(&[0]), false)
                    .into_any()
                    .unbind();
                set_read_only(py, &a)?;
                return Ok(a);
            }
            // Byte strings come back as (immutable) bytes, Python objects
            // as themselves, other objects as a description.
            other => return value_to_py(py, &self.name, &other),
        };
        let array = tensor_to_py(py, &t)?;
        let mut g = self.call.lock();
        if !g.open {
            drop(g);
            set_read_only(py, &array)?;
            return Ok(array);
        }
        // Another thread of the function may have asked while the GIL was
        // released above: one array per blob.
        if let Some(h) = g.entries.iter().find(|h| Arc::ptr_eq(&h.blob, &self.blob)) {
            return Ok(h.array.clone_ref(py));
        }
        g.entries.push(Handed {
            blob: self.blob.clone(),
            name: self.name.clone(),
            array: array.clone_ref(py),
            before: t,
        });
        Ok(array)
    }

    /// The dims, as a tuple (numpy's and Caffe2's form).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let dims = py.detach(|| match &*self.blob.read() {
            BlobValue::Tensor(t) => t.shape().to_vec(),
            _ => vec![0],
        });
        PyTuple::new(py, dims)
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Replaces the blob's content with the array (or str/bytes).
    fn feed(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        let v = if let Ok(b) = value.cast::<PyBytes>() {
            BlobValue::Bytes(b.as_bytes().to_vec())
        } else {
            let value = py
                .import("ferrocaffe.workspace")?
                .getattr("_to_feedable")?
                .call1((&self.name, value))?;
            if let Ok(s) = value.cast::<PyString>() {
                BlobValue::Bytes(utf8(py, s, &self.name)?)
            } else {
                BlobValue::Tensor(array_to_tensor(py, &value, &self.name)?)
            }
        };
        HandedArrays::supersede(&self.call, py, &self.blob)?;
        py.detach(|| self.blob.set(v));
        Ok(true)
    }

    /// Resizes the tensor (keeping its dtype, float32 if it had none); the
    /// contents become zeros.
    fn reshape(&self, py: Python<'_>, shape: Vec<usize>) -> PyResult<()> {
        HandedArrays::supersede(&self.call, py, &self.blob)?;
        py.detach(|| {
            let mut g = self.blob.write();
            let dtype = match &*g {
                BlobValue::Tensor(t) => t.dtype(),
                _ => crate::tensor::DataType::Float,
            };
            Tensor::zeros(dtype, &shape).map(|t| *g = BlobValue::Tensor(t))
        })
        .map_err(|e| to_py_err(py, e))
    }
}

fn wrap_blobs<'py>(
    py: Python<'py>,
    blobs: &[crate::blob::Blob],
    names: &[String],
    call: &CallArrays,
) -> PyResult<Bound<'py, PyList>> {
    let l = PyList::empty(py);
    for (b, n) in blobs.iter().zip(names) {
        l.append(Py::new(
            py,
            PyTensorWrapper {
                blob: b.clone(),
                name: n.clone(),
                call: call.clone(),
            },
        )?)?;
    }
    Ok(l)
}

struct PythonOp {
    func: Py<PyAny>,
    pass_workspace: bool,
}

impl crate::operator::Operator for PythonOp {
    fn run(&mut self, cx: &mut crate::operator::OpCx<'_>) -> crate::Result<bool> {
        Python::attach(|py| {
            let arrays: CallArrays = Arc::new(parking_lot::Mutex::new(HandedArrays {
                open: true,
                entries: Vec::new(),
            }));
            let call = || -> PyResult<()> {
                let ins = wrap_blobs(py, &cx.io.inputs, &cx.io.input_names, &arrays)?;
                let outs = wrap_blobs(py, &cx.io.outputs, &cx.io.output_names, &arrays)?;
                if self.pass_workspace {
                    let ws = py
                        .import("ferrocaffe._python_ops")?
                        .getattr("_wrap_workspace")?
                        .call1((PyWorkspace { ws: cx.ws.clone() },))?;
                    self.func.call1(py, (ins, outs, ws))?;
                } else {
                    self.func.call1(py, (ins, outs))?;
                }
                Ok(())
            };
            // Registered (and unregistered) with the GIL held, so an
            // interrupt (`interrupt_python_ops`) reaches the call only while
            // it is in progress; runs it starts are cancelled with this one.
            let registered = crate::cancel::ExternalCall::enter(cx.cancel);
            let caller = CallerGuard::set(cx.cancel);
            let ran = call();
            drop(caller);
            if registered.leave() {
                // An interrupt sent after its last chance to fire would
                // fire in whatever Python code this thread runs next.
                // SAFETY: the GIL is held; a NULL exception clears it.
                unsafe {
                    pyo3::ffi::PyThreadState_SetAsyncExc(
                        os_thread() as std::os::raw::c_long,
                        std::ptr::null_mut(),
                    );
                }
            }
            let closed = HandedArrays::close(&arrays, py, ran.is_ok());
            match ran.and(closed) {
                // An interrupted run goes no further than this op.
                Ok(()) => cx.cancel.check().map(|_| true),
                Err(err) => {
                    let msg = format!(
                        "Python op raised {}",
                        err.value(py)
                            .repr()
                            .map(|r| r.to_string())
                            .unwrap_or_default()
                    );
                    let mut e = Error::failed(msg);
                    e.payload = Some(Arc::new(err));
                    Err(e)
                }
            }
        })
    }
}

impl Drop for PythonOp {
    fn drop(&mut self) {
        // Release the function with the GIL held (the op may die on any thread).
        let f = std::mem::replace(&mut self.func, Python::attach(|py| py.None()));
        Python::attach(move |_| drop(f));
    }
}

fn build_python_op(
    ctx: &crate::operator::OpDefCtx<'_>,
) -> crate::Result<Box<dyn crate::operator::Operator>> {
    let token = ctx.args.string_opt("token")?;
    let pickled = ctx.args.bytes_opt("pickled_builder")?;
    let pass_ws = ctx.args.bool("pass_workspace", false)?;
    if token.is_none() && pickled.is_none() {
        return Err(ctx.bad_arg("a Python op needs a 'token' or a 'pickled_builder' argument"));
    }
    Python::attach(|py| {
        let r = (|| -> PyResult<(Py<PyAny>, bool)> {
            let m = py.import("ferrocaffe._python_ops")?;
            let pickled = pickled.as_ref().map(|b| PyBytes::new(py, b));
            let out = m
                .getattr("build")?
                .call1((token.clone(), pickled, pass_ws))?;
            out.extract::<(Py<PyAny>, bool)>()
        })();
        r.map_err(|err| {
            let text = err
                .value(py)
                .str()
                .map(|s| s.to_string())
                .unwrap_or_default();
            let mut e = Error::invalid_arg(format!("cannot build the Python op: {text}"));
            // A builder's own exception reaches the caller as raised; a
            // refusal of ours (an untrusted pickled builder) becomes a
            // runtime error, so that it names the op's net.
            let ours = py
                .import("ferrocaffe.errors")
                .and_then(|m| m.getattr("FerrocaffeError"))
                .is_ok_and(|cls| err.value(py).is_instance(&cls).unwrap_or(false));
            if ours {
                e = Error::invalid_arg(text);
            } else {
                e.payload = Some(Arc::new(err));
            }
            e
        })
    })
    .map(|(func, pass_workspace)| {
        Box::new(PythonOp {
            func,
            pass_workspace,
        }) as Box<dyn crate::operator::Operator>
    })
}

pub(crate) fn register_python_op() {
    use crate::operator::{InPlace, OpSchema, MANY};
    crate::operator::register(
        OpSchema::new("Python", build_python_op)
            .inputs(0, MANY)
            .outputs(0, MANY)
            .inplace(InPlace::Allow(|_, _| true))
            .args(&[
                crate::arg!("token", "string", "", "key of a function registered with Net.Python"),
                crate::arg!("pickled_builder", "bytes", "", "pickled (builder, args, kwargs), called once per op instance"),
                crate::arg!("pass_workspace", "bool", "false", "also pass the op's workspace to the function"),
            ])
            .ignores(&[
                crate::arg!("grad_output_indices", "list of int", "[]", "for the gradient op; accepted and ignored (no gradients here)"),
                crate::arg!("grad_input_indices", "list of int", "[]", "for the gradient op; accepted and ignored (no gradients here)"),
                crate::arg!("pickled_grad_builder", "bytes", "", "for the gradient op; accepted and ignored (no gradients here)"),
            ])
            .doc("Calls a Python function f(inputs, outputs[, workspace]) with tensor wrappers; holds the GIL while it runs."),
    );
}
