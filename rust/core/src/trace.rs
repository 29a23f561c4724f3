//! The timeline of runs: spans (ops, nets, step iterations, concurrent
//! instances, report runs, queue waits, and spans Python records) written
//! as Chrome trace-event JSON, which Perfetto and `chrome://tracing` open.
//!
//! Off (the default), a net run and a step unit look at one relaxed atomic
//! ([`on`]) and record nothing. On, a net run takes one timestamp per op
//! into a vector and hands the vector over once per run; other spans are
//! pushed as they end. Each thread pushes into a buffer of its own (a
//! mutex nobody else takes while recording), registered once, so threads
//! never contend; [`json_since`] reads every buffer.
//!
//! Lanes: a span goes to its thread's lane. A thread started for a
//! concurrent substep instance or a reporter is given a label
//! ([`label_thread`]) made of its parent's label and its own name; threads
//! with the same label share a lane, so every iteration of a concurrent
//! step puts instance k on the same lane, and one lane shows one instance.
//!
//! Recording is counted ([`start`] / [`stop`]): nested recordings (a
//! per-call option inside a session-wide one) each read the spans of their
//! own window and the buffers are emptied when the last one stops.

use parking_lot::Mutex;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
/// Whether net runs time each op (set while any recording asks for ops).
static OPS: AtomicBool = AtomicBool::new(false);
/// Bumped when a recording starts from nothing: older events are dropped.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Recordings under way, and how many of them want each op timed.
static DEPTH: Mutex<(usize, usize)> = Mutex::new((0, 0));
static NEXT_LANE: AtomicUsize = AtomicUsize::new(1);

/// Whether a timeline is being recorded (one relaxed load).
#[inline(always)]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Whether net runs time each op (read only when [`on`]).
#[inline]
pub fn ops_on() -> bool {
    OPS.load(Ordering::Relaxed)
}

/// Nanoseconds since the process's trace epoch.
#[inline]
pub fn now() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// The timestamps of one net run (inline for small nets and for runs
/// whose ops are not timed: no allocation).
pub type Stamps = SmallVec<[u64; 4]>;

/// Names of a net and its ops, shared by every run's record.
#[derive(Debug)]
pub struct NetNames {
    pub net: Box<str>,
    pub ops: Vec<Box<str>>,
}

/// Extra fields of a span (its `args` in the JSON).
#[derive(Debug, Clone)]
pub enum Detail {
    None,
    Iteration(i64),
    Instance { k: usize, of: usize },
    Text(String),
}

#[derive(Debug)]
struct Span {
    name: Arc<str>,
    cat: &'static str,
    start: u64,
    end: u64,
    detail: Detail,
}

#[derive(Debug)]
struct NetRun {
    names: Arc<NetNames>,
    /// The start of each op that ran, then the end of the last one.
    stamps: Stamps,
    ok: bool,
    /// Whether `stamps` times each op (else only the run).
    timed_ops: bool,
}

#[derive(Default)]
struct Buffer {
    generation: u64,
    lane: usize,
    label: Option<String>,
    spans: Vec<Span>,
    runs: Vec<NetRun>,
}

/// Every thread's buffer, registered on first use while recording.
static BUFFERS: Mutex<Vec<Arc<Mutex<Buffer>>>> = Mutex::new(Vec::new());
/// Lane of each thread label.
static LANES: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

thread_local! {
    static MINE: Arc<Mutex<Buffer>> = {
        let b = Arc::new(Mutex::new(Buffer {
            lane: NEXT_LANE.fetch_add(1, Ordering::Relaxed),
            ..Default::default()
        }));
        BUFFERS.lock().push(b.clone());
        b
    };
}

fn with_buffer(f: impl FnOnce(&mut Buffer)) {
    let generation = GENERATION.load(Ordering::Acquire);
    let _ = MINE.try_with(|b| {
        let mut b = b.lock();
        if b.generation != generation {
            b.generation = generation;
            b.spans.clear();
            b.runs.clear();
        }
        f(&mut b)
    });
}

/// Starts recording (or joins the recording under way); returns the start
/// time, the beginning of this recording's window. With `ops`, net runs
/// time each op; without, a net run is one span.
pub fn start(ops: bool) -> u64 {
    let mut depth = DEPTH.lock();
    if depth.0 == 0 {
        GENERATION.fetch_add(1, Ordering::AcqRel);
        prune();
        ON.store(true, Ordering::Release);
    }
    depth.0 += 1;
    if ops {
        depth.1 += 1;
        OPS.store(true, Ordering::Release);
    }
    now()
}

/// Ends one recording (`ops` as it was started); the last one stops
/// recording and empties the buffers. Without a recording under way, does
/// nothing.
pub fn stop(ops: bool) {
    let mut depth = DEPTH.lock();
    if depth.0 == 0 {
        return;
    }
    depth.0 -= 1;
    if ops && depth.1 > 0 {
        depth.1 -= 1;
        if depth.1 == 0 {
            OPS.store(false, Ordering::Release);
        }
    }
    if depth.0 == 0 {
        OPS.store(false, Ordering::Release);
        depth.1 = 0;
        ON.store(false, Ordering::Release);
        for b in BUFFERS.lock().iter() {
            let mut b = b.lock();
            b.spans = Vec::new();
            b.runs = Vec::new();
        }
        prune();
        *LANES.lock() = None;
    }
}

/// Forgets the buffers of threads that have ended.
fn prune() {
    BUFFERS.lock().retain(|b| Arc::strong_count(b) > 1);
}

/// Gives this thread's spans the lane of `label` (threads with the same
/// label share a lane). Only while recording.
pub fn label_thread(label: String) {
    if !on() {
        return;
    }
    let lane = {
        let mut lanes = LANES.lock();
        let lanes = lanes.get_or_insert_with(HashMap::new);
        *lanes
            .entry(label.clone())
            .or_insert_with(|| NEXT_LANE.fetch_add(1, Ordering::Relaxed))
    };
    with_buffer(|b| {
        b.lane = lane;
        b.label = Some(label);
    });
}

/// This thread's label, if it has one (for the labels of threads it starts).
pub fn thread_label() -> Option<String> {
    if !on() {
        return None;
    }
    MINE.try_with(|b| b.lock().label.clone()).ok().flatten()
}

/// A span being timed; recorded when dropped.
pub struct SpanGuard {
    name: Arc<str>,
    cat: &'static str,
    start: u64,
    detail: Detail,
}

impl SpanGuard {
    /// Replaces the span's detail (known only at its end, say).
    pub fn set_detail(&mut self, detail: Detail) {
        self.detail = detail;
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        let end = now();
        let span = Span {
            name: self.name.clone(),
            cat: self.cat,
            start: self.start,
            end,
            detail: std::mem::replace(&mut self.detail, Detail::None),
        };
        with_buffer(|b| b.spans.push(span));
    }
}

/// A span from now until the guard is dropped, or `None` (nothing made, not
/// even the name) when not recording.
#[inline]
pub fn span(cat: &'static str, name: impl FnOnce() -> String) -> Option<SpanGuard> {
    if !on() {
        return None;
    }
    Some(SpanGuard {
        name: name().into(),
        cat,
        start: now(),
        detail: Detail::None,
    })
}

thread_local! {
    /// The last name [`span_str`] shared on this thread.
    static LAST_NAME: std::cell::RefCell<Option<Arc<str>>> = const { std::cell::RefCell::new(None) };
}

/// [`span`] named `name`, sharing the name with this thread's previous
/// span of the same name (a loop's iterations allocate nothing for it).
#[inline]
pub fn span_str(cat: &'static str, name: &str) -> Option<SpanGuard> {
    if !on() {
        return None;
    }
    let name = LAST_NAME
        .try_with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some(n) if **n == *name => n.clone(),
                _ => {
                    let n: Arc<str> = name.into();
                    *last = Some(n.clone());
                    n
                }
            }
        })
        .unwrap_or_else(|_| name.into());
    Some(SpanGuard {
        name,
        cat,
        start: now(),
        detail: Detail::None,
    })
}

/// Records a span that started at `start` (from [`now`]) and ends now, on
/// this thread's lane (spans recorded by Python).
pub fn record(cat: &'static str, name: String, start: u64, detail: Detail) {
    if !on() {
        return;
    }
    let end = now();
    with_buffer(|b| {
        b.spans.push(Span {
            name: name.into(),
            cat,
            start,
            end,
            detail,
        })
    });
}

/// Records one run of a net: `stamps` holds the start of each op that ran
/// and then the end of the last one, or (ops not timed) the run's start
/// and end only.
pub fn record_net_run(names: &Arc<NetNames>, stamps: Stamps, ok: bool, timed_ops: bool) {
    if stamps.is_empty() {
        return;
    }
    let names = names.clone();
    with_buffer(|b| {
        b.runs.push(NetRun {
            names,
            stamps,
            ok,
            timed_ops,
        })
    });
}

fn escape(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn complete(
    out: &mut String,
    name: &str,
    cat: &str,
    lane: usize,
    start: u64,
    end: u64,
    args: &str,
) {
    if !out.ends_with('[') {
        out.push_str(",\n");
    }
    out.push_str("{\"name\":");
    escape(out, name);
    let _ = write!(
        out,
        ",\"cat\":\"{cat}\",\"ph\":\"X\",\"pid\":1,\"tid\":{lane},\"ts\":{},\"dur\":{}",
        us(start),
        us(end.saturating_sub(start))
    );
    if !args.is_empty() {
        let _ = write!(out, ",\"args\":{{{args}}}");
    }
    out.push('}');
}

/// The JSON array of trace events (complete events, `"ph": "X"`, in
/// microseconds, plus a `thread_name` metadata event per lane) recorded
/// since `since` (from [`start`]) by every thread.
pub fn json_since(since: u64) -> String {
    let generation = GENERATION.load(Ordering::Acquire);
    let buffers: Vec<_> = BUFFERS.lock().clone();
    let mut out = String::from("[");
    let mut lanes: HashMap<usize, String> = HashMap::new();
    let mut arg = String::new();
    for b in &buffers {
        let b = b.lock();
        if b.generation != generation {
            continue;
        }
        let lane = b.lane;
        let mut used = false;
        for s in b.spans.iter().filter(|s| s.start >= since) {
            used = true;
            arg.clear();
            match &s.detail {
                Detail::None => {}
                Detail::Iteration(i) => {
                    let _ = write!(arg, "\"iteration\":{i}");
                }
                Detail::Instance { k, of } => {
                    let _ = write!(arg, "\"instance\":{k},\"of\":{of}");
                }
                Detail::Text(t) => {
                    arg.push_str("\"detail\":");
                    escape(&mut arg, t);
                }
            }
            complete(&mut out, &s.name, s.cat, lane, s.start, s.end, &arg);
        }
        for r in b.runs.iter().filter(|r| r.stamps[0] >= since) {
            used = true;
            let st = &r.stamps;
            arg.clear();
            arg.push_str("\"ops\":");
            let ran = if r.timed_ops {
                st.len() - 1
            } else {
                r.names.ops.len()
            };
            let _ = write!(arg, "{ran}");
            if !r.ok {
                arg.push_str(",\"failed\":true");
            }
            complete(
                &mut out,
                &r.names.net,
                "net",
                lane,
                st[0],
                st[st.len() - 1],
                &arg,
            );
            if !r.timed_ops {
                continue;
            }
            for (k, w) in st.windows(2).enumerate() {
                let ty = r.names.ops.get(k).map(|s| &**s).unwrap_or("?");
                arg.clear();
                arg.push_str("\"net\":");
                escape(&mut arg, &r.names.net);
                let _ = write!(arg, ",\"index\":{k}");
                complete(&mut out, ty, "op", lane, w[0], w[1], &arg);
            }
        }
        if used {
            let label = b.label.clone().unwrap_or_else(|| format!("thread {lane}"));
            lanes.entry(lane).or_insert(label);
        }
    }
    let mut lanes: Vec<_> = lanes.into_iter().collect();
    lanes.sort();
    for (lane, label) in lanes {
        if !out.ends_with('[') {
            out.push_str(",\n");
        }
        let _ = write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{lane},\"args\":{{\"name\":"
        );
        escape(&mut out, &label);
        out.push_str("}}");
    }
    out.push(']');
    out
}

/// Serialises tests that switch the process-wide recording.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing_and_on_records_spans_and_net_runs() {
        let _g = TEST_LOCK.lock();
        assert!(span("x", || unreachable!("no name is made when off")).is_none());
        let t0 = start(true);
        {
            let _s = span("step", || "outer".into());
            let names = Arc::new(NetNames {
                net: "n\"et".into(),
                ops: vec!["Add".into(), "Mul".into()],
            });
            record_net_run(&names, smallvec::smallvec![now(), now(), now()], true, true);
        }
        let json = json_since(t0);
        stop(true);
        assert!(
            json.contains("\"name\":\"outer\",\"cat\":\"step\""),
            "{json}"
        );
        assert!(
            json.contains("\"name\":\"n\\\"et\",\"cat\":\"net\""),
            "{json}"
        );
        assert!(json.contains("\"name\":\"Mul\",\"cat\":\"op\""), "{json}");
        assert!(json.contains("\"thread_name\""), "{json}");
        assert!(!on());
    }
}
