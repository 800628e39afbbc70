//! An S3-protocol server on 127.0.0.1 for tests: moto's server (the Python package
//! `moto[server]`, pinned), installed into a virtualenv under the target directory the first
//! time it is needed. It honours conditional writes (`If-None-Match: *` and `If-Match`),
//! which Lance's commits and ctxlog's race-safe creation depend on.
//!
//! Two changes to moto, made by the launcher `serve.py` when the server starts. A GET of one
//! byte range reads that range, not the whole object: moto 5.2.5 reads and copies the whole
//! object for every range GET, so a range costs as much as the object, and a Lance scan of
//! large files measured the emulator (docs/benchmarks.md); S3 serves a range at the cost of
//! the range. And a conditional write is atomic: moto checks
//! `If-None-Match`/`If-Match` and then writes with nothing held between, so writers racing
//! one put-if-absent could both win; the launcher runs each write of a key, check and write,
//! under a lock of that key, and exactly one wins, as on S3.
//!
//! [`shared`] gives every test in a process one server: the one `cargo xtask test` started
//! for the whole run (`CTXLOG_S3_ENDPOINT`), or else one this process starts and that dies
//! with it. Only `python3` with `venv` is assumed. Std only: no HTTP client, no async.
#![warn(missing_docs)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The moto release the harness installs.
pub const MOTO_VERSION: &str = "5.2.5";

/// The environment variable that names a running server for a whole test run.
pub const ENDPOINT_ENV: &str = "CTXLOG_S3_ENDPOINT";

/// Credentials and region moto accepts (any), for every request.
const ACCESS_KEY: &str = "ctxlog-test";
const SECRET_KEY: &str = "ctxlog-test-secret";
const REGION: &str = "us-east-1";

/// Why the server could not be provided.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn err(what: impl Into<String>) -> Error {
    Error(what.into())
}

/// A running S3 server on loopback.
pub struct Server {
    endpoint: String,
    /// The process this harness started, if it did (killed when dropped).
    child: Option<Child>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The server every test of this process shares (see the crate docs).
pub fn shared() -> Result<&'static Server, Error> {
    static SHARED: OnceLock<Result<Server, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| match std::env::var(ENDPOINT_ENV) {
            Ok(endpoint) if !endpoint.is_empty() => Ok(Server { endpoint, child: None }),
            _ => start_for_process().map_err(|e| e.0),
        })
        .as_ref()
        .map_err(|e| err(e.clone()))
}

/// A server of its own (not the shared one), every request waiting `latency`; killed when
/// dropped. For measurements that count its requests or need its latency.
pub fn dedicated(latency: Duration) -> Result<Server, Error> {
    let venv = target_dir()?.join("s3-loopback").join(format!("moto-{MOTO_VERSION}"));
    Server::start_with_latency(&venv, latency)
}

/// Start a server owned by a thread that lives as long as the process, so that the server
/// (which dies with the thread that started it) outlives every test.
fn start_for_process() -> Result<Server, Error> {
    let venv = target_dir()?.join("s3-loopback").join(format!("moto-{MOTO_VERSION}"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        match Server::start(&venv) {
            Ok(mut server) => {
                let child = server.child.take();
                let _ = tx.send(Ok(server.endpoint.clone()));
                // Keep the child (and this thread) alive for the rest of the process.
                if let Some(mut c) = child {
                    let _ = c.wait();
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    let endpoint = rx
        .recv_timeout(Duration::from_secs(900))
        .map_err(|_| err("the S3 server did not start within 15 minutes"))??;
    Ok(Server { endpoint, child: None })
}

/// The cargo target directory of the running test binary (or `CARGO_TARGET_DIR`).
fn target_dir() -> Result<PathBuf, Error> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().map_err(|e| err(format!("where is this binary: {e}")))?;
    exe.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "debug" || n == "release"))
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| err(format!("{} is not under a cargo target directory", exe.display())))
}

impl Server {
    /// Install moto into `venv` if it is not there, start it on a free port of 127.0.0.1,
    /// and wait until it answers. The server dies with the thread that started it.
    pub fn start(venv: &Path) -> Result<Server, Error> {
        Server::start_with_latency(venv, Duration::ZERO)
    }

    /// [`Server::start`], every request waiting `latency` before it is handled (what a round
    /// trip to a real object store costs).
    pub fn start_with_latency(venv: &Path, latency: Duration) -> Result<Server, Error> {
        let python = ensure_moto(venv)?;
        let launcher = write_launcher(venv)?;
        let port = free_port()?;
        let mut cmd = Command::new(&python);
        cmd.env("CTXLOG_S3_LATENCY_MS", latency.as_millis().to_string());
        cmd.arg(&launcher)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| err(format!("cannot start moto ({}): {e}", launcher.display())))?;
        let server = Server {
            endpoint: format!("http://127.0.0.1:{port}"),
            child: Some(child),
        };
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if server.request("GET", "/", &[], b"").is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(err(format!("moto on port {port} did not answer within 60 s")))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Create a bucket (path-style). Creating one that exists is fine.
    pub fn create_bucket(&self, name: &str) -> Result<(), Error> {
        let status = self.request("PUT", &format!("/{name}"), &[], b"")?;
        if status == 200 || status == 409 {
            Ok(())
        } else {
            Err(err(format!("creating bucket {name}: HTTP {status}")))
        }
    }

    /// The storage options that reach this server (endpoint, region, credentials, plain
    /// HTTP), as `key=value` pairs for a URI's query string or `--storage-option`.
    pub fn storage_options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_region", REGION),
            ("aws_access_key_id", ACCESS_KEY),
            ("aws_secret_access_key", SECRET_KEY),
            ("aws_allow_http", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// `s3://bucket/path?…` with every storage option in the query string.
    pub fn uri(&self, bucket: &str, path: &str) -> String {
        let query: Vec<String> = self
            .storage_options()
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        format!("s3://{bucket}/{path}?{}", query.join("&"))
    }

    /// How many requests the server has had (those of this call excepted).
    pub fn requests(&self) -> Result<u64, Error> {
        let (status, body) = self.exchange("GET", "/_ctxlog/requests", &[], b"")?;
        if status != 200 {
            return Err(err(format!("the request count answered {status}")));
        }
        String::from_utf8_lossy(&body)
            .trim()
            .parse()
            .map_err(|_| err("the request count is not a number"))
    }

    /// One plain HTTP/1.1 request; the status code of its answer.
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<u16, Error> {
        Ok(self.exchange(method, path, headers, body)?.0)
    }

    /// One plain HTTP/1.1 request; its status code and body.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), Error> {
        let addr = self.endpoint.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).map_err(|e| err(format!("connect {addr}: {e}")))?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        s.set_write_timeout(Some(Duration::from_secs(30))).ok();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes())
            .and_then(|_| s.write_all(body))
            .map_err(|e| err(format!("send to {addr}: {e}")))?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)
            .map_err(|e| err(format!("read from {addr}: {e}")))?;
        let line = String::from_utf8_lossy(&answer);
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| err(format!("{addr} answered no HTTP status")))?;
        let body = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or_else(Vec::new, |at| answer[at + 4..].to_vec());
        Ok((status, body))
    }
}

/// The URI of a Lance store in a bucket of its own for a test's root, on the shared server
/// (started if need be), every storage option in the query. For a test's store-URI hook,
/// which cannot fail: a server that cannot start or a bucket that cannot be made panics,
/// naming what failed.
pub fn store_uri_for(root: &Path) -> String {
    let server = shared().unwrap_or_else(|e| panic!("no S3 server on loopback: {e}"));
    let bucket = bucket_for(root);
    server
        .create_bucket(&bucket)
        .unwrap_or_else(|e| panic!("creating bucket {bucket}: {e}"));
    server.uri(&bucket, "store.lance")
}

/// A bucket name for a test's root: lowercase letters, digits and hyphens, 3–63 long,
/// unique per root.
pub fn bucket_for(root: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in root.to_string_lossy().bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("ctxlog-{hash:016x}")
}

fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn free_port() -> Result<u16, Error> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| err(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| err(format!("no free port: {e}")))
}

/// On Linux, the child is killed when the thread that started it exits.
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// The launcher that starts moto's server with ranged reads served from the range alone and
/// conditional writes made atomic (see `serve.py`), written into `venv` under a name of its
/// own and renamed into place, so that a process starting the server never reads a
/// half-written file. The name is this call's (process and call number): tests that start
/// servers on several threads of one process (`cargo test`) would otherwise rename each
/// other's file away.
fn write_launcher(venv: &Path) -> Result<PathBuf, Error> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = venv.join("ctxlog-serve.py");
    let partial = venv.join(format!("ctxlog-serve.py.{}.{call}", std::process::id()));
    std::fs::write(&partial, include_str!("serve.py"))
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|e| err(format!("writing {}: {e}", path.display())))?;
    Ok(path)
}

/// The Python of `venv`, with moto installed there first if need be (one installer at a
/// time, across processes).
pub fn ensure_moto(venv: &Path) -> Result<PathBuf, Error> {
    let python = venv.join("bin").join("python3");
    let done = venv.join(".installed");
    if done.exists() {
        return Ok(python);
    }
    if let Some(parent) = venv.parent() {
        std::fs::create_dir_all(parent).map_err(|e| err(format!("create {}: {e}", parent.display())))?;
    }
    let lock = venv.with_extension("lock");
    let until = Instant::now() + Duration::from_secs(900);
    loop {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => break,
            Err(_) if done.exists() => return Ok(python),
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(250)),
            Err(e) => return Err(err(format!("waiting for another installer ({}): {e}", lock.display()))),
        }
    }
    let result = install(venv);
    if result.is_ok() {
        let _ = std::fs::write(&done, MOTO_VERSION);
    }
    let _ = std::fs::remove_file(&lock);
    result.map(|()| python)
}

fn install(venv: &Path) -> Result<(), Error> {
    let run = |cmd: &mut Command, what: &str| -> Result<(), Error> {
        let out = cmd.output().map_err(|e| {
            err(format!(
                "{what}: {e}. The S3 tests need python3 with venv (Debian: apt install python3-venv)"
            ))
        })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(err(format!(
                "{what} failed: {}. The S3 tests need python3 with venv and access to PyPI",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(venv),
        "python3 -m venv",
    )?;
    run(
        Command::new(venv.join("bin").join("pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            &format!("moto[server]=={MOTO_VERSION}"),
        ]),
        "pip install moto[server]",
    )
}
