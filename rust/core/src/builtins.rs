//! The one place that wires the built-in pieces into their registries: every
//! op family of `ops/` (its schemas into the operator registry, their object
//! codecs into `storage`). The registries know none of them, so the layers
//! stay acyclic: `ops` (kernels) uses `operator` (registry) and `storage`,
//! never the other way round. Db formats are listed in `storage::FORMATS`.
//!
//! [`register`] runs once; `Workspace::new` calls it, so every run has the
//! built-ins, and the bindings call it when the module is imported.

use std::sync::Once;

static REGISTERED: Once = Once::new();

/// Every built-in op's schema: the op families of `ops/` and the readers.
pub fn schemas() -> Vec<crate::operator::OpSchema> {
    let mut v = crate::ops::builtin_schemas();
    v.extend(crate::readers::schemas());
    v
}

/// The codecs of the built-in saved objects (cursors, readers).
pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    let mut v = crate::ops::builtin_codecs();
    v.extend(crate::readers::codecs());
    v
}

/// Registers the built-in operators and blob codecs (once; later calls
/// return at once).
pub fn register() {
    REGISTERED.call_once(|| {
        for s in schemas() {
            crate::operator::register(s);
        }
        for (tag, decode) in codecs() {
            crate::storage::register_blob_codec(tag, decode);
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_builtin_op_is_registered_once_with_a_doc() {
        let schemas = super::schemas();
        let mut names: Vec<_> = schemas.iter().map(|s| s.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(
            before,
            names.len(),
            "an op type is registered by two families"
        );
        for s in &schemas {
            assert!(!s.doc.is_empty(), "op {} has no doc", s.name);
            assert!(
                s.min_inputs <= s.max_inputs && s.min_outputs <= s.max_outputs,
                "op {}",
                s.name
            );
        }
    }
}
