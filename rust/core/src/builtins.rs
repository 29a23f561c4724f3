//! The composition root (with `lib.rs`): the one place that names every
//! built-in piece, the op families of `ops/` and the readers. The
//! registries fill themselves from here on first use (`operator`'s op
//! table from [`schemas`], `storage`'s object codecs from [`codecs`]), so
//! no module names a family it does not use: the registries, the
//! workspaces and the nets know none, and `ops` (kernels) uses `operator`
//! (registry) and `storage`, never the other way round. Db formats are
//! listed in `storage::FORMATS`.

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

/// Fills the registries now rather than on their first use (the bindings
/// call it when their module is imported). Later calls cost a lookup.
pub fn register() {
    let _ = crate::operator::registered_ops();
    let _ = crate::storage::registered_codecs();
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

    /// A registry that fills itself holds every built-in op and codec,
    /// with no call to `register`.
    #[test]
    fn the_registries_fill_themselves() {
        let ops = crate::operator::registered_ops();
        for s in super::schemas() {
            assert!(ops.contains(&s.name), "{} is not registered", s.name);
        }
        let codecs = crate::storage::registered_codecs();
        for (tag, _) in super::codecs() {
            assert!(codecs.contains(&tag), "no codec for {tag}");
        }
    }
}
