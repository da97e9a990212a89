//! Backing devices named by a SPEC: a file or block device path, or an NBD URI.

pub mod nbd;
