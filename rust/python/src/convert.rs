//! Values across the boundary: numpy arrays, str and bytes to tensors and
//! back (one copy each way), Python objects in blobs, protobuf bytes, paths.

use crate::errors::{feed_error, to_py_err};
use ferrocaffe::blob::BlobValue;
use ferrocaffe::error::Error;
use ferrocaffe::ir;
use ferrocaffe::tensor::{DataType, Tensor};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::path::PathBuf;
use std::sync::Arc;

/// A str as UTF-8 bytes; a str that has no UTF-8 form is a FeedError.
pub(crate) fn utf8(py: Python<'_>, s: &Bound<'_, PyString>, blob: &str) -> PyResult<Vec<u8>> {
    s.to_str().map(|s| s.as_bytes().to_vec()).map_err(|_| {
        feed_error(
            py,
            format!("cannot feed a str that has no UTF-8 encoding into blob '{blob}'"),
            blob,
        )
    })
}

/// The most dims rust-numpy's views of a numpy array take (its `as_array`
/// panics above this); numpy 2 makes arrays of up to 64. An array with more
/// is read through a flat (1-D) view and given its shape back in the tensor.
const VIEW_MAX_DIMS: usize = 32;

/// The most dims a numpy array can have (numpy's `MAXDIMS`: 64 in numpy
/// 2, 32 before), read once.
pub(crate) fn numpy_max_dims(py: Python<'_>) -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        ["numpy._core.multiarray", "numpy.core.multiarray"]
            .iter()
            .find_map(|m| {
                py.import(*m)
                    .and_then(|m| m.getattr("MAXDIMS"))
                    .and_then(|v| v.extract::<usize>())
                    .ok()
            })
            .unwrap_or(VIEW_MAX_DIMS)
    })
}

/// The error for a tensor with more dims than numpy arrays can have.
fn too_many_dims(py: Python<'_>, blob: &str, ndim: usize) -> PyErr {
    let max = numpy_max_dims(py);
    to_py_err(
        py,
        Error::shape(format!(
            "cannot fetch blob '{blob}' as a numpy array: its tensor has {ndim} dims, and numpy arrays have at most {max}"
        ))
        .with_blob(blob),
    )
}

pub(crate) fn array_to_tensor(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<Tensor> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if a.ndim() > VIEW_MAX_DIMS {
            let shape = a.shape().to_vec();
            let flat = obj.call_method1("reshape", (-1,))?;
            return array_to_tensor(py, &flat, name)?
                .into_shape(&shape)
                .map_err(|e| to_py_err(py, e.with_blob(name)));
        }
    }
    ferrocaffe::with_match_dtype!(each fixed, |T| {
        if let Ok(a) = obj.cast::<PyArrayDyn<T>>() {
            let ro = a
                .try_readonly()
                .map_err(|e| feed_error(py, e.to_string(), name))?;
            let a = ferrocaffe::tensor::copy_array(ro.as_array())
                .map_err(|e| to_py_err(py, e.with_blob(name)))?;
            return Ok(Tensor::from(a));
        }
    });
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
        return Ok(Tensor::from(
            ArrayD::from_shape_vec(IxDyn(&shape), out).expect("shape matches"),
        ));
    }
    let desc = match obj.cast::<PyUntypedArray>() {
        Ok(a) => format!("a numpy array of dtype {}", a.dtype().str()?),
        Err(_) => format!("an object of type {}", obj.get_type().name()?),
    };
    Err(feed_error(
        py,
        format!(
            "cannot feed {desc} into blob '{name}': supported are numpy arrays of {}, float16 and str/bytes, and str or bytes",
            DataType::NUMERIC_AND_BOOL
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        name,
    ))
}

/// Feeding an array over a tensor of the same dtype and shape copies into the
/// existing buffer (one copy into warm memory, as Caffe2 reused a tensor's
/// capacity). Only when the blob's lock is free right now: never wait for a
/// running op while holding the GIL. Returns whether it did.
pub(crate) fn copy_into_existing(obj: &Bound<'_, PyAny>, blob: &ferrocaffe::blob::Blob) -> bool {
    if obj
        .cast::<PyUntypedArray>()
        .is_ok_and(|a| a.ndim() > VIEW_MAX_DIMS)
    {
        return false;
    }
    ferrocaffe::with_match_dtype!(each fixed, |T| {
        if let Ok(a) = obj.cast::<PyArrayDyn<T>>() {
            let Ok(ro) = a.try_readonly() else {
                return false;
            };
            let src = ro.as_array();
            let Some(mut g) = blob.try_write() else {
                return false;
            };
            if let BlobValue::Tensor(t) = &mut *g {
                // A buffer shared with fetched arrays stays theirs:
                // feed a new tensor instead (copying the old one on
                // write would only be overwritten).
                if !t.is_unique() {
                    return false;
                }
                if let Some(dst) = <T as ferrocaffe::tensor::Element>::view_mut(t) {
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
    });
    false
}

/// A numpy copy of a tensor. The destination is allocated by numpy itself
/// (which asks the kernel for huge pages on large arrays), then filled with
/// one copy: as fast as `arr.copy()` in numpy.
/// Arrays at least this large are copied out by the kernel pool's threads.
const PARALLEL_COPY_BYTES: usize = 4 << 20;

/// A fresh, uninitialised C-contiguous numpy array. numpy's allocation can
/// fail (a large fetch under memory pressure): that is a Python MemoryError
/// here, where `PyArray::new` would panic on the null it gets back.
fn new_array<'py, T: numpy::Element>(
    py: Python<'py>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
    use numpy::PyArrayDescrMethods;
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: the arguments are numpy's documented ones for a new array
    // owning its data (no strides, data or base object given); the dtype
    // reference is stolen by the call, as `into_dtype_ptr` provides.
    let ptr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference (or null with an exception set), of this type.
    let any = unsafe { Bound::from_owned_ptr_or_err(py, ptr)? };
    Ok(any.cast_into::<PyArrayDyn<T>>()?)
}

/// A numpy copy of `a`. A large contiguous array is copied in parallel
/// pieces: the copy into fresh memory (page faults included) is what a
/// fetch costs, and one core does it at a fraction of the memory's speed.
/// The GIL stays held, as for any copy (the pool's threads do not need it),
/// so nothing else can see the array before it is complete.
fn array_to_py<T>(py: Python<'_>, a: &ArrayD<T>, blob: &str) -> PyResult<Py<PyAny>>
where
    T: numpy::Element + Copy + Send + Sync,
{
    let bytes = a.len().saturating_mul(std::mem::size_of::<T>());
    let out = new_array::<T>(py, a.shape()).map_err(|err| {
        if !err.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) {
            return err;
        }
        let e = Error::new(
            ferrocaffe::error::ErrorKind::OutOfMemory,
            format!(
                "cannot allocate {bytes} bytes for a numpy copy of blob '{blob}' (shape {:?})",
                a.shape()
            ),
        )
        .with_blob(blob);
        to_py_err(py, e)
    })?;
    // SAFETY: a fresh C-contiguous array, not yet shared with Python code;
    // every element is written below before it is returned.
    let dst = unsafe { out.as_slice_mut() }.expect("a new array is contiguous");
    match a.as_slice() {
        // The pool's threads copy; without a pool, one copy on this thread.
        Some(src) if bytes >= PARALLEL_COPY_BYTES && ferrocaffe::threads::pool_available() => {
            use rayon::prelude::*;
            let piece = (PARALLEL_COPY_BYTES / std::mem::size_of::<T>()).max(1);
            dst.par_chunks_mut(piece)
                .zip(src.par_chunks(piece))
                .for_each(|(d, s)| d.copy_from_slice(s));
        }
        Some(src) => dst.copy_from_slice(src),
        // Not in C order (a view an op made): the logical order is C order.
        None => dst.iter_mut().zip(a.iter()).for_each(|(d, s)| *d = *s),
    }
    Ok(out.into_any().unbind())
}

/// Keeps a tensor's buffer alive for the read-only numpy arrays that view
/// it (their `base`). It holds a clone of the tensor: the storage is
/// shared and copy-on-write (`tensor.rs`), so while this object lives any
/// write to the blob copies the buffer first, and the arrays keep seeing
/// the values they were fetched with.
#[pyclass(frozen, module = "ferrocaffe._core", name = "TensorBuffer")]
pub(crate) struct TensorBuffer {
    tensor: Tensor,
}

#[pymethods]
impl TensorBuffer {
    fn __repr__(&self) -> String {
        format!(
            "<ferrocaffe TensorBuffer {} {:?}>",
            self.tensor.dtype(),
            self.tensor.shape()
        )
    }
}

/// A read-only numpy array over `a`'s own buffer, kept alive by a
/// [`TensorBuffer`] holding `t` (the tensor `a` belongs to).
fn array_view_py<T>(py: Python<'_>, a: &ArrayD<T>, t: &Tensor) -> PyResult<Py<PyAny>>
where
    T: numpy::Element,
{
    use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
    use numpy::PyArrayDescrMethods;
    let owner = Bound::new(py, TensorBuffer { tensor: t.clone() })?;
    let size = std::mem::size_of::<T>() as npy_intp;
    let mut dims: Vec<npy_intp> = a.shape().iter().map(|&d| d as npy_intp).collect();
    let mut strides: Vec<npy_intp> = a.strides().iter().map(|&s| s as npy_intp * size).collect();
    // SAFETY: `data` points at element [0, ..., 0] of `a`, whose buffer the
    // owner keeps alive (an Arc clone: nothing frees or, copy on write,
    // writes it while the owner lives) and which covers every index the
    // dims and byte strides reach. flags = 0: not writeable, not owning
    // its data; numpy computes the contiguity flags from the strides. The
    // dtype reference is stolen by the call.
    let ptr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
            a.as_ptr() as *mut std::ffi::c_void,
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference (or null with an exception set).
    let arr = unsafe { Bound::from_owned_ptr_or_err(py, ptr)? };
    // SAFETY: `arr` is a new array; SetBaseObject steals the reference
    // to the owner given to it (into_ptr), also on failure.
    let r =
        unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, arr.as_ptr().cast(), owner.into_ptr()) };
    if r != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(arr.unbind())
}

/// A read-only numpy array of a tensor without copying it: a view of the
/// tensor's shared buffer (`fetch_blob(copy=False)`). String tensors, which
/// numpy holds as bytes objects, are copied into an object array, made
/// read-only too.
pub(crate) fn tensor_view_py(py: Python<'_>, t: &Tensor, blob: &str) -> PyResult<Py<PyAny>> {
    if t.ndim() > numpy_max_dims(py) {
        return Err(too_many_dims(py, blob, t.ndim()));
    }
    if t.numel() != 0 {
        ferrocaffe::with_match_dtype!(tensor fixed t, |a: T| return array_view_py(py, a, t),
            else Tensor::Str(_) => {});
    }
    let out = tensor_to_py(py, t, blob)?;
    out.bind(py).call_method1("setflags", (false,)).map(|_| out)
}

/// A numpy copy of a tensor; `blob` names it in an allocation error.
pub(crate) fn tensor_to_py(py: Python<'_>, t: &Tensor, blob: &str) -> PyResult<Py<PyAny>> {
    if t.ndim() > numpy_max_dims(py) {
        return Err(too_many_dims(py, blob, t.ndim()));
    }
    Ok(
        ferrocaffe::with_match_dtype!(tensor fixed t, |a: T| array_to_py(py, a, blob)?,
        else Tensor::Str(a) => {
            if a.ndim() <= VIEW_MAX_DIMS {
                let objs = a.map(|b| PyBytes::new(py, b).into_any().unbind());
                PyArrayDyn::from_owned_array(py, objs).into_any().unbind()
            } else {
                // rust-numpy builds arrays of at most VIEW_MAX_DIMS dims: a
                // flat one, reshaped (and copied, to own its data) by numpy.
                let objs: Vec<Py<PyAny>> =
                    a.iter().map(|b| PyBytes::new(py, b).into_any().unbind()).collect();
                let flat = numpy::PyArray1::from_vec(py, objs).into_any();
                flat.call_method1("reshape", (pyo3::types::PyTuple::new(py, a.shape())?,))?
                    .call_method0("copy")?
                    .unbind()
            }
        }),
    )
}

/// A blob's value for Python: a copy (`copy`), or for a tensor a read-only
/// view of its shared buffer ([`tensor_view_py`]).
pub(crate) fn value_to_py(
    py: Python<'_>,
    name: &str,
    v: &BlobValue,
    copy: bool,
) -> PyResult<Py<PyAny>> {
    Ok(match v {
        BlobValue::Tensor(t) if !copy => tensor_view_py(py, t, name)?,
        BlobValue::Tensor(t) => tensor_to_py(py, t, name)?,
        BlobValue::Bytes(b) => PyBytes::new(py, b).into_any().unbind(),
        BlobValue::Empty => PyBytes::new(
            py,
            format!("{name}, a C++ native class of type nullptr (uninitialized).").as_bytes(),
        )
        .into_any()
        .unbind(),
        BlobValue::Object(o) => {
            if let Some(obj) = python_object(py, o) {
                return Ok(obj);
            }
            if let Some(q) = int8_tensor(o) {
                // Caffe2's workspace.Int8Tensor(data, scale, zero_point).
                let data = tensor_to_py(py, &q.data, name)?;
                return Ok(py
                    .import("ferrocaffe.workspace")?
                    .getattr("Int8Tensor")?
                    .call1((data, q.scale, q.zero_point))?
                    .unbind());
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

impl ferrocaffe::blob::BlobObject for PyObjectBlob {
    fn kind_name(&self) -> &'static str {
        "PythonObject"
    }
}

fn int8_tensor(
    o: &Arc<dyn ferrocaffe::blob::BlobObject>,
) -> Option<&ferrocaffe::ops::int8::Int8Tensor> {
    let any: &dyn std::any::Any = &**o;
    any.downcast_ref()
}

fn python_object(py: Python<'_>, o: &Arc<dyn ferrocaffe::blob::BlobObject>) -> Option<Py<PyAny>> {
    let any: Arc<dyn std::any::Any + Send + Sync> = o.clone();
    any.downcast::<PyObjectBlob>()
        .ok()
        .map(|p| p.0.clone_ref(py))
}

pub(crate) fn decode<M: prost::Message + Default>(
    py: Python<'_>,
    bytes: &[u8],
    what: &str,
) -> PyResult<M> {
    ir::decode(bytes, what).map_err(|e| to_py_err(py, e))
}

/// A path argument (a str or any os.PathLike, such as pathlib.Path) as the
/// UTF-8 string the core's paths are.
pub(crate) fn path_string(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    path.into_os_string().into_string().map_err(|p| {
        to_py_err(
            py,
            Error::invalid_arg(format!("the path {p:?} is not valid UTF-8")),
        )
    })
}
