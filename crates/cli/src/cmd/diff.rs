//! `logcache import-diff IN|- TARGET [--from NAME]`: applies an `rbd diff v1` stream (from
//! `rbd export-diff`, or `logcache export-diff`) to a file, a block device, an NBD export or
//! an RBD image. `logcache export-diff`: asks a running serve for the changes since a
//! checkpoint, as such a stream (`export_diff.rs` on the serving side).

use std::fs::File;
use std::io::{self, BufReader, IsTerminal, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;
use logcache_backing::OpenError;
use logcache_diff::{name_text, Decoder, Header};
use logcache_nbd::uri::is_nbd_uri;

use crate::devices::{lock_exclusive, open_backing};
use crate::import_diff::apply;
use crate::size::human;

/// Reads of the stream are buffered this much: the decoder reads records a few bytes at a time.
const INPUT_BUFFER_BYTES: usize = 1 << 20;

#[derive(Args)]
#[command(after_help = "\
The target must be the size the diff's 's' record gives (checked; a mismatch is refused before \
anything is written). A diff made since a snapshot (an 'f' record, as `rbd export-diff \
--from-snap A` writes) holds only what changed since A: it is applied only with --from A, your \
statement that TARGET holds the disk as of A. A diff without an 'f' record (from an empty image) \
is applied only without --from. Applying a diff twice is harmless: each record sets its bytes \
outright.")]
pub struct ImportDiffArgs {
    /// The diff stream: a file, or - for standard input (e.g. `rbd export-diff ... - |`).
    pub input: String,
    /// Where to apply it: a file or block device path, an NBD URI (nbd://, nbd+unix://) or
    /// rbd:POOL/IMAGE[?conf=PATH&id=USER]. Not a disk a logcache serve is caching.
    pub target: String,
    /// The snapshot (or checkpoint) TARGET holds now: the diff's 'f' record must name it.
    #[arg(long, value_name = "NAME")]
    pub from: Option<String>,
}

pub fn import(args: &ImportDiffArgs) -> Result<()> {
    let (reader, stream_name) = open_input(&args.input)?;
    let mut decoder = Decoder::new(BufReader::with_capacity(INPUT_BUFFER_BYTES, reader))
        .with_context(|| format!("{stream_name} is not a usable diff (nothing was written)"))?;
    check_from(decoder.header(), args.from.as_deref(), &args.target)?;

    let target_name = &args.target;
    // A serve of this device (as cache or backing) holds this lock: writing under it would
    // corrupt what it caches. NBD and RBD targets have no local lock.
    let local = !is_nbd_uri(target_name) && Path::new(target_name).exists();
    let _lock = if local {
        Some(lock_exclusive(Path::new(target_name), |holder| {
            format!(
                "target {target_name} is in use by {holder}; stop it first: a diff must not be \
                 applied under a running logcache (nothing was written)"
            )
        })?)
    } else {
        None
    };
    let target = match open_backing(target_name) {
        Ok(target) => target,
        Err(e) if matches!(e.downcast_ref(), Some(OpenError::BackingMissing(_))) => bail!(
            "target {target_name} does not exist; give a file or block device the diff's size \
             ({} bytes), an NBD URI or rbd:POOL/IMAGE",
            decoder.header().size_bytes
        ),
        Err(e) => return Err(e.context(format!("opening target {target_name}"))),
    };
    let (diff_bytes, target_bytes) = (decoder.header().size_bytes, target.size_bytes());
    if diff_bytes != target_bytes {
        bail!(
            "the diff is for a disk of {diff_bytes} bytes ({}) but target {target_name} is \
             {target_bytes} bytes ({}); apply it to a copy of the same size, or resize the target \
             first (nothing was written)",
            human(diff_bytes),
            human(target_bytes)
        );
    }
    let header = decoder.header().clone();
    let applied = apply(&mut decoder, &*target, &stream_name, target_name)?;
    let span = match (&header.from_snap, &header.to_snap) {
        (Some(f), Some(t)) => format!(" (from '{}' to '{}')", name_text(f), name_text(t)),
        (Some(f), None) => format!(" (from '{}')", name_text(f)),
        (None, Some(t)) => format!(" (to '{}')", name_text(t)),
        (None, None) => String::new(),
    };
    println!(
        "applied {stream_name}{span} to {target_name}: {} bytes of data, {} bytes of zeros; \
         flushed",
        applied.data_bytes, applied.zero_bytes
    );
    Ok(())
}

/// The stream to read and how to name it in messages.
fn open_input(input: &str) -> Result<(Box<dyn Read>, String)> {
    if input == "-" {
        let stdin = io::stdin();
        if stdin.is_terminal() {
            bail!(
                "standard input is a terminal; pipe a diff into it (e.g. rbd export-diff \
                 IMAGE@SNAP - | logcache import-diff - TARGET) or give a file"
            );
        }
        return Ok((Box::new(stdin), "standard input".to_string()));
    }
    let file = File::open(input).with_context(|| format!("opening the diff {input}"))?;
    Ok((Box::new(file), input.to_string()))
}

/// The `--from` contract: a diff since a snapshot needs `--from` naming it; a diff from an empty
/// image takes no `--from`.
fn check_from(header: &Header, from: Option<&str>, target: &str) -> Result<()> {
    match (&header.from_snap, from) {
        (Some(f), Some(want)) if f.as_slice() == want.as_bytes() => Ok(()),
        (Some(f), Some(want)) => bail!(
            "the diff holds the changes since '{}', not since '{want}' (--from); {target} must \
             hold the disk as of '{}' (nothing was written)",
            name_text(f),
            name_text(f)
        ),
        (Some(f), None) => bail!(
            "the diff holds the changes since '{}'; if {target} holds the disk as of '{}', say \
             so with --from '{}' (nothing was written)",
            name_text(f),
            name_text(f),
            name_text(f)
        ),
        (None, Some(want)) => bail!(
            "the diff has no from-snapshot ('f' record): it is a whole image, not the changes \
             since '{want}'; apply it without --from to a zeroed target (nothing was written)"
        ),
        (None, None) => Ok(()),
    }
}

#[derive(Args)]
#[command(after_help = "\
The stream describes the disk at one moment, the creation of checkpoint NEW (or of a temporary \
checkpoint without --checkpoint): `logcache import-diff OUT TARGET --from NAME` onto a copy of \
the disk as of NAME makes it the disk as of NEW. A client writing, during the export, to a block \
the export has not read yet makes it fail (and NEW is not created): retry while writes pause.")]
pub struct ExportDiffArgs {
    /// The checkpoint the diff starts from (its 'f' record).
    #[arg(long, value_name = "NAME")]
    pub since: String,
    /// Create checkpoint NEW at the moment the diff describes and keep it (the next diff's
    /// --since; the stream's 't' record).
    #[arg(long, value_name = "NEW")]
    pub checkpoint: Option<String>,
    /// Control socket of the running serve (default: the embedded default's).
    #[arg(long)]
    pub control: Option<std::path::PathBuf>,
    /// Where to write the stream: a file (created or truncated), or - for standard output.
    pub output: String,
}

/// `logcache export-diff --since NAME [--checkpoint NEW] [--control PATH] OUT|-`.
pub fn export(args: &ExportDiffArgs) -> Result<()> {
    use std::io::Write;
    let path = args
        .control
        .clone()
        .unwrap_or_else(crate::defaults::admin_control_path);
    let request = serde_json::json!({
        "cmd": "export_diff",
        "since": args.since,
        "checkpoint": args.checkpoint,
    });
    let reply = if args.output == "-" {
        if io::stdout().is_terminal() {
            bail!("refusing to write a binary diff to a terminal; give a file, or pipe it (| logcache import-diff - TARGET)");
        }
        let mut c = crate::control::client::ControlClient::connect(&path)?;
        let stdout = io::stdout();
        let mut out = io::BufWriter::new(stdout.lock());
        let reply = c.call_stream(&request, &mut out)?;
        out.flush().context("writing the diff to standard output")?;
        reply
    } else {
        let mut c = crate::control::client::ControlClient::connect(&path)?;
        let file =
            File::create(&args.output).with_context(|| format!("creating {}", args.output))?;
        let mut out = io::BufWriter::new(file);
        let reply = c.call_stream(&request, &mut out);
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                drop(out);
                let _ = std::fs::remove_file(&args.output);
                return Err(e);
            }
        };
        let file = out.into_inner().context("writing the diff")?;
        file.sync_all()
            .with_context(|| format!("syncing {}", args.output))?;
        eprintln!(
            "exported the changes since {} to {}: {} of data, {} of zeros (as of one moment; {} rewritten meanwhile kept as they were){}",
            args.since,
            args.output,
            human(reply["data_bytes"].as_u64().unwrap_or(0)),
            human(reply["zero_bytes"].as_u64().unwrap_or(0)),
            human(reply["kept_bytes"].as_u64().unwrap_or(0)),
            args.checkpoint
                .as_ref()
                .map(|n| format!("; checkpoint {n} created"))
                .unwrap_or_default()
        );
        reply
    };
    let _ = reply;
    Ok(())
}
