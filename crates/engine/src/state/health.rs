//! Whether the engine accepts IO: failed (after an unrecoverable device error, with the first
//! cause kept) or closing. `inner::mark_failed` is the one way to fail it while running.

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct Health {
    /// Set after an unrecoverable device error: no more IO is accepted.
    failed: Option<String>,
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

    /// The cache device failed with no dirty data and the engine serves from the backing
    /// device alone (`path::alone`): `msg` replaces the failure's cause (status shows it).
    pub fn serve_alone(&mut self, msg: String) {
        debug_assert!(self.failed.is_some());
        self.failed = Some(msg);
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
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
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
