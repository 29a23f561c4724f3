//! The `Python` operator: calls a Python function with tensor wrappers.

use crate::convert::{array_to_tensor, tensor_to_py, utf8, value_to_py};
use crate::errors::to_py_err;
use crate::runner::{os_thread, CallerGuard};
use crate::workspace::PyWorkspace;
use ferrocaffe::blob::BlobValue;
use ferrocaffe::error::Error;
use ferrocaffe::tensor::Tensor;
use numpy::ndarray::IxDyn;
use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::sync::Arc;

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
    blob: ferrocaffe::blob::Blob,
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
    fn supersede(call: &CallArrays, py: Python<'_>, blob: &ferrocaffe::blob::Blob) -> PyResult<()> {
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
    blob: ferrocaffe::blob::Blob,
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
            other => return value_to_py(py, &self.name, &other, true),
        };
        let array = tensor_to_py(py, &t, &self.name)?;
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
                _ => ferrocaffe::tensor::DataType::Float,
            };
            Tensor::zeros(dtype, &shape).map(|t| *g = BlobValue::Tensor(t))
        })
        .map_err(|e| to_py_err(py, e))
    }
}

fn wrap_blobs<'py>(
    py: Python<'py>,
    blobs: &[ferrocaffe::blob::Blob],
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

impl ferrocaffe::operator::Operator for PythonOp {
    fn run(&mut self, cx: &mut ferrocaffe::operator::OpCx<'_>) -> ferrocaffe::Result<bool> {
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
            let registered = ferrocaffe::cancel::ExternalCall::enter(cx.cancel);
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
    ctx: &ferrocaffe::operator::OpDefCtx<'_>,
) -> ferrocaffe::Result<Box<dyn ferrocaffe::operator::Operator>> {
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
        }) as Box<dyn ferrocaffe::operator::Operator>
    })
}

pub(crate) fn register_python_op() {
    use ferrocaffe::operator::{InPlace, OpSchema, MANY};
    for (name, doc) in [
        ("Python", "Calls a Python function f(inputs, outputs[, workspace]) with tensor wrappers; holds the GIL while it runs."),
        ("PythonGradient", "The gradient of a Python op (made by AddGradientOperators): calls its grad_f with [inputs, outputs, output gradients] and [input gradients]."),
    ] {
    ferrocaffe::operator::register(
        OpSchema::new(name, build_python_op)
            .inputs(0, MANY)
            .outputs(0, MANY)
            .inplace(InPlace::Allow(|_, _| true))
            .args(&[
                ferrocaffe::arg!("token", "string", "", "key of a function registered with Net.Python"),
                ferrocaffe::arg!("pickled_builder", "bytes", "", "pickled (builder, args, kwargs), called once per op instance"),
                ferrocaffe::arg!("pass_workspace", "bool", "false", "also pass the op's workspace to the function"),
            ])
            .ignores(&[
                ferrocaffe::arg!("grad_output_indices", "list of int", "[]", "read by the op's gradient maker (AddGradientOperators)"),
                ferrocaffe::arg!("grad_input_indices", "list of int", "[]", "read by the op's gradient maker (AddGradientOperators)"),
                ferrocaffe::arg!("pickled_grad_builder", "bytes", "", "read by the op's gradient maker (AddGradientOperators)"),
            ])
            .doc(doc),
    );
    }
}
