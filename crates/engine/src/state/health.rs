//! Whether the engine accepts IO: failed (after an unrecoverable device error, with the first
//! cause kept) or closing. `inner::mark_failed` is the one way to fail it while running.

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct Health {
    /// Set after an unrecoverable device error: no more IO is accepted.
    failed: Option<String>,
    /// The failure is the cache device's own (`inner::fail_cache`): status says `cache
    /// failed: <reason>`.
    cache: bool,
    /// Serving from the backing device alone after the cache device failed (`path::alone`):
    /// what that means for the user, after the reason.
    alone: Option<String>,
    closing: bool,
}

impl Health {
    /// Marks the engine failed with `msg`, unless it already is (the first cause is kept).
    pub fn fail(&mut self, msg: String) {
        if self.failed.is_none() {
            self.failed = Some(msg);
        }
        debug_assert!(self.failed.is_some());
    }

    /// As `fail`, for an error of the cache device itself; returns whether this was the first
    /// failure (the engine may then go on from the backing device alone).
    pub fn fail_cache(&mut self, msg: String) -> bool {
        if self.failed.is_some() {
            return false;
        }
        self.failed = Some(msg);
        self.cache = true;
        true
    }

    /// The engine serves from the backing device alone (`path::alone`): `note` says what that
    /// means (status shows it after the reason).
    pub fn serve_alone(&mut self, note: String) {
        debug_assert!(self.cache_failed());
        self.alone = Some(note);
    }

    /// Adds `more` to the failure's cause.
    pub fn note(&mut self, more: String) {
        if let Some(f) = &mut self.failed {
            f.push_str(&more);
        }
    }

    /// A simulated crash (tests): stops everything, whatever happened before.
    pub fn crash(&mut self) {
        self.failed = Some("crashed".into());
        self.cache = false;
        self.alone = None;
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The cache device failed: `cache failed: <reason>` (and, when serving from the backing
    /// device alone, what that means), the one line status shows for it.
    pub fn cache_failure(&self) -> Option<String> {
        let reason = self.failed.as_deref().filter(|_| self.cache)?;
        Some(match &self.alone {
            Some(note) => format!("cache failed: {reason}; {note}"),
            None => format!("cache failed: {reason}"),
        })
    }

    /// Whether the engine failed for an error of the cache device (and no simulated crash came
    /// since): what the switch to the backing device alone needs to go on.
    pub fn cache_failed(&self) -> bool {
        self.failed.is_some() && self.cache
    }

    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// `Error::Failed` once the engine failed.
    pub fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(msg) => Err(Error::Failed(msg.clone())),
            None => Ok(()),
        }
    }

    /// Refuses IO once the engine failed or is closing.
    pub fn check_usable(&self) -> Result<()> {
        self.check_failed()?;
        if self.closing {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// From now on, no new IO; it never reopens.
    pub fn begin_close(&mut self) {
        self.closing = true;
    }

    pub fn closing(&self) -> bool {
        self.closing
    }
}
