//! The control socket: a Unix socket beside the cache through which `status`, `set` and
//! `drain` talk to a running `serve`. One JSON object per line each way.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"set","key":K,"value":V}`, `{"cmd":"tunables"}`,
//! `{"cmd":"drain"}`, `{"cmd":"checkpoint_create","name":N}`, `{"cmd":"checkpoint_delete","name":N}`,
//! `{"cmd":"checkpoint_list"}`, `{"cmd":"export_diff","since":OLD,"checkpoint":NEW|null}` (its stream
//! comes in binary frames before the reply line, see `frames`). Replies: `{"ok":true,...}` or `{"ok":false,"error":"..."}`; a drain
//! first streams `{"progress":{...}}` lines.

pub mod client;
pub mod frames;
pub mod server;
