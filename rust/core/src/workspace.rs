//! Workspaces: named blobs and the nets created in them.
//!
//! A child workspace sees every blob of its parent chain. Creating a name that
//! is visible in a parent returns the parent's blob (so writes persist there);
//! other names stay local and die with the child. A "forwarding" workspace
//! (used by `Do`) sees only explicitly mapped parent blobs. Nets are per
//! workspace and never inherited. All maps are behind locks, so a workspace
//! can be used from many threads at once.

use crate::blob::{Blob, BlobCell, BlobValue};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{NetDef, OperatorDef, PlanDef};
use crate::net::{Net, NetCell, SharedNet};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

pub struct Workspace {
    parent: Option<Arc<Workspace>>,
    blobs: RwLock<HashMap<String, Blob>>,
    forwarded: RwLock<HashMap<String, (Arc<Workspace>, String)>>,
    nets: Mutex<HashMap<String, SharedNet>>,
    root_folder: RwLock<String>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Workspace({} local blobs)", self.blobs.read().len())
    }
}

impl Workspace {
    fn make(parent: Option<Arc<Workspace>>, root: String) -> Arc<Workspace> {
        Arc::new(Workspace {
            parent,
            blobs: RwLock::new(HashMap::new()),
            forwarded: RwLock::new(HashMap::new()),
            nets: Mutex::new(HashMap::new()),
            root_folder: RwLock::new(root),
        })
    }

    pub fn new() -> Arc<Workspace> {
        Self::make(None, ".".to_string())
    }

    pub fn with_root(root: &str) -> Arc<Workspace> {
        Self::make(None, root.to_string())
    }

    /// A child that sees all of `parent`'s blobs. Its root folder is "." (as
    /// in Caffe2, it is not inherited).
    pub fn new_child(parent: &Arc<Workspace>) -> Arc<Workspace> {
        Self::make(Some(parent.clone()), ".".to_string())
    }

    /// A workspace that sees only the given `(local name -> parent name)`
    /// mappings of `parent`. Each target must exist now.
    pub fn new_forwarding(
        parent: &Arc<Workspace>,
        mapping: &[(String, String)],
    ) -> Result<Arc<Workspace>> {
        let ws = Self::make(None, ".".to_string());
        for (local, outer) in mapping {
            ws.add_blob_mapping(local, parent, outer)?;
        }
        Ok(ws)
    }

    /// Maps `local` to `outer` in `parent` (resolved lazily on each access).
    pub fn add_blob_mapping(
        &self,
        local: &str,
        parent: &Arc<Workspace>,
        outer: &str,
    ) -> Result<()> {
        if !parent.has_blob(outer) {
            return Err(Error::blob_not_found(outer));
        }
        let mut fw = self.forwarded.write();
        if let Some((p, o)) = fw.get(local) {
            if !Arc::ptr_eq(p, parent) || o != outer {
                return Err(Error::invalid_arg(format!(
                    "blob '{local}' is already mapped to '{o}' and cannot be remapped to '{outer}'"
                )));
            }
            return Ok(());
        }
        fw.insert(local.to_string(), (parent.clone(), outer.to_string()));
        Ok(())
    }

    pub fn parent(&self) -> Option<&Arc<Workspace>> {
        self.parent.as_ref()
    }

    pub fn root_folder(&self) -> String {
        self.root_folder.read().clone()
    }

    pub fn set_root_folder(&self, root: &str) {
        *self.root_folder.write() = root.to_string();
    }

    // ------------------------------------------------------------- blobs --

    pub fn get_blob(&self, name: &str) -> Option<Blob> {
        if let Some(b) = self.blobs.read().get(name) {
            return Some(b.clone());
        }
        let fw = self.forwarded.read().get(name).cloned();
        if let Some((p, outer)) = fw {
            return p.get_blob(&outer);
        }
        self.parent.as_ref().and_then(|p| p.get_blob(name))
    }

    /// The blob, or a `BlobNotFound` error naming it.
    pub fn blob(&self, name: &str) -> Result<Blob> {
        self.get_blob(name)
            .ok_or_else(|| Error::blob_not_found(name))
    }

    pub fn has_blob(&self, name: &str) -> bool {
        self.get_blob(name).is_some()
    }

    /// The visible blob of that name, or a new local one.
    pub fn create_blob(&self, name: &str) -> Blob {
        if let Some(b) = self.get_blob(name) {
            return b;
        }
        self.create_local_blob(name)
    }

    /// A local blob, shadowing any parent blob of the same name.
    pub fn create_local_blob(&self, name: &str) -> Blob {
        self.blobs
            .write()
            .entry(name.to_string())
            .or_insert_with(|| BlobCell::new(BlobValue::Empty))
            .clone()
    }

    /// Removes a local blob; never touches a parent. Ops already bound to it
    /// keep their handle (no dangling pointer, unlike Caffe2).
    pub fn remove_blob(&self, name: &str) -> bool {
        self.blobs.write().remove(name).is_some()
    }

    /// Every visible name (local, forwarded, parents), sorted and unique.
    pub fn blob_names(&self) -> Vec<String> {
        let mut set = BTreeSet::new();
        self.collect_names(&mut set);
        set.into_iter().collect()
    }

    fn collect_names(&self, set: &mut BTreeSet<String>) {
        set.extend(self.blobs.read().keys().cloned());
        for (local, (p, outer)) in self.forwarded.read().iter() {
            if p.has_blob(outer) {
                set.insert(local.clone());
            }
        }
        if let Some(p) = &self.parent {
            p.collect_names(set);
        }
    }

    /// Whether `name` is a local blob (not a forwarded or parent one).
    pub fn has_local_blob(&self, name: &str) -> bool {
        self.blobs.read().contains_key(name)
    }

    pub fn local_blob_names(&self) -> Vec<String> {
        let mut v: Vec<_> = self.blobs.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// Writes a value into the named blob (created if needed).
    pub fn feed(&self, name: &str, value: BlobValue) {
        self.create_blob(name).set(value);
    }

    /// A copy of the named blob's content.
    pub fn fetch(&self, name: &str) -> Result<BlobValue> {
        Ok(self.blob(name)?.get())
    }

    /// Removes every local blob and net.
    pub fn clear(&self) {
        self.nets.lock().clear();
        self.blobs.write().clear();
        self.forwarded.write().clear();
    }

    // -------------------------------------------------------------- nets --

    /// Creates a net. An existing net of that name is an error unless
    /// `overwrite`, in which case the old one is dropped first.
    pub fn create_net(self: &Arc<Self>, def: &NetDef, overwrite: bool) -> Result<SharedNet> {
        // Caffe2 requires the name field to be present; an empty name is fine.
        if def.name.is_none() {
            return Err(Error::invalid_plan(
                "a net definition must have a name to be created in a workspace",
            ));
        }
        let name = def.net_name();
        {
            let mut nets = self.nets.lock();
            if nets.contains_key(name) {
                if !overwrite {
                    return Err(Error::invalid_plan(format!(
                        "a net named '{name}' already exists in this workspace; pass overwrite=True to replace it"
                    ))
                    .with_net(name));
                }
                nets.remove(name);
            }
        }
        let net = NetCell::new(Net::create(def, self)?);
        self.nets.lock().insert(name.to_string(), net.clone());
        Ok(net)
    }

    pub fn get_net(&self, name: &str) -> Option<SharedNet> {
        self.nets.lock().get(name).cloned()
    }

    pub fn has_net(&self, name: &str) -> bool {
        self.nets.lock().contains_key(name)
    }

    pub fn delete_net(&self, name: &str) -> bool {
        self.nets.lock().remove(name).is_some()
    }

    pub fn net_names(&self) -> Vec<String> {
        let mut v: Vec<_> = self.nets.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Runs a net created earlier, `num_iter` times.
    pub fn run_net(
        self: &Arc<Self>,
        name: &str,
        num_iter: usize,
        cancel: &CancelToken,
    ) -> Result<bool> {
        let net = self.get_net(name).ok_or_else(|| {
            Error::new(
                ErrorKind::NetNotFound,
                format!("net '{name}' does not exist in this workspace"),
            )
            .with_net(name)
        })?;
        let mut net = net.lock(cancel)?;
        for _ in 0..num_iter {
            cancel.poll_check()?;
            if !net.run(self, cancel)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Times a net created earlier (Caffe2's `NetBase::TEST_Benchmark`):
    /// `warmup` runs, then `main` timed runs; with `individual`, `main` more
    /// runs timing each op. Returns the milliseconds per main run, then
    /// (with `individual`) each op's mean milliseconds per run, and the op
    /// types. A run that fails, or fails softly, is an error.
    pub fn benchmark_net(
        self: &Arc<Self>,
        name: &str,
        warmup: usize,
        main: usize,
        individual: bool,
        cancel: &CancelToken,
    ) -> Result<(Vec<f64>, Vec<String>)> {
        let net = self.get_net(name).ok_or_else(|| {
            Error::new(
                ErrorKind::NetNotFound,
                format!("net '{name}' does not exist in this workspace"),
            )
            .with_net(name)
        })?;
        let mut net = net.lock(cancel)?;
        let failed =
            || Error::failed("a benchmark run failed (an op returned false)").with_net(name);
        for _ in 0..warmup {
            cancel.poll_check()?;
            if !net.run(self, cancel)? {
                return Err(failed());
            }
        }
        let start = std::time::Instant::now();
        for _ in 0..main {
            cancel.poll_check()?;
            if !net.run(self, cancel)? {
                return Err(failed());
            }
        }
        let per_run = |total: f64| if main == 0 { 0.0 } else { total / main as f64 };
        let mut times = vec![per_run(start.elapsed().as_secs_f64() * 1e3)];
        let types: Vec<String> = net.op_types().map(str::to_string).collect();
        if individual {
            let mut sums = vec![0u64; types.len()];
            let mut stamps = crate::trace::Stamps::with_capacity(types.len() + 1);
            for _ in 0..main {
                cancel.poll_check()?;
                stamps.clear();
                let ok = net.run_timed(self, cancel, &mut stamps)?;
                stamps.push(crate::trace::now());
                if !ok {
                    return Err(failed());
                }
                for (k, w) in stamps.windows(2).enumerate() {
                    sums[k] += w[1] - w[0];
                }
            }
            times.extend(
                sums.iter()
                    .map(|&t| per_run(crate::trace::ticks_to_ns(t) as f64 / 1e6)),
            );
        }
        Ok((times, types))
    }

    /// Builds a temporary net, runs it once and drops it.
    pub fn run_net_once(self: &Arc<Self>, def: &NetDef, cancel: &CancelToken) -> Result<bool> {
        Net::create(def, self)?.run(self, cancel)
    }

    /// Builds a temporary op, runs it once and drops it.
    pub fn run_operator_once(
        self: &Arc<Self>,
        def: &OperatorDef,
        cancel: &CancelToken,
    ) -> Result<bool> {
        let net = NetDef {
            name: Some(String::new()),
            op: vec![def.clone()],
            ..Default::default()
        };
        Net::create(&net, self)?.run(self, cancel)
    }

    /// Runs a plan in this workspace (see [`crate::plan`]).
    pub fn run_plan(self: &Arc<Self>, plan: &PlanDef, cancel: &CancelToken) -> Result<bool> {
        crate::plan::run_plan(self, plan, cancel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    #[test]
    fn child_binds_visible_names_to_parent() {
        let p = Workspace::new();
        p.feed("a", BlobValue::Tensor(Tensor::scalar(1.0f32)));
        let c = Workspace::new_child(&p);
        let a = c.create_blob("a");
        assert!(Arc::ptr_eq(&a, &p.blob("a").unwrap()));
        c.create_blob("local");
        assert!(!p.has_blob("local"));
        assert_eq!(c.blob_names(), vec!["a".to_string(), "local".to_string()]);
        drop(c);
        assert_eq!(p.blob_names(), vec!["a".to_string()]);
    }

    #[test]
    fn forwarding_sees_only_mapped_blobs() {
        let p = Workspace::new();
        p.feed("outer", BlobValue::Tensor(Tensor::scalar(2i64)));
        p.feed("other", BlobValue::Tensor(Tensor::scalar(3i64)));
        let f = Workspace::new_forwarding(&p, &[("inner".into(), "outer".into())]).unwrap();
        assert!(f.has_blob("inner"));
        assert!(!f.has_blob("other"));
        assert!(Workspace::new_forwarding(&p, &[("x".into(), "missing".into())]).is_err());
    }
}
