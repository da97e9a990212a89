//! How the command-line programs (`logcache`, `logcache-bench`) end: an error as one line, a
//! usage error as one line pointing at `--help`.

use std::process::ExitCode;

/// Printing commands die quietly when their reader goes away (`logcache dump | head`), like
/// other command-line tools. Servers keep Rust's default (SIGPIPE ignored): a client closing its
/// socket must not kill them. Call before any thread exists.
pub fn die_quietly_on_broken_pipe() {
    // SAFETY: resetting a signal disposition before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The exit code for a command's result; an error is printed as one `PROGRAM:` line.
pub fn finish(result: anyhow::Result<()>, program: &str) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// One line: what went wrong, then each cause not already spelled out by the message before it
/// (library errors often include their source's text in their own message).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

/// Help and version go to stdout as usual; a usage error becomes one `PROGRAM:` line.
pub fn usage_error(e: clap::Error, program: &str) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        _ => {}
    }
    let text = e.to_string();
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        // A negative number for an unsigned value: say what is allowed.
        .replace(
            "invalid digit found in string",
            "give a whole number, 0 or more",
        );
    eprintln!("{program}: {first} (see {program} --help)");
    ExitCode::from(2)
}
