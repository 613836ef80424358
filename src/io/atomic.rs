//! Files written so that a reader never sees half of one: the output checks a long job runs
//! before it starts ([`check_output_file`], [`check_output_dir`]) and the atomic write every
//! result, table, figure and run folder goes through ([`write_atomically`]).

use crate::error::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Checks, before any work, that a file can be written at `path` as [`write_atomically`] will:
/// its folder exists, is a folder and takes a new file, and `path` is not a folder. Errors name
/// the path, so a long job does not fail at its very end on a mistyped output name.
pub fn check_output_file(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::file(path, "is a folder, not a file name"));
    }
    let dir = parent_dir(path);
    if !dir.is_dir() {
        return Err(Error::file(
            path,
            format!(
                "cannot write here: the folder {} does not exist (create it first)",
                dir.display()
            ),
        ));
    }
    probe_writable(dir)
}

/// Checks, before any work, that the folder `dir` exists or can be created: `dir` is not a file,
/// and its nearest existing ancestor is a folder that takes a new file.
pub fn check_output_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::file(dir, "exists and is not a folder"));
    }
    let mut existing = dir;
    while !existing.exists() && existing != Path::new(".") {
        existing = parent_dir(existing);
    }
    if !existing.is_dir() {
        return Err(Error::file(
            dir,
            format!("cannot create it: {} is not a folder", existing.display()),
        ));
    }
    probe_writable(existing)
}

/// The folder a file at `path` goes in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Creates and removes a temporary file in `dir`: the only portable test that a file can be made
/// there (permission bits do not tell about read-only mounts or ACLs).
fn probe_writable(dir: &Path) -> Result<()> {
    tempfile::Builder::new()
        .prefix(".rankwise-probe.")
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| Error::file(dir, format!("cannot write in this folder: {e}")))
}

/// Writes a file atomically: `write` fills a temporary file in the same folder, which is flushed
/// to disk and then renamed over `path`. Readers never see a half-written file, and a failure
/// leaves any previous `path` untouched (the temporary file is removed).
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .ok_or_else(|| Error::file(path, "not a file name"))?
        .to_string_lossy();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        // tempfile creates 0600 files; a results file should get the usual permissions (the
        // process umask still applies).
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let tmp = builder.tempfile_in(dir).map_err(|e| Error::io(dir, e))?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file());
        write(&mut w).map_err(|e| Error::io(path, e))?;
        w.flush().map_err(|e| Error::io(path, e))?;
    }
    tmp.as_file().sync_all().map_err(|e| Error::io(path, e))?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_files_and_cleans_up_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.txt");
        write_atomically(&p, |w| w.write_all(b"first")).unwrap();
        write_atomically(&p, |w| w.write_all(b"second")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second");
        let e = write_atomically(&p, |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(e.is_err());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temporary file left behind: {names:?}");
        let e = write_atomically(&dir.path().join("no/such/dir/x"), |w| w.write_all(b"x"));
        assert!(e.unwrap_err().to_string().contains("no/such/dir"));
    }
}
