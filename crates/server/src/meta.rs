//! Metadata contexts (`NBD_OPT_LIST/SET_META_CONTEXT`, `NBD_CMD_BLOCK_STATUS`): the contexts
//! the server offers, which queries name them, and the set a client selected.
//!
//! A new context (changed-block tracking, `qemu:dirty-bitmap:NAME`) is one more variant of
//! [`MetaContext`] and one more arm in `answer::block_status` that asks the export for it.

use logcache_engine::ExtentKind;
use logcache_nbd::consts::{META_CONTEXT_BASE_ALLOCATION, STATE_HOLE, STATE_ZERO};

/// A metadata context this server can report on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaContext {
    /// `base:allocation`: holes and zeros.
    BaseAllocation,
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
    /// Every context offered, in the order lists and block status replies use.
    pub const ALL: [MetaContext; 1] = [MetaContext::BaseAllocation];

    /// The full name, `namespace:leaf`.
    pub fn name(self) -> &'static str {
        match self {
            MetaContext::BaseAllocation => META_CONTEXT_BASE_ALLOCATION,
        }
    }

    /// The id SET_META_CONTEXT gives it and block status chunks carry: fixed per context, so a
    /// selection is a bit set and the id needs no per-connection table.
    pub fn id(self) -> u32 {
        let index = MetaContext::ALL
            .iter()
            .position(|&context| context == self)
            .expect("every context is in ALL");
        index as u32 + 1
    }

    /// SET selects a context named exactly; LIST also accepts the bare namespace (`base:`),
    /// which the spec says lists all of that namespace's contexts.
    pub fn matches(self, query: &str, listing: bool) -> bool {
        let name = self.name();
        if query == name {
            return true;
        }
        let namespace_end = name.find(':').expect("context names have a namespace") + 1;
        listing && query == &name[..namespace_end]
    }
}

/// The contexts a client selected with its last SET_META_CONTEXT (a bit per context id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Selection {
    bits: u32,
}

const _: () = assert!(MetaContext::ALL.len() < 32);

impl Selection {
    /// The contexts `queries` select (all of them for LIST with no query).
    pub fn of_queries(queries: &[String], listing: bool) -> Selection {
        let mut selection = Selection::default();
        for context in MetaContext::ALL {
            let all = listing && queries.is_empty();
            if all || queries.iter().any(|query| context.matches(query, listing)) {
                selection.bits |= 1 << context.id();
            }
        }
        selection
    }

    pub fn is_empty(self) -> bool {
        self.bits == 0
    }

    pub fn contains(self, context: MetaContext) -> bool {
        self.bits & (1 << context.id()) != 0
    }

    /// The selected contexts, in id order.
    pub fn iter(self) -> impl Iterator<Item = MetaContext> {
        MetaContext::ALL
            .into_iter()
            .filter(move |&context| self.contains(context))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queries(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn ids_are_distinct_and_non_zero() {
        let ids: Vec<u32> = MetaContext::ALL.iter().map(|c| c.id()).collect();
        for (index, id) in ids.iter().enumerate() {
            assert_ne!(*id, 0, "id 0 is what LIST replies carry");
            assert!(!ids[..index].contains(id));
        }
    }

    #[test]
    fn queries_select_by_name_and_list_by_namespace() {
        let base = MetaContext::BaseAllocation;
        assert!(Selection::of_queries(&[], true).contains(base));
        assert!(Selection::of_queries(&[], false).is_empty());
        assert!(Selection::of_queries(&queries(&["base:"]), true).contains(base));
        assert!(Selection::of_queries(&queries(&["base:"]), false).is_empty());
        let set = Selection::of_queries(&queries(&["qemu:x", "base:allocation"]), false);
        assert_eq!(set.iter().collect::<Vec<_>>(), [base]);
        assert!(
            Selection::of_queries(&queries(&["base:alloc", "BASE:allocation"]), true).is_empty()
        );
    }
}
