//! `qemu:dirty-bitmap:NAME` over NBD for every checkpoint, read by real clients: nbdinfo's
//! `--map` and `--list`-style context listing, and `qemu-img map` with qemu's `x-dirty-bitmap`
//! (which reports changed extents as `"data": false`).

mod common;

use common::*;
use serde_json::Value;

const KIB: u64 = 1024;

/// (offset, length) of the changed extents nbdinfo maps for `context`, merged.
fn nbdinfo_changed(uri: &str, context: &str) -> Vec<(u64, u64)> {
    let out = run(tool("nbdinfo").args(["--json", &format!("--map={context}"), uri]));
    assert_ok(&out, "nbdinfo --map");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("nbdinfo --map --json ({e}): {}", text(&out.stdout)));
    let extents = v.as_array().expect("an array of extents");
    let mut changed: Vec<(u64, u64)> = Vec::new();
    let mut covered = 0;
    for e in extents {
        let (off, len, kind) = (
            e["offset"].as_u64().unwrap(),
            e["length"].as_u64().unwrap(),
            e["type"].as_u64().unwrap(),
        );
        assert_eq!(off, covered, "extents are contiguous: {v}");
        covered += len;
        assert!(kind <= 1, "one flag: {v}");
        if kind == 1 {
            match changed.last_mut() {
                Some(last) if last.0 + last.1 == off => last.1 += len,
                _ => changed.push((off, len)),
            }
        }
    }
    changed
}

/// (offset, length) of the extents `qemu-img map` reports as `"data": false` through
/// `x-dirty-bitmap=qemu:dirty-bitmap:NAME` (qemu's reading of the dirty flag), merged.
fn qemu_img_changed(socket: &str, name: &str) -> Vec<(u64, u64)> {
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={socket},x-dirty-bitmap=qemu:dirty-bitmap:{name}"
    );
    let out = run(tool("qemu-img").args(["map", "--output=json", "--image-opts", &opts]));
    assert_ok(&out, "qemu-img map");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("qemu-img map --output=json ({e}): {}", text(&out.stdout)));
    let mut changed: Vec<(u64, u64)> = Vec::new();
    for e in v.as_array().expect("an array") {
        if e["data"] == Value::Bool(false) {
            let (off, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            match changed.last_mut() {
                Some(last) if last.0 + last.1 == off => last.1 += len,
                _ => changed.push((off, len)),
            }
        }
    }
    changed
}

fn socket_of(uri: &str) -> String {
    let (_, p) = uri.split_once("socket=").expect("a unix URI");
    percent_decode(p.split('&').next().unwrap_or(p))
}

#[test]
fn dirty_bitmaps_agree_with_what_was_written() {
    let dir = TestDir::new("ckpt-map");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    qemu_io_ok(&uri, &["write -P 1 0 4M"]);
    logcache_ok(&["checkpoint", "create", "mon", "--control", &ctl]);
    // 64 KiB at 1 MiB, 512 bytes at 3 MiB + 100 KiB (its 4 KiB block), zeros at 8 MiB, a TRIM.
    qemu_io_ok(
        &uri,
        &[
            "write -P 2 1M 64K",
            "write -P 3 3172K 512",
            "write -z 8M 12K",
            "discard 16M 1M",
        ],
    );
    logcache_ok(&["checkpoint", "create", "tue", "--control", &ctl]);
    qemu_io_ok(&uri, &["write -P 4 1M 4K", "write -P 5 20M 8K"]);

    let mon = vec![
        (MIB, 64 * KIB),
        (3172 * KIB, 4 * KIB),
        (8 * MIB, 12 * KIB),
        (16 * MIB, MIB),
        (20 * MIB, 8 * KIB),
    ];
    let tue = vec![(MIB, 4 * KIB), (20 * MIB, 8 * KIB)];
    assert_eq!(nbdinfo_changed(&uri, "qemu:dirty-bitmap:mon"), mon);
    assert_eq!(nbdinfo_changed(&uri, "qemu:dirty-bitmap:tue"), tue);
    let socket = socket_of(&uri);
    assert_eq!(qemu_img_changed(&socket, "mon"), mon);
    assert_eq!(qemu_img_changed(&socket, "tue"), tue);

    // Listing offers base:allocation and one context per checkpoint.
    let out = run(tool("nbdinfo").args(["--json", &uri]));
    assert_ok(&out, "nbdinfo --json");
    let info = text(&out.stdout);
    for name in [
        "base:allocation",
        "qemu:dirty-bitmap:mon",
        "qemu:dirty-bitmap:tue",
    ] {
        assert!(info.contains(name), "nbdinfo lists {name}: {info}");
    }
    // A deleted checkpoint is no longer offered.
    logcache_ok(&["checkpoint", "delete", "mon", "--control", &ctl]);
    let out = run(tool("nbdinfo").args(["--json", &uri]));
    assert!(!text(&out.stdout).contains("qemu:dirty-bitmap:mon"));
    let out = run(tool("nbdinfo").args(["--map=qemu:dirty-bitmap:mon", &uri]));
    assert!(!out.status.success(), "mapping a deleted checkpoint fails");
}

/// The pull-mode backup loop of libvirt-style tools, with real clients: a full copy at
/// checkpoint day0 (`nbdcopy`), then each day a new checkpoint, the previous one's dirty
/// extents from `nbdinfo --map=qemu:dirty-bitmap:NAME`, each copied alone by `qemu-img convert`
/// (a raw window of `offset`/`size` over the NBD export onto the same window of the backup
/// file), and the previous checkpoint deleted. After each day the backup equals the disk, and
/// only the dirty extents were read.
#[test]
fn a_backup_loop_copying_only_the_dirty_extents_reproduces_the_disk() {
    let dir = TestDir::new("backup-loop");
    let (cache, backing) = formatted_pair(&dir, 64 * MIB, 64 * MIB);
    let served = Served::start(&["--cache", &cache, "--backing", &backing]);
    let ctl = served.control().to_string_lossy().into_owned();
    let uri = served.unix_uri();
    let socket = socket_of(&uri);
    let size = 64 * MIB - 4096;
    qemu_io_ok(&uri, &["write -P 1 0 20M", "write -P 2 40M 4M"]);
    logcache_ok(&["checkpoint", "create", "day0", "--control", &ctl]);
    let backup = dir.s("backup.img");
    sparse(std::path::Path::new(&backup), size);
    assert_ok(&run(tool("nbdcopy").args([&uri, &backup])), "nbdcopy");
    let mut rng = Rng::new(2103);
    for day in 1..=3u64 {
        // A day's changes: writes of 512 B to 1 MiB, write-zeroes and TRIM.
        let mut cmds = Vec::new();
        for _ in 0..12 {
            let len = [512, 4096, 64 * KIB, MIB][rng.below(4) as usize];
            let off = rng.below((size - len) / 512) * 512;
            cmds.push(match rng.below(6) {
                0 => format!("write -z {off} {len}"),
                1 => format!("discard {off} {len}"),
                _ => format!("write -P {} {off} {len}", 10 + day),
            });
        }
        let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io_ok(&uri, &cmds);
        let (prev, next) = (format!("day{}", day - 1), format!("day{day}"));
        logcache_ok(&["checkpoint", "create", &next, "--control", &ctl]);
        let dirty = nbdinfo_changed(&uri, &format!("qemu:dirty-bitmap:{prev}"));
        let read: u64 = dirty.iter().map(|e| e.1).sum();
        assert!(!dirty.is_empty() && read < size / 4, "day {day}: {dirty:?}");
        for (off, len) in dirty {
            let src = format!(
                "driver=raw,offset={off},size={len},file.driver=nbd,file.server.type=unix,file.server.path={socket}"
            );
            let dst = format!(
                "driver=raw,offset={off},size={len},file.driver=file,file.filename={backup}"
            );
            let out = run(tool("qemu-img").args([
                "convert",
                "--image-opts",
                "-n",
                "--target-image-opts",
                &src,
                &dst,
            ]));
            assert_ok(&out, "qemu-img convert of a dirty extent");
        }
        logcache_ok(&["checkpoint", "delete", &prev, "--control", &ctl]);
        let now = dir.s(format!("now-{day}.img"));
        sparse(std::path::Path::new(&now), size);
        assert_ok(&run(tool("nbdcopy").args([&uri, &now])), "nbdcopy");
        assert!(
            std::fs::read(&backup).unwrap() == std::fs::read(&now).unwrap(),
            "day {day}: the backup ({read} bytes copied) differs from the disk"
        );
        std::fs::remove_file(now).unwrap();
    }
}
