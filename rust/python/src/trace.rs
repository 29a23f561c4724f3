//! The timeline (`ferrocaffe::trace`) as Python sees it: start and stop a
//! recording, read it as trace-event JSON, record spans from Python.

use pyo3::prelude::*;

/// Starts recording a timeline (or joins the recording under way); returns
/// the start of this recording's window (on the trace clock). `ops`:
/// time each op of every net run.
#[pyfunction]
#[pyo3(signature = (ops=true))]
pub(crate) fn trace_start(ops: bool) -> u64 {
    ferrocaffe::trace::start(ops)
}

/// Ends one recording (`ops` as started); the last one stops recording and
/// forgets the spans.
#[pyfunction]
#[pyo3(signature = (ops=true))]
pub(crate) fn trace_stop(ops: bool) {
    ferrocaffe::trace::stop(ops)
}

/// Whether a timeline is being recorded.
#[pyfunction]
pub(crate) fn trace_on() -> bool {
    ferrocaffe::trace::on()
}

/// Now, on the trace clock (counter ticks or ns: only for `trace_record`).
#[pyfunction]
pub(crate) fn trace_now() -> u64 {
    ferrocaffe::trace::now()
}

/// The trace-event JSON array of the spans recorded since `since`.
#[pyfunction]
pub(crate) fn trace_json(py: Python<'_>, since: u64) -> String {
    py.detach(|| ferrocaffe::trace::json_since(since))
}

/// Records a span of category `cat` from `start` (`trace_now()`) to now on
/// this thread's lane; `detail` is shown with it. Nothing when not recording.
#[pyfunction]
#[pyo3(signature = (name, cat, start, detail=None))]
pub(crate) fn trace_record(name: String, cat: &str, start: u64, detail: Option<String>) {
    if !ferrocaffe::trace::on() {
        return;
    }
    let detail = match detail {
        Some(t) => ferrocaffe::trace::Detail::Text(t),
        None => ferrocaffe::trace::Detail::None,
    };
    ferrocaffe::trace::record(intern(cat), name, start, detail);
}

/// A category name that lives for the process (few distinct ones exist).
fn intern(cat: &str) -> &'static str {
    static CATS: parking_lot::Mutex<Vec<&'static str>> = parking_lot::Mutex::new(Vec::new());
    let mut cats = CATS.lock();
    if let Some(c) = cats.iter().find(|c| **c == cat) {
        return c;
    }
    if cats.len() >= 64 {
        return "python";
    }
    let c: &'static str = Box::leak(cat.to_string().into_boxed_str());
    cats.push(c);
    c
}
