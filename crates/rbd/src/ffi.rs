//! The dozen calls of librados' and librbd's C API (`rados/librados.h`, `rbd/librbd.h` of
//! Ceph 16 "Pacific") that the RBD backing device uses, declared by hand. Only `session.rs`
//! calls them; every handle here is an opaque pointer owned by the C library.

use std::os::raw::{c_char, c_int, c_void};

pub type RadosT = *mut c_void;
pub type RadosIoctxT = *mut c_void;
pub type RbdImageT = *mut c_void;
pub type RbdCompletionT = *mut c_void;
pub type RbdCallbackT = Option<unsafe extern "C" fn(c: RbdCompletionT, arg: *mut c_void)>;

/// `rbd_lock_mode_t::RBD_LOCK_MODE_EXCLUSIVE`.
pub const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;
/// `RBD_FEATURE_EXCLUSIVE_LOCK` of `rbd/features.h`.
pub const RBD_FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;

#[link(name = "rados")]
extern "C" {
    pub fn rados_create(cluster: *mut RadosT, id: *const c_char) -> c_int;
    pub fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int;
    pub fn rados_connect(cluster: RadosT) -> c_int;
    pub fn rados_shutdown(cluster: RadosT);
    pub fn rados_ioctx_create(
        cluster: RadosT,
        pool_name: *const c_char,
        ioctx: *mut RadosIoctxT,
    ) -> c_int;
    pub fn rados_ioctx_destroy(io: RadosIoctxT);
}

#[link(name = "rbd")]
extern "C" {
    pub fn rbd_open(
        io: RadosIoctxT,
        name: *const c_char,
        image: *mut RbdImageT,
        snap_name: *const c_char,
    ) -> c_int;
    pub fn rbd_close(image: RbdImageT) -> c_int;
    pub fn rbd_get_size(image: RbdImageT, size: *mut u64) -> c_int;
    pub fn rbd_get_features(image: RbdImageT, features: *mut u64) -> c_int;
    pub fn rbd_lock_acquire(image: RbdImageT, lock_mode: c_int) -> c_int;
    pub fn rbd_lock_release(image: RbdImageT) -> c_int;

    pub fn rbd_aio_create_completion(
        cb_arg: *mut c_void,
        complete_cb: RbdCallbackT,
        c: *mut RbdCompletionT,
    ) -> c_int;
    pub fn rbd_aio_wait_for_complete(c: RbdCompletionT) -> c_int;
    pub fn rbd_aio_is_complete(c: RbdCompletionT) -> c_int;
    pub fn rbd_aio_get_return_value(c: RbdCompletionT) -> isize;
    pub fn rbd_aio_release(c: RbdCompletionT);

    pub fn rbd_aio_write(
        image: RbdImageT,
        off: u64,
        len: usize,
        buf: *const c_char,
        c: RbdCompletionT,
    ) -> c_int;
    pub fn rbd_aio_read(
        image: RbdImageT,
        off: u64,
        len: usize,
        buf: *mut c_char,
        c: RbdCompletionT,
    ) -> c_int;
    pub fn rbd_aio_discard(image: RbdImageT, off: u64, len: u64, c: RbdCompletionT) -> c_int;
    pub fn rbd_aio_write_zeroes(
        image: RbdImageT,
        off: u64,
        len: usize,
        c: RbdCompletionT,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> c_int;
    pub fn rbd_aio_flush(image: RbdImageT, c: RbdCompletionT) -> c_int;
}
