//! `ferroce install-links DIR`: symbolic links named like perftest's and rdma-core's programs
//! (`ib_write_bw`, ..., `ibv_rc_pingpong`, `rping`) pointing at the ferroce binary. Started under one
//! of those names, ferroce behaves as that program (`src/bin/ferroce.rs` looks at `argv[0]`),
//! so benchmark scripts written for the real tools run unchanged with `DIR` first in `PATH`.

use crate::apps::perf::Test;
use crate::apps::pingpong::Example;
use std::path::{Path, PathBuf};

/// Why the links could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LinksError {
    /// The path of the running program could not be found.
    #[error("cannot find this program's own path: {0}")]
    SelfPath(#[source] std::io::Error),
    /// Creating the directory or a link failed.
    #[error("{path}: {err}")]
    Io {
        /// The directory or link.
        path: PathBuf,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// A file of that name exists and is not a link to ferroce.
    #[error("{0} exists and is not a link to ferroce (use --force to replace it)")]
    Exists(PathBuf),
}

/// Every program name ferroce answers to.
pub fn program_names() -> Vec<String> {
    let mut v: Vec<String> = Test::ALL.iter().map(|t| t.program()).collect();
    v.extend(
        [Example::Rc, Example::Uc, Example::Ud, Example::Srq]
            .iter()
            .map(|e| e.program().to_string()),
    );
    v.push("rping".to_string());
    v
}

/// Make the links in `dir` (created if missing) to the running binary. A name that is already
/// a link to it is left alone; anything else under that name is an error unless `force`.
/// Returns the links, made or found.
pub fn install(dir: &Path, force: bool) -> Result<Vec<PathBuf>, LinksError> {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(LinksError::SelfPath)?;
    install_to(dir, &me, force)
}

/// [`install`] for a given target binary.
pub fn install_to(dir: &Path, target: &Path, force: bool) -> Result<Vec<PathBuf>, LinksError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| LinksError::Io { path, err }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut made = Vec::new();
    for name in program_names() {
        let link = dir.join(&name);
        if let Ok(meta) = std::fs::symlink_metadata(&link) {
            let ours = meta.file_type().is_symlink()
                && std::fs::canonicalize(&link).ok().as_deref() == Some(target);
            if ours {
                made.push(link);
                continue;
            }
            if !force {
                return Err(LinksError::Exists(link));
            }
            std::fs::remove_file(&link).map_err(io(&link))?;
        }
        std::os::unix::fs::symlink(target, &link).map_err(io(&link))?;
        made.push(link);
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_every_program_and_is_idempotent() {
        let dir = std::env::temp_dir().join(format!("ferroce-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let target = dir.join("bin-ferroce");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&target, b"#!/bin/sh\n").unwrap();
        let target = target.canonicalize().unwrap();
        let links = dir.join("links");
        let made = install_to(&links, &target, false).unwrap();
        assert_eq!(made.len(), 13);
        for name in [
            "ib_write_bw",
            "ib_send_lat",
            "ib_atomic_bw",
            "ibv_rc_pingpong",
            "rping",
        ] {
            let l = links.join(name);
            assert!(std::fs::symlink_metadata(&l)
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::canonicalize(&l).unwrap(), target);
        }
        // again: nothing to do
        assert_eq!(install_to(&links, &target, false).unwrap().len(), 13);
        // a foreign file under one of the names: refused, then replaced with --force
        std::fs::remove_file(links.join("ib_read_bw")).unwrap();
        std::fs::write(links.join("ib_read_bw"), b"not ours").unwrap();
        assert!(matches!(
            install_to(&links, &target, false),
            Err(LinksError::Exists(_))
        ));
        install_to(&links, &target, true).unwrap();
        assert_eq!(
            std::fs::canonicalize(links.join("ib_read_bw")).unwrap(),
            target
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
