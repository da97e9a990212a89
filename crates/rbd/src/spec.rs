//! The backing SPEC that names an RBD image: `rbd:POOL/IMAGE[?conf=PATH&id=USER]`.

use std::fmt;
use std::path::PathBuf;

/// The prefix that marks a backing SPEC as an RBD image.
pub const RBD_PREFIX: &str = "rbd:";

/// Whether `text` names an RBD image (it starts with `rbd:`), so that a parse error is reported
/// as a bad RBD spec rather than a missing file.
pub fn is_rbd_spec(text: &str) -> bool {
    text.starts_with(RBD_PREFIX)
}

/// A parsed `rbd:POOL/IMAGE[?conf=PATH&id=USER]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// The cluster's config file; `None`: librados' default search (`$CEPH_CONF`,
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The client's user id without the `client.` prefix; `None`: `admin`.
    pub id: Option<String>,
}

/// What is wrong with an RBD spec, with the expected form in the message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("backing device {spec:?} is not a valid RBD spec: {why} (expected rbd:POOL/IMAGE[?conf=PATH&id=USER])")]
pub struct SpecError {
    pub spec: String,
    pub why: String,
}

impl RbdSpec {
    pub fn parse(spec: &str) -> Result<RbdSpec, SpecError> {
        let fail = |why: &str| SpecError {
            spec: spec.to_owned(),
            why: why.to_owned(),
        };
        let rest = spec
            .strip_prefix(RBD_PREFIX)
            .ok_or_else(|| fail("it does not start with rbd:"))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (pool, image) = path
            .split_once('/')
            .ok_or_else(|| fail("no / between the pool and the image"))?;
        if pool.is_empty() || image.is_empty() {
            return Err(fail("the pool and the image must both be named"));
        }
        if image.contains('/') || image.contains('@') {
            return Err(fail(
                "the image name contains / or @ (namespaces and snapshots are not supported)",
            ));
        }
        let mut parsed = RbdSpec {
            pool: pool.to_owned(),
            image: image.to_owned(),
            conf: None,
            id: None,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| fail(&format!("{pair:?} is not KEY=VALUE")))?;
            if value.is_empty() {
                return Err(fail(&format!("{key} has no value")));
            }
            let slot_taken = match key {
                "conf" => parsed.conf.replace(PathBuf::from(value)).is_some(),
                "id" => parsed.id.replace(value.to_owned()).is_some(),
                _ => return Err(fail(&format!("unknown option {key:?} (known: conf, id)"))),
            };
            if slot_taken {
                return Err(fail(&format!("{key} is given twice")));
            }
        }
        debug_assert!(!parsed.pool.is_empty() && !parsed.image.is_empty());
        Ok(parsed)
    }
}

impl fmt::Display for RbdSpec {
    /// `rbd:POOL/IMAGE` and the options given, in a fixed order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{RBD_PREFIX}{}/{}", self.pool, self.image)?;
        let mut sep = '?';
        if let Some(conf) = &self.conf {
            write!(f, "{sep}conf={}", conf.display())?;
            sep = '&';
        }
        if let Some(id) = &self.id {
            write!(f, "{sep}id={id}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pool_image_and_options() {
        let s = RbdSpec::parse("rbd:rbd/disk1").unwrap();
        assert_eq!((s.pool.as_str(), s.image.as_str()), ("rbd", "disk1"));
        assert_eq!((s.conf, s.id), (None, None));
        let s = RbdSpec::parse("rbd:p/i?conf=/tmp/c/ceph.conf&id=logcache").unwrap();
        assert_eq!(s.conf, Some(PathBuf::from("/tmp/c/ceph.conf")));
        assert_eq!(s.id.as_deref(), Some("logcache"));
        assert_eq!(s.to_string(), "rbd:p/i?conf=/tmp/c/ceph.conf&id=logcache");
        let s = RbdSpec::parse("rbd:p/i?id=u").unwrap();
        assert_eq!(s.to_string(), "rbd:p/i?id=u");
    }

    #[test]
    fn refuses_malformed_specs_saying_why() {
        for (spec, why) in [
            ("rbd:", "no /"),
            ("rbd:pool", "no /"),
            ("rbd:/img", "both be named"),
            ("rbd:pool/", "both be named"),
            ("rbd:p/i/j", "namespaces"),
            ("rbd:p/i@snap", "snapshots"),
            ("rbd:p/i?conf", "not KEY=VALUE"),
            ("rbd:p/i?conf=", "no value"),
            ("rbd:p/i?user=x", "unknown option"),
            ("rbd:p/i?id=a&id=b", "twice"),
            ("file.img", "does not start"),
        ] {
            let e = RbdSpec::parse(spec).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(why), "{spec}: {msg}");
            assert!(msg.contains("rbd:POOL/IMAGE"), "{msg}");
        }
        assert!(is_rbd_spec("rbd:x"));
        assert!(!is_rbd_spec("/dev/rbd0"));
    }
}
