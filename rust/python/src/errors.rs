//! Runtime errors become `ferrocaffe.errors` exceptions here, once.

use ferrocaffe::error::{from_panic, Error};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use std::panic::{catch_unwind, AssertUnwindSafe};

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Converts a runtime error into its Python exception (once, here).
pub(crate) fn to_py_err(py: Python<'_>, e: Error) -> PyErr {
    if let Some(payload) = &e.payload {
        if let Some(err) = payload.downcast_ref::<PyErr>() {
            let err = err.clone_ref(py);
            add_context(py, &err, &e);
            return err;
        }
    }
    let build = || -> PyResult<PyErr> {
        let module = ERRORS_MODULE
            .get_or_try_init(py, || py.import("ferrocaffe.errors").map(|m| m.unbind()))?;
        let classes = module.bind(py).getattr("_BY_KIND")?;
        let kind = if e.missing_file {
            "MissingFile"
        } else {
            e.kind.name()
        };
        let cls = classes.get_item(kind)?;
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

/// A Python exception raised by an op's Python code travels as it was
/// raised; one that asks for it (a true `_wants_op_context` class attribute,
/// as the collectives' errors have) also gets where it happened: the
/// attributes `op`, `op_index`, `net` and `step` it left unset, named in
/// its message as the runtime's own errors name them.
fn add_context(py: Python<'_>, err: &PyErr, e: &Error) {
    let value = err.value(py);
    let wants = value
        .getattr("_wants_op_context")
        .and_then(|v| v.is_truthy())
        .unwrap_or(false);
    if !wants {
        return;
    }
    let _ = (|| -> PyResult<()> {
        let c = &e.context;
        let unset = |name: &str| -> PyResult<bool> { Ok(value.getattr(name)?.is_none()) };
        let message: String = value.getattr("message")?.extract()?;
        let mut parts = Vec::new();
        if let Some(op) = c.op_type.as_ref().filter(|_| unset("op").unwrap_or(false)) {
            value.setattr("op", op)?;
            value.setattr("op_index", c.op_index)?;
            parts.push(match c.op_index {
                Some(i) => format!("op #{i} '{op}'"),
                None => format!("op '{op}'"),
            });
        }
        for (attr, v) in [("net", &c.net), ("step", &c.step)] {
            if let Some(v) = v.as_ref().filter(|_| unset(attr).unwrap_or(false)) {
                value.setattr(attr, v)?;
                if !message.contains(&format!("'{v}'")) {
                    parts.push(format!("{attr} '{v}'"));
                }
            }
        }
        if !parts.is_empty() {
            let message = format!("{message} [{}]", parts.join(", "));
            value.setattr("message", &message)?;
            value.setattr("args", (message,))?;
        }
        Ok(())
    })();
}

pub(crate) fn guarded<T>(f: impl FnOnce() -> ferrocaffe::Result<T>) -> ferrocaffe::Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(from_panic(p)))
}

pub(crate) fn feed_error(py: Python<'_>, msg: String, blob: &str) -> PyErr {
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
