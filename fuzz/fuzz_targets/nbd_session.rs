#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    logcache_hostile::nbd_session(data);
});
