//! Maps host errno values (from engine errors) to the few error codes the NBD spec allows.

use logcache_nbd::consts::{EINVAL, EIO, ENOMEM, ENOSPC, ENOTSUP, EOVERFLOW, EPERM, ESHUTDOWN};

/// The NBD error code for an engine error.
pub(crate) fn from_engine(error: &logcache_engine::Error) -> u32 {
    from_host(error.errno())
}

/// The nearest NBD error code for a host errno; anything without a close match is `EIO`.
pub(crate) fn from_host(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EACCES | libc::EROFS => EPERM,
        libc::EIO => EIO,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW | libc::EFBIG => EOVERFLOW,
        libc::ENOTSUP | libc::ENOSYS => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_map_and_the_rest_become_eio() {
        assert_eq!(from_host(libc::EROFS), EPERM);
        assert_eq!(from_host(libc::ENOSPC), ENOSPC);
        assert_eq!(from_host(libc::EOPNOTSUPP), ENOTSUP);
        assert_eq!(from_host(libc::ESHUTDOWN), ESHUTDOWN);
        assert_eq!(from_host(libc::EBADF), EIO);
        assert_eq!(from_host(0), EIO);
        let closed = logcache_engine::Error::Closed;
        assert_eq!(from_engine(&closed), EIO);
        let invalid = logcache_engine::Error::InvalidArgument("x".into());
        assert_eq!(from_engine(&invalid), EINVAL);
    }
}
