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
            return err.clone_ref(py);
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
