//! The window-quota fields of a class or an override, checked together.

use crate::policy::{DEFAULT_SLICES, PolicyError, Scope, StoreFailure, Window, bad};

/// The window-quota fields of a class or an override.
pub(super) struct WindowSpec {
    pub(super) limit: Option<u64>,
    pub(super) window: Option<std::time::Duration>,
    pub(super) slices: Option<u32>,
    pub(super) scope: Option<Scope>,
    pub(super) on_store_failure: Option<StoreFailure>,
}

impl WindowSpec {
    /// `Some` window if `window` is given (then `limit` is needed and
    /// neither `rate` nor `burst` may be); an error names the field.
    pub(super) fn build(self, at: &str, bucket: (Option<u64>, Option<u64>)) -> Result<Option<Window>, PolicyError> {
        let Self { limit, window, slices, scope, on_store_failure } = self;
        let Some(length) = window else {
            let stray = [("limit", limit.is_some()), ("slices", slices.is_some()), ("scope", scope.is_some())]
                .into_iter()
                .chain([("on_store_failure", on_store_failure.is_some())])
                .find(|(_, set)| *set);
            if let Some((field, _)) = stray {
                return Err(bad(format!("{at}{field}"), "belongs to a window quota: give window (and limit) too"));
            }
            return Ok(None);
        };
        if bucket.0.is_some() || bucket.1.is_some() {
            let field = if bucket.0.is_some() { "rate" } else { "burst" };
            return Err(bad(format!("{at}{field}"), "a window quota has limit and window, not rate and burst"));
        }
        let Some(limit) = limit else {
            return Err(bad(format!("{at}limit"), "a window quota needs limit (units per window)"));
        };
        if on_store_failure.is_some() && scope != Some(Scope::Fleet) {
            return Err(bad(format!("{at}on_store_failure"), "applies to scope = \"fleet\" only"));
        }
        Ok(Some(Window {
            limit,
            length,
            slices: slices.unwrap_or(DEFAULT_SLICES),
            scope: scope.unwrap_or_default(),
            on_store_failure: on_store_failure.unwrap_or_default(),
        }))
    }
}
