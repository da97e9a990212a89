//! Metadata contexts (`NBD_OPT_LIST/SET_META_CONTEXT`, `NBD_CMD_BLOCK_STATUS`): the contexts
//! the server offers, which queries name them, and the set a client selected.
//!
//! Two kinds: `base:allocation` (holes and zeros), and `qemu:dirty-bitmap:NAME`, one per
//! checkpoint the export has when the client negotiates (changed-block tracking, qemu's
//! convention: one flag, bit 0 = changed since the checkpoint was created). A context's id
//! is its position in the client's selection plus one, so ids are per connection.

use logcache_engine::ExtentKind;
use logcache_nbd::consts::{META_CONTEXT_BASE_ALLOCATION, STATE_HOLE, STATE_ZERO};

/// The prefix of a checkpoint's context name.
pub(crate) const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";
/// The flag of a changed extent in a `qemu:dirty-bitmap:` context.
pub(crate) const DIRTY_BITMAP_CHANGED: u32 = 1;

/// A metadata context this server can report on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MetaContext {
    /// `base:allocation`: holes and zeros.
    BaseAllocation,
    /// `qemu:dirty-bitmap:NAME`: blocks changed since checkpoint NAME.
    DirtyBitmap(String),
}

/// Status flags of a `base:allocation` extent: a hole reading as zeros, zeros (allocated or
/// not known to be a hole), or data (0).
pub(crate) fn base_allocation_flags(kind: ExtentKind) -> u32 {
    match kind {
        ExtentKind::Data => 0,
        ExtentKind::Zero => STATE_ZERO,
        ExtentKind::ZeroHole => STATE_HOLE | STATE_ZERO,
    }
}

impl MetaContext {
    /// Every context offered when the export has checkpoints `checkpoints`, in the order
    /// lists use.
    pub fn offered(checkpoints: &[String]) -> impl Iterator<Item = MetaContext> + '_ {
        std::iter::once(MetaContext::BaseAllocation).chain(
            checkpoints
                .iter()
                .map(|name| MetaContext::DirtyBitmap(name.clone())),
        )
    }

    /// The full name, `namespace:leaf`.
    pub fn name(&self) -> String {
        match self {
            MetaContext::BaseAllocation => META_CONTEXT_BASE_ALLOCATION.to_string(),
            MetaContext::DirtyBitmap(name) => format!("{DIRTY_BITMAP_PREFIX}{name}"),
        }
    }

    /// SET selects a context named exactly; LIST also accepts the bare namespace (`base:`,
    /// `qemu:`), which the spec says lists all of that namespace's contexts, and qemu's
    /// `qemu:dirty-bitmap:` for every bitmap.
    pub fn matches(&self, query: &str, listing: bool) -> bool {
        let name = self.name();
        if query == name {
            return true;
        }
        if !listing {
            return false;
        }
        let namespace_end = name.find(':').expect("context names have a namespace") + 1;
        query == &name[..namespace_end]
            || matches!(self, MetaContext::DirtyBitmap(_)) && query == DIRTY_BITMAP_PREFIX
    }
}

/// The contexts a client selected with its last SET_META_CONTEXT, in offer order; the id of
/// the k-th is k + 1.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Selection {
    contexts: Vec<MetaContext>,
}

impl Selection {
    /// The contexts `queries` select (all of them for LIST with no query), among those offered
    /// with checkpoints `checkpoints`.
    pub fn of_queries(queries: &[String], listing: bool, checkpoints: &[String]) -> Selection {
        let all = listing && queries.is_empty();
        Selection {
            contexts: MetaContext::offered(checkpoints)
                .filter(|context| {
                    all || queries.iter().any(|query| context.matches(query, listing))
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.contexts.is_empty()
    }

    /// The selected contexts with their ids, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &MetaContext)> {
        self.contexts
            .iter()
            .enumerate()
            .map(|(index, context)| (index as u32 + 1, context))
    }

    /// The id of the last context (its block status chunk ends the reply).
    pub fn last_id(&self) -> Option<u32> {
        (!self.contexts.is_empty()).then_some(self.contexts.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn ids_are_distinct_and_non_zero() {
        let set = Selection::of_queries(&[], true, &strings(&["a", "b"]));
        let ids: Vec<u32> = set.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, [1, 2, 3], "id 0 is what LIST replies carry");
        assert_eq!(set.last_id(), Some(3));
    }

    #[test]
    fn queries_select_by_name_and_list_by_namespace() {
        let base = MetaContext::BaseAllocation;
        let none: Vec<String> = Vec::new();
        assert!(Selection::of_queries(&[], true, &none)
            .iter()
            .any(|(_, c)| *c == base));
        assert!(Selection::of_queries(&[], false, &none).is_empty());
        assert!(!Selection::of_queries(&strings(&["base:"]), true, &none).is_empty());
        assert!(Selection::of_queries(&strings(&["base:"]), false, &none).is_empty());
        let set = Selection::of_queries(&strings(&["qemu:x", "base:allocation"]), false, &none);
        assert_eq!(
            set.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
            [base]
        );
        assert!(
            Selection::of_queries(&strings(&["base:alloc", "BASE:allocation"]), true, &none)
                .is_empty()
        );
    }

    #[test]
    fn checkpoints_are_dirty_bitmaps() {
        let cps = strings(&["mon", "tue"]);
        let set = Selection::of_queries(&strings(&["qemu:dirty-bitmap:tue"]), false, &cps);
        let got: Vec<(u32, String)> = set.iter().map(|(id, c)| (id, c.name())).collect();
        assert_eq!(got, [(1, "qemu:dirty-bitmap:tue".to_string())]);
        for listing_query in ["qemu:", "qemu:dirty-bitmap:"] {
            let listed = Selection::of_queries(&strings(&[listing_query]), true, &cps);
            let names: Vec<String> = listed.iter().map(|(_, c)| c.name()).collect();
            assert_eq!(names, ["qemu:dirty-bitmap:mon", "qemu:dirty-bitmap:tue"]);
            assert!(Selection::of_queries(&strings(&[listing_query]), false, &cps).is_empty());
        }
        assert!(
            Selection::of_queries(&strings(&["qemu:dirty-bitmap:wed"]), false, &cps).is_empty()
        );
    }
}
