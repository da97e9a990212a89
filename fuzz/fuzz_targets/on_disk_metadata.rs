#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = logcache_hostile::on_disk_metadata(data);
});
