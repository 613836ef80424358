//! Pretrained ImageNet backbones: torchvision ResNet weights (converted to `.safetensors`, with
//! torchvision's tensor names: `conv1.weight`, `bn1.running_mean`, `layer1.0.conv1.weight`, …;
//! `fc.*` and `*.num_batches_tracked` are skipped) loaded into our [`super::ResNet`].
//!
//! A recipe names the weights with `pretrained = "…"`:
//!
//! * a local file: `pretrained = "weights/resnet50.safetensors"`;
//! * a file of a Hugging Face Hub model repository: `pretrained = "hf:timm/resnet50.tv_in1k/model.safetensors"`
//!   (`hf:<owner>/<repo>/<file>`, optionally `@<revision>` after the repository:
//!   `hf:timm/resnet50.tv_in1k@main/model.safetensors`).
//!
//! For `hf:` the local Hugging Face cache is looked up first (`$HF_HUB_CACHE`, else
//! `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, the layout `huggingface_hub` and `hf-hub`
//! write): a cached file is used without touching the network. A file not in the cache is
//! downloaded with the `hf-hub` crate when rankwise is built with the cargo feature `hub`
//! (and `HF_HUB_OFFLINE` is not set), from `$HF_ENDPOINT` (a mirror or a local server; by
//! default [`DEFAULT_ENDPOINT`]) with the token `$HF_TOKEN`, else the one in `$HF_HOME/token`
//! (`~/.cache/huggingface/token`) if any; otherwise the error names the cache folder searched
//! and how to get the file. [`resolve_with`] takes all of these settings explicitly
//! ([`HubOptions`]) instead of from the environment.
//!
//! Downloads go through `ureq`, which sends them through the proxy named by `ALL_PROXY`,
//! `HTTPS_PROXY` or `HTTP_PROXY` (any case) when one is set (an empty one too, which then fails
//! to resolve), and does not read `NO_PROXY`.

use super::{ParamStore, BACKBONE_PREFIX};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A parsed `hf:<owner>/<repo>[@revision]/<file>` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    /// `owner/repo`.
    pub repo: String,
    /// Branch, tag or commit (`main` by default).
    pub revision: String,
    /// Path of the file inside the repository.
    pub file: String,
}

impl HubFile {
    /// Parses the part after `hf:`.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(
                "pretrained",
                format!("`hf:{spec}`: {why}; expected hf:<owner>/<repo>[@revision]/<file>"),
            )
        };
        let mut parts = spec.splitn(3, '/');
        let (owner, repo, file) = match (parts.next(), parts.next(), parts.next()) {
            (Some(o), Some(r), Some(f)) if !o.is_empty() && !r.is_empty() && !f.is_empty() => {
                (o, r, f)
            }
            _ => return Err(bad("missing owner, repository or file")),
        };
        let (repo, revision) = match repo.split_once('@') {
            Some((r, rev)) if !r.is_empty() && !rev.is_empty() => (r, rev),
            Some(_) => return Err(bad("empty repository or revision around `@`")),
            None => (repo, "main"),
        };
        if file.split('/').any(|p| p.is_empty() || p == "..") {
            return Err(bad("bad file path"));
        }
        Ok(HubFile {
            repo: format!("{owner}/{repo}"),
            revision: revision.to_string(),
            file: file.to_string(),
        })
    }

    /// The repository's folder in a Hugging Face cache (`models--owner--repo`).
    pub fn cache_folder(&self, cache: &Path) -> PathBuf {
        cache.join(format!("models--{}", self.repo.replace('/', "--")))
    }

    /// The file in the cache `cache`, if there: `snapshots/<commit>/<file>`, the commit read
    /// from `refs/<revision>` (or the revision itself when it is a commit hash).
    pub fn cached(&self, cache: &Path) -> Option<PathBuf> {
        let folder = self.cache_folder(cache);
        let commit = match std::fs::read_to_string(folder.join("refs").join(&self.revision)) {
            Ok(c) => c.trim().to_string(),
            Err(_) => self.revision.clone(),
        };
        let path = folder.join("snapshots").join(commit).join(&self.file);
        path.is_file().then_some(path)
    }
}

/// The Hugging Face cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(home) = std::env::var_os("HF_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

/// The Hugging Face Hub, where `hf:` files are downloaded from unless `HF_ENDPOINT` says
/// otherwise.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Whether `HF_HUB_OFFLINE` asks never to use the network (`1`, `true`, `yes`, `on`).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

/// The hub to download from: `$HF_ENDPOINT` (the variable `huggingface_hub` and `hf-hub` read,
/// e.g. `https://hf-mirror.com`), else [`DEFAULT_ENDPOINT`]; without a trailing `/`.
pub fn hf_endpoint() -> String {
    match std::env::var("HF_ENDPOINT") {
        Ok(e) if !e.trim().is_empty() => e.trim().trim_end_matches('/').to_string(),
        _ => DEFAULT_ENDPOINT.to_string(),
    }
}

/// The access token for private or gated repositories: `$HF_TOKEN`, else the contents of
/// `$HF_HOME/token` (`~/.cache/huggingface/token`, where `huggingface-cli login` writes it);
/// `None` when neither is there or empty.
fn hf_token() -> Option<String> {
    let non_empty = |s: String| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    if let Some(t) = std::env::var("HF_TOKEN").ok().and_then(non_empty) {
        return Some(t);
    }
    let home = match std::env::var_os("HF_HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".cache")
            .join("huggingface"),
    };
    std::fs::read_to_string(home.join("token"))
        .ok()
        .and_then(non_empty)
}

/// Where `hf:` references are looked up and, when not cached, downloaded from: what
/// [`resolve`] reads from the environment ([`HubOptions::from_env`]), or given explicitly to
/// [`resolve_with`].
#[derive(Clone, PartialEq, Eq)]
pub struct HubOptions {
    /// The Hugging Face cache folder (`models--<owner>--<repo>/{refs,blobs,snapshots}`
    /// inside); downloads are written there.
    pub cache: PathBuf,
    /// Never use the network: a file that is not in `cache` is an error.
    pub offline: bool,
    /// The hub's base URL, e.g. [`DEFAULT_ENDPOINT`] or `http://127.0.0.1:8080`: files are
    /// requested from `<endpoint>/<owner>/<repo>/resolve/<revision>/<file>`. A trailing `/` is
    /// ignored.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer <token>` (needed for private or gated repositories only).
    pub token: Option<String>,
}

impl HubOptions {
    /// The cache folder `cache`, online, [`DEFAULT_ENDPOINT`], no token; nothing is read from
    /// the environment.
    pub fn new(cache: impl Into<PathBuf>) -> Self {
        HubOptions {
            cache: cache.into(),
            offline: false,
            endpoint: DEFAULT_ENDPOINT.to_string(),
            token: None,
        }
    }

    /// The options [`resolve`] uses: the cache folder [`hf_cache_dir`], offline when
    /// `HF_HUB_OFFLINE` is `1`/`true`/`yes`/`on`, the endpoint [`hf_endpoint`], the token
    /// `$HF_TOKEN`, else the one in `$HF_HOME/token` (`~/.cache/huggingface/token`).
    pub fn from_env() -> Self {
        HubOptions {
            cache: hf_cache_dir(),
            offline: offline(),
            endpoint: hf_endpoint(),
            token: hf_token(),
        }
    }
}

impl std::fmt::Debug for HubOptions {
    // By hand, so that the token never reaches a log or an error message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubOptions")
            .field("cache", &self.cache)
            .field("offline", &self.offline)
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The local file of a `pretrained` value: the path itself, or for `hf:…` the cached file,
/// downloaded first if needed and possible (see the module documentation), with the settings
/// of the environment ([`HubOptions::from_env`]).
pub fn resolve(spec: &Path) -> Result<PathBuf> {
    resolve_with(spec, &HubOptions::from_env())
}

/// [`resolve`] with an explicit cache folder and offline switch (the endpoint and token still
/// from the environment; [`resolve_with`] takes them too).
pub fn resolve_in(spec: &Path, cache: &Path, offline: bool) -> Result<PathBuf> {
    resolve_with(
        spec,
        &HubOptions {
            cache: cache.to_path_buf(),
            offline,
            endpoint: hf_endpoint(),
            token: hf_token(),
        },
    )
}

/// [`resolve`] with every setting taken from `options`: reads no environment variable (except
/// the proxy variables of a download, see the module documentation).
pub fn resolve_with(spec: &Path, options: &HubOptions) -> Result<PathBuf> {
    let Some(hub) = spec.to_str().and_then(|s| s.strip_prefix("hf:")) else {
        return Ok(spec.to_path_buf());
    };
    let file = HubFile::parse(hub)?;
    if let Some(path) = file.cached(&options.cache) {
        return Ok(path);
    }
    if options.offline {
        return Err(not_cached(
            &file,
            &options.cache,
            "offline mode is on (HF_HUB_OFFLINE)",
        ));
    }
    download(&file, options)
}

fn not_cached(file: &HubFile, cache: &Path, why: &str) -> Error {
    Error::invalid(
        "pretrained",
        format!(
            "`hf:{}` (revision {}, file {}) is not in the Hugging Face cache {} and {why}; \
             download it there (e.g. `huggingface-cli download {} {}{}`) or give a local \
             .safetensors path",
            file.repo,
            file.revision,
            file.file,
            file.cache_folder(cache).display(),
            file.repo,
            file.file,
            if file.revision == "main" {
                String::new()
            } else {
                format!(" --revision {}", file.revision)
            },
        ),
    )
}

#[cfg(not(feature = "hub"))]
fn download(file: &HubFile, options: &HubOptions) -> Result<PathBuf> {
    Err(not_cached(
        file,
        &options.cache,
        "this build cannot download (rebuild with `--features hub`)",
    ))
}

#[cfg(feature = "hub")]
fn download(file: &HubFile, options: &HubOptions) -> Result<PathBuf> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};
    let endpoint = options.endpoint.trim().trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(not_cached(
            file,
            &options.cache,
            &format!(
                "the hub endpoint `{}` (HF_ENDPOINT) is not an http:// or https:// URL",
                options.endpoint
            ),
        ));
    }
    // `from_cache`, not `from_env`: endpoint, cache and token are all set here, so that nothing
    // comes from the environment (hf-hub's `from_env` reads `HF_ENDPOINT` and `HF_HOME`, and
    // panics when it finds no home folder).
    let api = ApiBuilder::from_cache(Cache::new(options.cache.clone()))
        .with_endpoint(endpoint.to_string())
        .with_token(options.token.clone())
        .with_progress(false)
        .build()
        .map_err(|e| Error::invalid("pretrained", format!("cannot start the hub client: {e}")))?;
    let repo = api.repo(Repo::with_revision(
        file.repo.clone(),
        RepoType::Model,
        file.revision.clone(),
    ));
    repo.get(&file.file).map_err(|e| {
        not_cached(
            file,
            &options.cache,
            &format!(
                "downloading it from {endpoint} failed ({e}); set HF_HUB_OFFLINE=1 to fail \
                 without trying"
            ),
        )
    })
}

/// Loads pretrained backbone weights named by `spec` (a path or `hf:…`) into the variables of
/// `params` under [`BACKBONE_PREFIX`]; returns the tensors of the file that were not used
/// (`fc.*`, `*.num_batches_tracked`). Errors name the file and the missing or mis-shaped
/// tensor ([`ParamStore::load_safetensors`]).
pub fn load_backbone(params: &ParamStore, spec: &Path) -> Result<Vec<String>> {
    let path = resolve(spec)?;
    if !path.is_file() {
        // The recipes name weights that must be prepared by hand; the bare I/O error would not
        // say what the file is for or how to do without it.
        return Err(Error::file(
            &path,
            "pretrained weights not found: prepare them as the recipe's `# Needs:` says, or \
             train from random initialisation with `--set pretrained=`",
        ));
    }
    params.load_safetensors(&path, BACKBONE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_references_parse() {
        let f = HubFile::parse("timm/resnet50.tv_in1k/model.safetensors").unwrap();
        assert_eq!(f.repo, "timm/resnet50.tv_in1k");
        assert_eq!(f.revision, "main");
        assert_eq!(f.file, "model.safetensors");
        let f = HubFile::parse("a/b@v1.0/sub/w.safetensors").unwrap();
        assert_eq!((f.repo.as_str(), f.revision.as_str()), ("a/b", "v1.0"));
        assert_eq!(f.file, "sub/w.safetensors");
        for bad in ["a/b", "a", "/b/c", "a/b@/c", "a/b/../x"] {
            assert!(HubFile::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            f.cache_folder(Path::new("/c")),
            PathBuf::from("/c/models--a--b")
        );
    }
}
