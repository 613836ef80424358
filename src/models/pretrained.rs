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
//! (and `HF_HUB_OFFLINE` is not set); otherwise the error names the cache folder searched and
//! how to get the file.

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

/// Whether `HF_HUB_OFFLINE` asks never to use the network (`1`, `true`, `yes`, `on`).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

/// The local file of a `pretrained` value: the path itself, or for `hf:…` the cached file,
/// downloaded first if needed and possible (see the module documentation).
pub fn resolve(spec: &Path) -> Result<PathBuf> {
    resolve_in(spec, &hf_cache_dir(), offline())
}

/// [`resolve`] with an explicit cache folder and offline switch (instead of the environment).
pub fn resolve_in(spec: &Path, cache: &Path, offline: bool) -> Result<PathBuf> {
    let Some(hub) = spec.to_str().and_then(|s| s.strip_prefix("hf:")) else {
        return Ok(spec.to_path_buf());
    };
    let file = HubFile::parse(hub)?;
    if let Some(path) = file.cached(cache) {
        return Ok(path);
    }
    if offline {
        return Err(not_cached(&file, cache, "HF_HUB_OFFLINE is set"));
    }
    download(&file, cache)
}

fn not_cached(file: &HubFile, cache: &Path, why: &str) -> Error {
    Error::invalid(
        "pretrained",
        format!(
            "`hf:{}` (revision {}, file {}) is not in the Hugging Face cache {} and {why}; \
             download it there (e.g. `huggingface-cli download {} {}`) or give a local \
             .safetensors path",
            file.repo,
            file.revision,
            file.file,
            file.cache_folder(cache).display(),
            file.repo,
            file.file
        ),
    )
}

#[cfg(not(feature = "hub"))]
fn download(file: &HubFile, cache: &Path) -> Result<PathBuf> {
    Err(not_cached(
        file,
        cache,
        "this build cannot download (rebuild with `--features hub`)",
    ))
}

#[cfg(feature = "hub")]
fn download(file: &HubFile, cache: &Path) -> Result<PathBuf> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Repo, RepoType};
    let api = ApiBuilder::from_env()
        .with_cache_dir(cache.to_path_buf())
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
            cache,
            &format!("downloading it failed ({e}); set HF_HUB_OFFLINE=1 to fail without trying"),
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
