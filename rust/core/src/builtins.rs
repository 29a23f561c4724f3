//! The one place that wires the built-in pieces into their registries: every
//! op family of `ops/` (its schemas into the operator registry, its object
//! codecs into `storage`). The registries know none of them, so the layers
//! stay acyclic: `ops` (kernels) uses `operator` (registry) and `storage`,
//! never the other way round. Db formats are listed in `storage::FORMATS`.
//!
//! [`register`] runs once; `Workspace::new` calls it, so every run has the
//! built-ins, and the bindings call it when the module is imported.

use std::sync::Once;

static REGISTERED: Once = Once::new();

/// Registers the built-in operators and blob codecs (once; later calls
/// return at once).
pub fn register() {
    REGISTERED.call_once(|| {
        for s in crate::ops::builtin_schemas() {
            crate::operator::register(s);
        }
        for (tag, decode) in crate::ops::builtin_codecs() {
            crate::storage::register_blob_codec(tag, decode);
        }
    });
}
