#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = logcache_hostile::open_corrupted_cache(data);
});
