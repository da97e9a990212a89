//! TLS with real clients: `logcache serve` with X.509 certificates (made here with certtool) or
//! a PSK file (made with psktool), reached by nbdinfo, nbdcopy, qemu-img and qemu-io, which all
//! use GnuTLS; clients that must be refused (no TLS, a certificate from another CA, an expired
//! certificate, a wrong key) are, each with one clear line in serve's log.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

const CACHE_BYTES: u64 = 64 * MIB;
const BACKING_BYTES: u64 = 64 * MIB;

/// A certificate authority and certificates signed by it, laid out as qemu and libnbd read
/// them: `server/` (ca-cert.pem, server-cert.pem, server-key.pem) and `client/` (ca-cert.pem,
/// client-cert.pem, client-key.pem).
struct Pki {
    dir: PathBuf,
}

fn certtool(args: &[&str]) {
    let out = run(tool("certtool").args(args));
    assert_ok(&out, &format!("certtool {args:?}"));
}

fn private_key(path: &Path) {
    certtool(&["--generate-privkey", "--outfile", &path.to_string_lossy()]);
}

impl Pki {
    /// Makes a CA under `dir/NAME`, with `server/` and `client/` certificates from it.
    fn new(dir: &Path, name: &str) -> Pki {
        let pki = Pki {
            dir: dir.join(name),
        };
        for sub in ["", "server", "client"] {
            std::fs::create_dir_all(pki.dir.join(sub)).unwrap();
        }
        let ca_key = pki.dir.join("ca-key.pem");
        let ca_cert = pki.dir.join("ca-cert.pem");
        private_key(&ca_key);
        let template = pki.dir.join("ca.info");
        std::fs::write(
            &template,
            format!("cn = logcache test CA {name}\nca\ncert_signing_key\nexpiration_days = 30\n"),
        )
        .unwrap();
        certtool(&[
            "--generate-self-signed",
            "--load-privkey",
            &ca_key.to_string_lossy(),
            "--template",
            &template.to_string_lossy(),
            "--outfile",
            &ca_cert.to_string_lossy(),
        ]);
        for sub in ["server", "client"] {
            std::fs::copy(&ca_cert, pki.dir.join(sub).join("ca-cert.pem")).unwrap();
        }
        pki.issue(
            "server/server",
            "cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 30\n",
        );
        pki.issue(
            "client/client",
            "cn = logcache test client\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 30\n",
        );
        pki
    }

    /// Writes `STEM-key.pem` and `STEM-cert.pem` signed by this CA with the given template.
    fn issue(&self, stem: &str, template_text: &str) {
        let key = self.dir.join(format!("{stem}-key.pem"));
        let cert = self.dir.join(format!("{stem}-cert.pem"));
        let template = self.dir.join(format!("{}.info", stem.replace('/', "-")));
        std::fs::write(&template, template_text).unwrap();
        private_key(&key);
        certtool(&[
            "--generate-certificate",
            "--load-ca-certificate",
            &self.dir.join("ca-cert.pem").to_string_lossy(),
            "--load-ca-privkey",
            &self.dir.join("ca-key.pem").to_string_lossy(),
            "--load-privkey",
            &key.to_string_lossy(),
            "--template",
            &template.to_string_lossy(),
            "--outfile",
            &cert.to_string_lossy(),
        ]);
    }

    fn path(&self, sub: &str) -> String {
        self.dir.join(sub).to_string_lossy().into_owned()
    }
}

fn serve_tls(dir: &TestDir, tls_args: &[&str]) -> Served {
    let (cache, backing) = formatted_pair(dir, CACHE_BYTES, BACKING_BYTES);
    let socket = dir.s("nbd.sock");
    let mut args = vec![
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--socket",
        &socket,
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(tls_args);
    Served::start(&args)
}

fn socket_of(served: &Served) -> String {
    let uri = served
        .uris()
        .into_iter()
        .find(|u| u.contains("+unix://"))
        .unwrap_or_else(|| panic!("no Unix endpoint in {:?}", served.stdout()));
    let (_, rest) = uri.split_once("socket=").unwrap();
    percent_decode(rest.split('&').next().unwrap())
}

fn port_of(served: &Served) -> String {
    let uri = served
        .uris()
        .into_iter()
        .find(|u| !u.contains("+unix://"))
        .unwrap_or_else(|| panic!("no TCP endpoint in {:?}", served.stdout()));
    let authority = uri.split("://").nth(1).unwrap().split('/').next().unwrap();
    authority.rsplit_once(':').unwrap().1.to_owned()
}

fn nbdinfo(uri: &str) -> Output {
    run(tool("nbdinfo").args(["--size", uri]))
}

fn export_size() -> String {
    (BACKING_BYTES - 4096).to_string()
}

/// `qemu-io` through `--object tls-creds-*` with the given object and driver options.
fn qemu_io_object(object: &str, driver: &str, cmds: &[&str]) -> Output {
    let mut c = tool("qemu-io");
    c.args(["--object", object, "--image-opts", driver]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    run(&mut c)
}

/// `qemu-img info` through `--object tls-creds-*`.
fn qemu_img_info_object(object: &str, driver: &str) -> Output {
    run(tool("qemu-img").args(["info", "--object", object, "--image-opts", driver]))
}

fn assert_qemu_ok(out: &Output, what: &str) {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("Pattern verification failed"),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
}

/// serve's log once it has a line containing all of `needles`; that line.
fn log_line(served: &Served, needles: &[&str]) -> String {
    let log = served.stderr_with(needles[0]);
    log.lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .unwrap_or_else(|| panic!("no log line with {needles:?} in serve's stderr:\n{log}"))
        .to_owned()
}

/// The next line serve logs after the first `seen` lines (waiting for it), as one line that
/// names the connection.
fn next_log_line(served: &Served, seen: &mut usize) -> String {
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    loop {
        let log = served.stderr();
        let complete = &log[..log.rfind('\n').map_or(0, |i| i + 1)];
        if let Some(line) = complete.lines().nth(*seen) {
            *seen += 1;
            assert!(line.starts_with("logcache: NBD connection "), "{line}");
            return line.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve logged no line for a refused client:\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn x509_clients_are_served_and_strangers_refused_with_a_log_line() {
    let dir = TestDir::new("tls-x509");
    let pki = Pki::new(dir.path(), "ca");
    let served = serve_tls(
        &dir,
        &[
            "--tls-certificates",
            &pki.path("server"),
            "--tls-verify-peer",
            "--tls",
            "require",
        ],
    );
    let socket = socket_of(&served);
    let port = port_of(&served);
    let client = pki.path("client");
    let unix_uri = |certs: &str| format!("nbds+unix:///?socket={socket}&tls-certificates={certs}");

    // nbdinfo over the Unix socket and over TCP.
    let out = nbdinfo(&unix_uri(&client));
    assert_ok(&out, "nbdinfo through TLS on the Unix socket");
    assert_eq!(text(&out.stdout).trim(), export_size());
    let out = nbdinfo(&format!(
        "nbds://localhost:{port}/?tls-certificates={client}"
    ));
    assert_ok(&out, "nbdinfo through TLS on TCP");

    // qemu-io writes and reads back through TLS; qemu-img sees the size over TCP.
    let x509 = format!("tls-creds-x509,id=tls0,endpoint=client,dir={client}");
    let out = qemu_io_object(
        &x509,
        &format!("driver=nbd,path={socket},tls-creds=tls0,tls-hostname=localhost"),
        &["write -P 0xa5 0 1M", "read -P 0xa5 0 1M"],
    );
    assert_qemu_ok(&out, "qemu-io through TLS (X.509)");
    let out = qemu_img_info_object(
        &x509,
        &format!(
            "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},tls-creds=tls0"
        ),
    );
    assert_ok(&out, "qemu-img info through TLS on TCP");
    assert!(
        text(&out.stdout).contains(&export_size()),
        "{}",
        text(&out.stdout)
    );

    // nbdcopy in and back out through TLS.
    let source = dir.join("source.img");
    let mut rng = Rng::new(26);
    std::fs::write(&source, rng.bytes(4 * MIB as usize)).unwrap();
    let out =
        run(tool("nbdcopy").args([&source.to_string_lossy().into_owned(), &unix_uri(&client)]));
    assert_ok(&out, "nbdcopy into the export through TLS");
    let copy = dir.join("copy.img");
    let out = run(tool("nbdcopy").args([&unix_uri(&client), &copy.to_string_lossy().into_owned()]));
    assert_ok(&out, "nbdcopy out of the export through TLS");
    assert!(
        read_at(&copy, 0, 4 * MIB as usize) == std::fs::read(&source).unwrap(),
        "nbdcopy through TLS read back other bytes than it wrote"
    );

    // A plain client is refused: the server requires TLS.
    let out = nbdinfo(&format!("nbd+unix:///?socket={socket}"));
    assert!(
        !out.status.success(),
        "a plain client was served under --tls require"
    );

    // No client certificate: refused, and the log says so.
    let no_cert = dir.join("no-cert");
    std::fs::create_dir_all(&no_cert).unwrap();
    std::fs::copy(pki.dir.join("ca-cert.pem"), no_cert.join("ca-cert.pem")).unwrap();
    let mut seen = served.stderr().lines().count();
    let out = nbdinfo(&unix_uri(&no_cert.to_string_lossy()));
    assert!(
        !out.status.success(),
        "a client without a certificate was served"
    );
    let line = next_log_line(&served, &mut seen);
    assert!(
        line.contains("TLS handshake refused: the client presented no certificate"),
        "{line}"
    );

    // A client certificate from another CA: refused with a line naming the verification.
    let other = Pki::new(dir.path(), "other-ca");
    let stranger = dir.join("stranger");
    std::fs::create_dir_all(&stranger).unwrap();
    std::fs::copy(pki.dir.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();
    for file in ["client-cert.pem", "client-key.pem"] {
        std::fs::copy(other.dir.join("client").join(file), stranger.join(file)).unwrap();
    }
    let out = nbdinfo(&unix_uri(&stranger.to_string_lossy()));
    assert!(
        !out.status.success(),
        "a client certificate from another CA was accepted"
    );
    // (GnuTLS clients send only a certificate from a CA the server names, so this one sends
    // none.)
    let line = next_log_line(&served, &mut seen);
    assert!(line.contains("no certificate signed by our CA"), "{line}");

    // An expired client certificate from our own CA: refused, and the log says it expired.
    let expired = dir.join("expired");
    std::fs::create_dir_all(&expired).unwrap();
    std::fs::copy(pki.dir.join("ca-cert.pem"), expired.join("ca-cert.pem")).unwrap();
    pki.issue(
        "old-client",
        "cn = expired client\ntls_www_client\nencryption_key\nsigning_key\nactivation_date = \"2020-01-01 00:00:00 UTC\"\nexpiration_date = \"2020-12-31 00:00:00 UTC\"\n",
    );
    std::fs::copy(
        pki.dir.join("old-client-cert.pem"),
        expired.join("client-cert.pem"),
    )
    .unwrap();
    std::fs::copy(
        pki.dir.join("old-client-key.pem"),
        expired.join("client-key.pem"),
    )
    .unwrap();
    let out = nbdinfo(&unix_uri(&expired.to_string_lossy()));
    assert!(
        !out.status.success(),
        "an expired client certificate was accepted"
    );
    let line = next_log_line(&served, &mut seen);
    assert!(
        line.contains("did not verify against our CA") && line.contains("expired"),
        "{line}"
    );

    // A client that trusts another CA refuses our certificate; the server logs the refusal.
    let out = nbdinfo(&unix_uri(&other.path("client")));
    assert!(
        !out.status.success(),
        "a client trusting another CA accepted our certificate"
    );
    let line = next_log_line(&served, &mut seen);
    assert!(line.contains("TLS"), "{line}");

    // The server kept serving throughout.
    assert_ok(&nbdinfo(&unix_uri(&client)), "nbdinfo after the refusals");
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

#[test]
fn psk_clients_are_served_and_wrong_keys_refused_with_a_log_line() {
    let dir = TestDir::new("tls-psk");
    let keys = dir.join("keys.psk");
    let out = run(tool("psktool").args(["-u", "alice", "-p", &keys.to_string_lossy()]));
    assert_ok(&out, "psktool");
    let served = serve_tls(&dir, &["--tls-psk", &dir.s("keys.psk")]);
    let socket = socket_of(&served);
    let port = port_of(&served);
    let keys = keys.to_string_lossy().into_owned();
    let uri = |user: &str, file: &str| {
        format!("nbds+unix://{user}@/?socket={socket}&tls-psk-file={file}")
    };

    let out = nbdinfo(&uri("alice", &keys));
    assert_ok(&out, "nbdinfo with a PSK");
    assert_eq!(text(&out.stdout).trim(), export_size());
    let out = nbdinfo(&format!(
        "nbds://alice@127.0.0.1:{port}/?tls-psk-file={keys}"
    ));
    assert_ok(&out, "nbdinfo with a PSK over TCP");

    // qemu reads keys.psk from a directory.
    let qemu_dir = dir.join("qemu-psk");
    std::fs::create_dir_all(&qemu_dir).unwrap();
    std::fs::copy(&keys, qemu_dir.join("keys.psk")).unwrap();
    let psk = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        qemu_dir.display()
    );
    let out = qemu_io_object(
        &psk,
        &format!("driver=nbd,path={socket},tls-creds=tls0"),
        &["write -P 0x3c 1M 1M", "read -P 0x3c 1M 1M"],
    );
    assert_qemu_ok(&out, "qemu-io through TLS (PSK)");
    let out = qemu_img_info_object(&psk, &format!("driver=nbd,path={socket},tls-creds=tls0"));
    assert_ok(&out, "qemu-img info through TLS (PSK)");

    // --listen on loopback with credentials and no --tls: TLS is offered, not required.
    let out = nbdinfo(&format!("nbd+unix:///?socket={socket}"));
    assert_ok(&out, "a plain client under the default (--tls on)");

    // A wrong key for a known user, and an unknown user: refused, one line each.
    let wrong = dir.join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", "ab".repeat(32))).unwrap();
    let out = nbdinfo(&uri("alice", &wrong.to_string_lossy()));
    assert!(!out.status.success(), "a wrong PSK was accepted");
    log_line(&served, &["key for PSK identity \"alice\" does not match"]);
    let stranger = dir.join("stranger.psk");
    std::fs::write(&stranger, format!("mallory:{}\n", "cd".repeat(32))).unwrap();
    let out = nbdinfo(&uri("mallory", &stranger.to_string_lossy()));
    assert!(
        !out.status.success(),
        "an unknown PSK identity was accepted"
    );
    log_line(&served, &["unknown PSK identity \"mallory\""]);

    assert_ok(&nbdinfo(&uri("alice", &keys)), "nbdinfo after the refusals");
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

/// On a non-loopback address, credentials alone make TLS required (no --allow-remote needed),
/// and a plain client is refused.
#[test]
fn a_non_loopback_address_with_credentials_requires_tls() {
    let dir = TestDir::new("tls-remote");
    let keys = dir.join("keys.psk");
    assert_ok(
        &run(tool("psktool").args(["-u", "alice", "-p", &keys.to_string_lossy()])),
        "psktool",
    );
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    let keys = keys.to_string_lossy().into_owned();
    let served = Served::start(&[
        "--cache",
        &cache,
        "--backing",
        &backing,
        "--listen",
        "0.0.0.0:0",
        "--tls-psk",
        &keys,
    ]);
    let port = port_of(&served);
    assert!(
        served.uris().iter().all(|u| u.starts_with("nbds")),
        "{:?}",
        served.uris()
    );
    let out = nbdinfo(&format!("nbd://127.0.0.1:{port}/"));
    assert!(
        !out.status.success(),
        "a plain client was served on a non-loopback address"
    );
    let out = nbdinfo(&format!(
        "nbds://alice@127.0.0.1:{port}/?tls-psk-file={keys}"
    ));
    assert_ok(&out, "nbdinfo with a PSK");
    assert!(!served.stderr().contains("warning"), "{}", served.stderr());
    // Asking for optional TLS there needs --allow-remote, as plain serving does.
    fails_with(
        1,
        &[
            "serve",
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--listen",
            "0.0.0.0:0",
            "--tls",
            "on",
            "--tls-psk",
            &keys,
        ],
        &["--allow-remote"],
    );
    let stopped = served.stop();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}

#[test]
fn tls_flags_are_checked_before_anything_opens() {
    let dir = TestDir::new("tls-flags");
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    let base = ["serve", "--cache", &cache, "--backing", &backing];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let args = with(&["--tls", "require"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(1, &args, &["--tls-certificates", "--tls-psk"]);
    let missing = dir.s("nowhere");
    let args = with(&["--tls-certificates", &missing]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(1, &args, &["server-cert.pem"]);
    let bad_psk = dir.join("bad.psk");
    std::fs::write(&bad_psk, "alice:xyz\n").unwrap();
    let bad_psk = bad_psk.to_string_lossy().into_owned();
    let args = with(&["--tls-psk", &bad_psk]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(1, &args, &["line 1", "USERNAME:HEXKEY"]);
    // An expired server certificate is refused at start, not per client.
    let pki = Pki::new(dir.path(), "ca");
    pki.issue(
        "server/server",
        "cn = localhost\ntls_www_server\nencryption_key\nsigning_key\nactivation_date = \"2020-01-01 00:00:00 UTC\"\nexpiration_date = \"2020-12-31 00:00:00 UTC\"\n",
    );
    let server_dir = pki.path("server");
    let args = with(&["--tls-certificates", &server_dir]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_with(1, &args, &["expired", "server-cert.pem"]);
}

/// The backing device behind TLS: nbdkit with `--tls=require`, reached with an nbds+unix URI
/// (X.509, then PSK). Data written through logcache and drained is on nbdkit's export.
#[test]
fn nbd_backing_through_tls_to_nbdkit() {
    let dir = TestDir::new("tls-backing");
    let pki = Pki::new(dir.path(), "ca");
    let keys = dir.join("keys.psk");
    assert_ok(
        &run(tool("psktool").args(["-u", "alice", "-p", &keys.to_string_lossy()])),
        "psktool",
    );
    let x509_sock = dir.join("kit-x509.sock");
    let _kit_x509 = Daemon::start(
        tool("nbdkit")
            .args(["-f", "--tls=require"])
            .arg(format!("--tls-certificates={}", pki.path("server")))
            .arg("-U")
            .arg(&x509_sock)
            .args(["memory", &BACKING_BYTES.to_string()]),
        &x509_sock,
        &dir.join("nbdkit-x509.log"),
    );
    let psk_sock = dir.join("kit-psk.sock");
    let _kit_psk = Daemon::start(
        tool("nbdkit")
            .args(["-f", "--tls=require"])
            .arg(format!("--tls-psk={}", keys.display()))
            .arg("-U")
            .arg(&psk_sock)
            .args(["memory", &BACKING_BYTES.to_string()]),
        &psk_sock,
        &dir.join("nbdkit-psk.log"),
    );
    let backings = [
        format!(
            "nbds+unix:///?socket={}&tls-certificates={}",
            x509_sock.display(),
            pki.path("client")
        ),
        format!(
            "nbds+unix://alice@/?socket={}&tls-psk-file={}",
            psk_sock.display(),
            keys.display()
        ),
    ];
    // In the clear, nbdkit refuses, and logcache says what to do.
    let plain = format!("nbd+unix:///?socket={}", x509_sock.display());
    let cache = dir.s("plain-cache.img");
    sparse(Path::new(&cache), CACHE_BYTES);
    let line = fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &plain],
        &["requires TLS"],
    );
    assert!(line.contains("nbds"), "{line}");
    for (index, backing) in backings.iter().enumerate() {
        let cache = dir.s(format!("cache-{index}.img"));
        sparse(Path::new(&cache), CACHE_BYTES);
        assert_ok(
            &logcache(&["format", "--cache", &cache, "--backing", backing]),
            "format over a TLS backing",
        );
        let served = Served::start(&[
            "--cache",
            &cache,
            "--backing",
            backing,
            "--set",
            "writeback_idle_ms=0",
        ]);
        let uri = served.unix_uri();
        qemu_io_ok(&uri, &["write -P 0x6b 3M 1M", "flush"]);
        let ctl = served.control().to_string_lossy().into_owned();
        assert_ok(&logcache(&["drain", "--control", &ctl]), "logcache drain");
        // Straight from nbdkit, through TLS, bypassing logcache.
        let script = format!(
            "h.set_uri_allow_local_file(True); h.connect_uri({backing:?}); assert h.pread(1 << 20, 3 << 20) == b'\\x6b' * (1 << 20); print('ok')"
        );
        let out = run(nbdsh().args(["-c", &script]));
        assert_ok(&out, "nbdsh on nbdkit through TLS");
        let stopped = served.stop();
        assert!(stopped.status.success(), "{}", stopped.stderr);
    }
    // A wrong key is refused with one line naming TLS.
    let wrong = dir.join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", "ab".repeat(32))).unwrap();
    let backing = format!(
        "nbds+unix://alice@/?socket={}&tls-psk-file={}",
        psk_sock.display(),
        wrong.display()
    );
    let cache = dir.s("wrong-cache.img");
    sparse(Path::new(&cache), CACHE_BYTES);
    fails_with(
        1,
        &["format", "--cache", &cache, "--backing", &backing],
        &["TLS handshake"],
    );
}

/// The lines of the ```sh block that follows `marker` in README.md, up to the first line that
/// starts with `stop` (continuation lines joined).
fn readme_lines(marker: &str, stop: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README has no {marker:?}"));
    let rest = &readme[at..];
    let start = rest.find("```sh\n").unwrap() + "```sh\n".len();
    let end = start + rest[start..].find("```").unwrap();
    let joined = rest[start..end].replace("\\\n", " ");
    joined
        .lines()
        .take_while(|line| !line.starts_with(stop))
        .map(str::to_owned)
        .collect()
}

/// The README's TLS setup, run as written: its certtool lines make a CA and a server
/// certificate that `serve --tls-certificates pki/server` loads and nbdinfo, given
/// `pki/client`, trusts; its psktool line makes a key file both ends read.
#[test]
fn the_readme_tls_setup_works_as_written() {
    let dir = TestDir::new("tls-readme");
    let setup = readme_lines("TLS with a test CA", "logcache serve");
    assert!(setup.iter().any(|l| l.contains("certtool")), "{setup:?}");
    let psk = readme_lines("Or a pre-shared key", "logcache serve");
    assert!(psk.iter().any(|l| l.starts_with("psktool")), "{psk:?}");
    // One shell, as a user types them (the lines `cd` into pki/ and back).
    let script = setup
        .iter()
        .chain(&psk)
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");
    let out = run(std::process::Command::new("/bin/sh")
        .args(["-ec", &script])
        .current_dir(dir.path()));
    assert_ok(&out, &script);
    let (cache, backing) = formatted_pair(&dir, CACHE_BYTES, BACKING_BYTES);
    let socket = dir.s("nbd.sock");
    let cases = [
        (
            "--tls-certificates",
            "pki/server",
            "",
            "tls-certificates",
            "pki/client",
        ),
        (
            "--tls-psk",
            "keys.psk",
            "alice@",
            "tls-psk-file",
            "keys.psk",
        ),
    ];
    for (flag, server_side, user, parameter, client_side) in cases {
        let server_side = dir.s(server_side);
        let served = Served::start(&[
            "--cache",
            &cache,
            "--backing",
            &backing,
            "--socket",
            &socket,
            flag,
            &server_side,
            "--tls",
            "require",
        ]);
        let out = nbdinfo(&format!(
            "nbds+unix://{user}/?socket={socket}&{parameter}={}",
            dir.s(client_side)
        ));
        assert_ok(&out, &format!("nbdinfo with the README's {flag} setup"));
        drop(served);
    }
}
