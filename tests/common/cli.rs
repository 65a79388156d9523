//! Running the `ferroce` binary, and the program names it installs, as a user does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Run `prog` with `args` and no standard input: its exit status (-1 if a signal ended it),
/// standard output and standard error.
pub fn run(prog: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `ferroce` binary under test.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ferroce"))
}

/// Run `ferroce ARGS` (see [`run`]).
pub fn ferroce(args: &[&str]) -> (i32, String, String) {
    run(bin(), args)
}

/// A fresh directory (per test file `tag`, test and process) with every program name
/// `ferroce install-links` makes (`ib_write_bw`, `ibv_rc_pingpong`, `rping`, ...).
pub fn links(tag: &str, test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferroce-{tag}-{test}-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let (code, _, err) = ferroce(&["install-links", &dir_arg]);
    assert_eq!(code, 0, "ferroce install-links: {err}");
    dir
}
