//! The `hub` feature's download path end to end (`cargo test --features hub --test hub`): a small
//! HTTP/1.1 server on 127.0.0.1 answers what hf-hub 0.4.3's sync client asks of the Hugging Face
//! Hub's file API, and `models::pretrained` downloads from it into a temporary cache.
//!
//! What hf-hub requests for `hf:<repo>[@<revision>]/<file>` (read from its source):
//!
//! 1. metadata: `GET <endpoint>/<repo>/resolve/<revision>/<file>` with `Range: bytes=0-0`,
//!    redirects not followed. It needs `X-Repo-Commit` and `X-Linked-Etag` (else `ETag`). The
//!    hub redirects (302) files stored in LFS to a CDN: hf-hub then asks the `Location` again
//!    with `Range: bytes=0-0` and reads the size from its `Content-Range`; a small file is
//!    answered directly (206 with `Content-Range`).
//! 2. content: the same URL with `Range: bytes=0-`, following redirects.
//!
//! It writes `blobs/<etag>`, the symbolic link `snapshots/<commit>/<file>` to it and
//! `refs/<revision>` (the commit). A file already in the cache is found without any request.

#![cfg(feature = "hub")]

use rankwise::models::pretrained::{resolve_with, HubFile, HubOptions};
use rankwise::models::{ParamStore, BACKBONE_PREFIX};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COMMIT_MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const COMMIT_V2: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// One file of the served repositories.
struct Entry {
    repo: &'static str,
    /// Branch or tag; the commit itself is accepted as a revision too.
    revision: &'static str,
    commit: &'static str,
    file: &'static str,
    bytes: Vec<u8>,
    /// Stored in LFS: redirected to `/cdn/<etag>` as the hub redirects to its CDN.
    lfs: bool,
}

impl Entry {
    /// A content hash standing for the hub's etag (the sha256 of an LFS file, the git blob id
    /// of another): 64-bit FNV-1a, hex.
    fn etag(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in &self.bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// A request as received: `GET /path`, the `Range` header, and whether it carried
/// `Authorization` (`auth=<value>`).
type Log = Arc<Mutex<Vec<String>>>;

/// The local hub: serves `entries` on 127.0.0.1 (a free port) from a thread until dropped, and
/// logs every request.
struct Hub {
    addr: SocketAddr,
    log: Log,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hub {
    fn start(entries: Vec<Entry>) -> Hub {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Log::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    // One request per connection (`Connection: close`), answered in turn.
                    if let Ok(conn) = conn {
                        if let Err(e) = serve(conn, addr, &entries, &log) {
                            log.lock().unwrap().push(format!("server error: {e}"));
                        }
                    }
                }
            })
        };
        Hub {
            addr,
            log,
            stop,
            thread: Some(thread),
        }
    }

    /// The endpoint to give [`HubOptions::endpoint`] (or `HF_ENDPOINT`).
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests so far, in order.
    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop up so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request from `conn` and answers it like the hub's file API (and its CDN).
fn serve(conn: TcpStream, addr: SocketAddr, entries: &[Entry], log: &Log) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, target) = match (words.next(), words.next()) {
        (Some(m), Some(t)) => (m.to_string(), t.to_string()),
        _ => return Ok(()), // the wake-up connection of `Drop`, or garbage
    };
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    let mut entry_log = format!("{method} {target} {}", range.as_deref().unwrap_or("-"));
    if let Some(auth) = headers.get("authorization") {
        entry_log.push_str(&format!(" auth={auth}"));
    }
    log.lock().unwrap().push(entry_log);

    let mut out = conn;
    let found = |etag: &str| entries.iter().find(|e| e.etag() == etag);
    if let Some(etag) = target.strip_prefix("/cdn/") {
        // The CDN: the bytes of an LFS file, by etag, honouring `Range`.
        return match found(etag) {
            Some(e) => send_bytes(&mut out, &method, &e.bytes, range.as_deref(), &[]),
            None => send(&mut out, 404, &[], b"no such object"),
        };
    }
    // `/<owner>/<repo>/resolve/<revision>/<file>`
    let parts: Vec<&str> = target.trim_start_matches('/').splitn(5, '/').collect();
    let [owner, name, "resolve", revision, file] = parts[..] else {
        return send(&mut out, 404, &[], b"not a file URL");
    };
    let repo = format!("{owner}/{name}");
    let in_repo: Vec<&Entry> = entries.iter().filter(|e| e.repo == repo).collect();
    if in_repo.is_empty() {
        // The hub answers 401 for a repository that does not exist (or is private).
        let h = [("X-Error-Code", "RepositoryNotFound".to_string())];
        return send(&mut out, 401, &h, b"{\"error\":\"Repository not found\"}");
    }
    let at_revision: Vec<&&Entry> = in_repo
        .iter()
        .filter(|e| e.revision == revision || e.commit == revision)
        .collect();
    let Some(commit) = at_revision.first().map(|e| e.commit) else {
        let h = [("X-Error-Code", "RevisionNotFound".to_string())];
        return send(&mut out, 404, &h, b"{\"error\":\"Invalid rev id\"}");
    };
    let Some(e) = at_revision.iter().find(|e| e.file == file) else {
        let h = [
            ("X-Error-Code", "EntryNotFound".to_string()),
            ("X-Repo-Commit", commit.to_string()),
        ];
        return send(&mut out, 404, &h, b"{\"error\":\"Entry not found\"}");
    };
    let etag = e.etag();
    if e.lfs {
        let h = [
            ("X-Repo-Commit", commit.to_string()),
            ("X-Linked-Etag", format!("\"{etag}\"")),
            ("X-Linked-Size", e.bytes.len().to_string()),
            ("ETag", "\"0000git-blob-of-the-pointer-file\"".to_string()),
            ("Location", format!("http://{addr}/cdn/{etag}")),
        ];
        send(&mut out, 302, &h, b"")
    } else {
        let h = [
            ("X-Repo-Commit", commit.to_string()),
            ("ETag", format!("\"{etag}\"")),
        ];
        send_bytes(&mut out, &method, &e.bytes, range.as_deref(), &h)
    }
}

/// `bytes` whole (200) or the part that `Range: bytes=a-[b]` asks for (206, `Content-Range`).
fn send_bytes(
    out: &mut TcpStream,
    method: &str,
    bytes: &[u8],
    range: Option<&str>,
    extra: &[(&str, String)],
) -> std::io::Result<()> {
    let n = bytes.len();
    let span = range.and_then(|r| r.strip_prefix("bytes=")).map(|r| {
        let (a, b) = r.split_once('-').unwrap_or((r, ""));
        let a: usize = a.parse().unwrap_or(0).min(n);
        let b: usize = b.parse().map(|b: usize| b + 1).unwrap_or(n).clamp(a, n);
        (a, b)
    });
    let mut h = extra.to_vec();
    let (status, body) = match span {
        Some((a, b)) => {
            h.push((
                "Content-Range",
                format!("bytes {a}-{}/{n}", b.max(a + 1) - 1),
            ));
            (206, &bytes[a..b])
        }
        None => (200, bytes),
    };
    let body = if method == "HEAD" { &[][..] } else { body };
    send(out, status, &h, body)
}

fn send(
    out: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        _ => "Not Found",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}

/// The variables through which ureq (hf-hub's HTTP client) sends every request to a proxy: it
/// reads them (`try_proxy_from_env`) and not `NO_PROXY`, so a proxy set for the machine would
/// get the requests meant for 127.0.0.1.
const PROXY_VARS: [&str; 6] = [
    "ALL_PROXY",
    "all_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
];

/// Set in the child processes of [`run_in_child`].
const CHILD_MARK: &str = "RANKWISE_HUB_TEST_CHILD";

/// Runs the test `name` of this binary in a child process, with `set` added to its environment
/// and the proxy variables and `remove` taken out (the tests run in threads of one process, whose
/// environment they must not change); panics with its output unless it passed.
fn run_in_child(name: &str, set: &[(&str, &str)], remove: &[&str], ignored: bool) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--test-threads=1", "--nocapture"]);
    if ignored {
        cmd.arg("--ignored");
    }
    for v in PROXY_VARS.iter().chain(remove) {
        cmd.env_remove(v);
    }
    cmd.envs(set.iter().copied()).env(CHILD_MARK, "1");
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "the child running {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the test `name` was run again in a child process free of proxy variables (then the
/// caller returns): only when one of them is set here.
fn rerun_without_proxies(name: &str) -> bool {
    if PROXY_VARS.iter().all(|v| std::env::var_os(v).is_none()) {
        return false;
    }
    assert!(
        std::env::var_os(CHILD_MARK).is_none(),
        "proxy variables still set in the child"
    );
    run_in_child(name, &[], &[], false);
    true
}

/// A small safetensors file as a converted torchvision state dict holds it: a backbone tensor and
/// a classifier tensor (which the loader skips). `scale` makes the contents differ.
fn weights(scale: f32) -> Vec<u8> {
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let data: Vec<f32> = (0..6).map(|i| scale * i as f32).collect();
    let map = HashMap::from([
        (
            "conv1.weight".to_string(),
            Tensor::from_vec(data, (2, 3), &Device::Cpu).unwrap(),
        ),
        (
            "fc.weight".to_string(),
            Tensor::new(&[[scale, -scale]], &Device::Cpu).unwrap(),
        ),
    ]);
    candle_core::safetensors::save(&map, &path).unwrap();
    std::fs::read(&path).unwrap()
}

/// The repository `org/tiny`: `model.safetensors` (LFS) at `main` and, with other contents, at
/// the tag `v2`; `config.json` (not in LFS) at `main`.
fn tiny_repo() -> Vec<Entry> {
    vec![
        Entry {
            repo: "org/tiny",
            revision: "main",
            commit: COMMIT_MAIN,
            file: "model.safetensors",
            bytes: weights(1.0),
            lfs: true,
        },
        Entry {
            repo: "org/tiny",
            revision: "main",
            commit: COMMIT_MAIN,
            file: "config.json",
            bytes: b"{\"arch\": \"resnet18\"}\n".to_vec(),
            lfs: false,
        },
        Entry {
            repo: "org/tiny",
            revision: "v2",
            commit: COMMIT_V2,
            file: "model.safetensors",
            bytes: weights(2.0),
            lfs: true,
        },
    ]
}

fn options(hub: &Hub, cache: &Path, offline: bool) -> HubOptions {
    HubOptions {
        offline,
        endpoint: hub.url(),
        ..HubOptions::new(cache)
    }
}

fn resolve(spec: &str, options: &HubOptions) -> rankwise::Result<PathBuf> {
    resolve_with(Path::new(spec), options)
}

fn snapshot(cache: &Path, commit: &str, file: &str) -> PathBuf {
    cache
        .join("models--org--tiny")
        .join("snapshots")
        .join(commit)
        .join(file)
}

#[test]
fn download_fills_the_cache_in_the_hub_layout_and_the_file_loads() {
    if rerun_without_proxies("download_fills_the_cache_in_the_hub_layout_and_the_file_loads") {
        return;
    }
    let hub = Hub::start(tiny_repo());
    let served = weights(1.0);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub"); // does not exist yet
    let spec = "hf:org/tiny/model.safetensors";

    let path = resolve(spec, &options(&hub, &cache, false)).unwrap();
    assert_eq!(path, snapshot(&cache, COMMIT_MAIN, "model.safetensors"));
    assert_eq!(std::fs::read(&path).unwrap(), served);
    // The hub layout: refs/main names the commit, the snapshot links to the blob.
    let folder = cache.join("models--org--tiny");
    assert_eq!(
        std::fs::read_to_string(folder.join("refs").join("main")).unwrap(),
        COMMIT_MAIN
    );
    let etag = tiny_repo()[0].etag();
    let blob = folder.join("blobs").join(&etag);
    assert_eq!(std::fs::read(&blob).unwrap(), served);
    #[cfg(unix)]
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        std::fs::canonicalize(&path).unwrap(),
        std::fs::canonicalize(&blob).unwrap()
    );
    // Metadata (not following the redirect, then the CDN for the size), then the content
    // (redirect followed, `Range` kept); no token was given, so none was sent.
    let url = "/org/tiny/resolve/main/model.safetensors";
    let cdn = format!("/cdn/{etag}");
    assert_eq!(
        hub.requests(),
        [
            format!("GET {url} bytes=0-0"),
            format!("GET {cdn} bytes=0-0"),
            format!("GET {url} bytes=0-"),
            format!("GET {cdn} bytes=0-"),
        ]
    );

    // The file loads with the crate's loader: the backbone tensor assigned, `fc.*` left over.
    let store = ParamStore::new(0);
    let vb = store.var_builder(candle_core::DType::F32, &candle_core::Device::Cpu);
    vb.get((2, 3), "backbone.conv1.weight").unwrap();
    let unused = store.load_safetensors(&path, BACKBONE_PREFIX).unwrap();
    assert_eq!(unused, ["fc.weight"]);
    let loaded: Vec<f32> = store
        .get("backbone.conv1.weight")
        .unwrap()
        .as_tensor()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(loaded, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);

    // Cached now: the same path again, online or offline, without a single request.
    let before = hub.requests().len();
    for offline in [false, true] {
        assert_eq!(
            resolve(spec, &options(&hub, &cache, offline)).unwrap(),
            path
        );
    }
    let by_commit = format!("hf:org/tiny@{COMMIT_MAIN}/model.safetensors");
    assert_eq!(
        resolve(&by_commit, &options(&hub, &cache, false)).unwrap(),
        path
    );
    assert_eq!(
        HubFile::parse("org/tiny/model.safetensors")
            .unwrap()
            .cached(&cache),
        Some(path.clone())
    );
    assert_eq!(hub.requests().len(), before, "{:?}", hub.requests());
}

#[test]
fn offline_mode_resolves_cached_files_and_never_asks_the_server() {
    if rerun_without_proxies("offline_mode_resolves_cached_files_and_never_asks_the_server") {
        return;
    }
    let hub = Hub::start(tiny_repo());
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    let spec = "hf:org/tiny/model.safetensors";

    let e = resolve(spec, &options(&hub, &cache, true))
        .unwrap_err()
        .to_string();
    for part in [
        "org/tiny",
        "revision main",
        "model.safetensors",
        "HF_HUB_OFFLINE",
        &*cache.join("models--org--tiny").to_string_lossy(),
    ] {
        assert!(e.contains(part), "`{part}` not in: {e}");
    }
    assert_eq!(hub.requests(), Vec::<String>::new());
    assert!(!cache.exists(), "offline mode created the cache");

    // Downloaded once, the file resolves offline; another file of the same repository (same
    // commit, not downloaded) still does not, and nothing is asked.
    let path = resolve(spec, &options(&hub, &cache, false)).unwrap();
    let asked = hub.requests().len();
    assert_eq!(resolve(spec, &options(&hub, &cache, true)).unwrap(), path);
    let e = resolve("hf:org/tiny/config.json", &options(&hub, &cache, true))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config.json") && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
    assert_eq!(hub.requests().len(), asked);
}

#[test]
fn missing_files_revisions_and_repositories_are_clear_errors() {
    if rerun_without_proxies("missing_files_revisions_and_repositories_are_clear_errors") {
        return;
    }
    let hub = Hub::start(tiny_repo());
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    let opts = options(&hub, &cache, false);
    let cases = [
        ("hf:org/tiny/absent.safetensors", "404", "EntryNotFound"),
        (
            "hf:org/tiny@v9/model.safetensors",
            "404",
            "RevisionNotFound",
        ),
        (
            "hf:org/nothing/model.safetensors",
            "401",
            "RepositoryNotFound",
        ),
    ];
    for (spec, status, what) in cases {
        let before = hub.requests().len();
        let e = resolve(spec, &opts).unwrap_err().to_string();
        let f = HubFile::parse(spec.strip_prefix("hf:").unwrap()).unwrap();
        for part in [
            f.repo.as_str(),
            &format!("revision {}", f.revision),
            &format!("file {}", f.file),
            &*cache.to_string_lossy(),
            &hub.url(),
            status,
        ] {
            assert!(e.contains(part), "{what}: `{part}` not in: {e}");
        }
        // The hint to download it by hand keeps the revision.
        if f.revision != "main" {
            assert!(e.contains(&format!("--revision {}`", f.revision)), "{e}");
        }
        // One request: the metadata one, answered with the error.
        let asked = &hub.requests()[before..];
        assert_eq!(asked.len(), 1, "{what}: {asked:?}");
        assert!(asked[0].ends_with("bytes=0-0"), "{what}: {asked:?}");
        assert!(f.cached(&cache).is_none());
    }
    // Nothing was written for the missing files.
    let snapshots = cache.join("models--org--tiny").join("snapshots");
    assert!(!snapshots.exists(), "{}", snapshots.display());

    // An endpoint that is not an http(s) URL is named, before any request.
    let ftp = HubOptions {
        endpoint: "ftp://127.0.0.1:1".into(),
        ..HubOptions::new(&cache)
    };
    let e = resolve("hf:org/tiny/model.safetensors", &ftp)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`ftp://127.0.0.1:1`") && e.contains("HF_ENDPOINT"),
        "{e}"
    );
}

#[test]
fn other_revisions_and_files_outside_lfs_download_side_by_side() {
    if rerun_without_proxies("other_revisions_and_files_outside_lfs_download_side_by_side") {
        return;
    }
    let hub = Hub::start(tiny_repo());
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    // A trailing `/` on the endpoint is harmless.
    let opts = HubOptions {
        endpoint: format!("{}/", hub.url()),
        ..HubOptions::new(&cache)
    };

    let v2 = resolve("hf:org/tiny@v2/model.safetensors", &opts).unwrap();
    assert_eq!(v2, snapshot(&cache, COMMIT_V2, "model.safetensors"));
    assert_eq!(std::fs::read(&v2).unwrap(), weights(2.0));
    let refs = cache.join("models--org--tiny").join("refs");
    assert_eq!(std::fs::read_to_string(refs.join("v2")).unwrap(), COMMIT_V2);
    assert!(hub.requests()[0].starts_with("GET /org/tiny/resolve/v2/model.safetensors "));

    // `main`'s file is another one, next to it.
    let main = resolve("hf:org/tiny/model.safetensors", &opts).unwrap();
    assert_eq!(main, snapshot(&cache, COMMIT_MAIN, "model.safetensors"));
    assert_eq!(std::fs::read(&main).unwrap(), weights(1.0));
    assert_eq!(std::fs::read(&v2).unwrap(), weights(2.0));

    // A small file the hub serves itself (no redirect): metadata and content, one request each.
    let before = hub.requests().len();
    let config = resolve("hf:org/tiny/config.json", &opts).unwrap();
    assert_eq!(config, snapshot(&cache, COMMIT_MAIN, "config.json"));
    assert_eq!(
        std::fs::read(&config).unwrap(),
        b"{\"arch\": \"resnet18\"}\n"
    );
    let url = "/org/tiny/resolve/main/config.json";
    assert_eq!(
        hub.requests()[before..],
        [
            format!("GET {url} bytes=0-0"),
            format!("GET {url} bytes=0-")
        ]
    );
}

/// `resolve` (what a recipe's `pretrained = "hf:…"` goes through) takes the endpoint, cache and
/// token from `HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_TOKEN`: checked in a child process given
/// those variables, against a server of this one.
#[test]
fn resolve_reads_the_endpoint_cache_and_token_from_the_environment() {
    let hub = Hub::start(tiny_repo());
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("env-cache");
    let url = hub.url();
    run_in_child(
        "environment_child",
        &[
            ("HF_ENDPOINT", &url),
            ("HF_HUB_CACHE", &*cache.to_string_lossy()),
            ("HF_TOKEN", "hf_test_token"),
        ],
        &["HF_HUB_OFFLINE", "HF_HOME"],
        true,
    );
    let path = snapshot(&cache, COMMIT_MAIN, "model.safetensors");
    assert_eq!(std::fs::read(&path).unwrap(), weights(1.0));
    let requests = hub.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert!(r.ends_with(" auth=Bearer hf_test_token"), "{requests:?}");
    }
}

/// The child of [`resolve_reads_the_endpoint_cache_and_token_from_the_environment`]; does
/// nothing when run otherwise.
#[test]
#[ignore = "run by resolve_reads_the_endpoint_cache_and_token_from_the_environment"]
fn environment_child() {
    if std::env::var_os(CHILD_MARK).is_none() {
        return;
    }
    let cache = PathBuf::from(std::env::var_os("HF_HUB_CACHE").unwrap());
    let spec = Path::new("hf:org/tiny/model.safetensors");
    let path = rankwise::models::pretrained::resolve(spec).unwrap();
    assert_eq!(path, snapshot(&cache, COMMIT_MAIN, "model.safetensors"));
}
