//! The ABI against rdma-core itself: every structure size and field offset the library uses,
//! compiled from the system's `<infiniband/verbs.h>` (libibverbs-dev), and every exported
//! symbol's version against Debian's own libibverbs.so.1.

mod common;
use common::*;
use std::collections::HashMap;
use std::process::Command;

/// Compile a C program printing each fact's expression against `includes`, and compare.
fn check_facts(facts: &[(&str, usize)], includes: &str) {
    let mut c = format!("{includes}#include <stddef.h>\n#include <stdio.h>\nint main(void) {{\n");
    for (name, _) in facts {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({name}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!(
        "ferroce-layout-{}-{}",
        std::process::id(),
        facts.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("l.c"), &c).unwrap();
    let st = Command::new("cc")
        .args(["-o", "l", "l.c"])
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "the layout program does not compile:\n{c}");
    let out = Command::new(dir.join("l")).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let vals: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(vals.len(), facts.len());
    let bad: Vec<String> = facts
        .iter()
        .zip(&vals)
        .filter(|((_, ours), c)| ours != *c)
        .map(|((n, ours), c)| format!("{n}: ours {ours}, rdma-core {c}"))
        .collect();
    assert!(bad.is_empty(), "layout differs:\n{}", bad.join("\n"));
}

#[test]
fn struct_layouts_match_the_rdma_core_headers() {
    let t = "struct_layouts_match_the_rdma_core_headers";
    if !have(
        std::path::Path::new("/usr/include/infiniband/verbs.h").exists() && which("cc"),
        t,
        "a C compiler and <infiniband/verbs.h> (libibverbs-dev)",
    ) {
        return;
    }
    let mut facts = ferroce_cabi::abi::layout_facts();
    facts.extend(ferroce_cabi::abi::ex_layout_facts());
    check_facts(&facts, "#include <infiniband/verbs.h>\n");
    assert!(facts.len() > 150, "only {} facts", facts.len());
}

#[test]
fn librdmacm_layouts_match_the_rdma_core_headers() {
    let t = "librdmacm_layouts_match_the_rdma_core_headers";
    if !have(
        std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists() && which("cc"),
        t,
        "a C compiler and <rdma/rdma_cma.h> (librdmacm-dev)",
    ) {
        return;
    }
    let mut facts = ferroce_cabi::abi::rdmacm_layout_facts();
    // Every event number this library writes, against the header's enum.
    for (t, name) in ferroce_cabi::rdmacm::EVENT_NAMES {
        facts.push((name, ferroce_cabi::rdmacm::event_code(t) as usize));
    }
    check_facts(
        &facts,
        "#include <rdma/rdma_cma.h>\n#include <infiniband/sa.h>\n",
    );
    assert!(facts.len() > 100, "only {} facts", facts.len());
}

/// `objdump -T`: defined dynamic symbols → their default version.
fn versions(lib: &std::path::Path) -> HashMap<String, String> {
    versions_of(lib, "IBVERBS")
}

/// `objdump -T`: defined dynamic symbols whose version starts with `prefix` → that version.
fn versions_of(lib: &std::path::Path, prefix: &str) -> HashMap<String, String> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*") && (l.contains(" DF ") || l.contains(" DO ")))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (v, s) = (f[f.len() - 2], f[f.len() - 1]);
            (!v.starts_with('(') && v.starts_with(prefix) && v != s)
                .then(|| (s.to_string(), v.to_string()))
        })
        .collect()
}

#[test]
fn every_symbol_has_rdma_cores_version_and_the_soname() {
    let t = "every_symbol_has_rdma_cores_version_and_the_soname";
    let real = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    if !have(which("objdump"), t, "objdump (binutils)")
        || !have(real.exists(), t, "Debian's libibverbs.so.1 (libibverbs1)")
    {
        return;
    }
    let ours_path = lib_dir().join("libibverbs.so.1");
    let (ours, theirs) = (versions(&ours_path), versions(real));
    assert!(ours.len() > 100, "{} symbols exported", ours.len());
    for (s, v) in &ours {
        assert_eq!(theirs.get(s), Some(v), "{s}: ours {v}");
    }
    // And every name rdma-core's library defines, public and provider-internal, is ours too
    // (a library built against a later libibverbs than the programs below, libfabric's for
    // one, imports calls none of them does: ibv_is_fork_initialized, ibv_reg_dmabuf_mr).
    let mut missing: Vec<String> = theirs
        .iter()
        .filter(|(s, _)| !ours.contains_key(*s))
        .map(|(s, v)| format!("{s}@{v}"))
        .collect();
    missing.sort();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // Everything Debian's RDMA programs and the libraries they load import is there.
    let dyn_ = Command::new("objdump")
        .arg("-p")
        .arg(&ours_path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&dyn_.stdout).contains("SONAME               libibverbs.so.1"));
    let mut wanted = Vec::new();
    for b in [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ib_write_bw",
        "ib_send_lat",
    ] {
        let Ok(p) = which_path(b) else { continue };
        wanted.push(p);
    }
    for l in [
        "/usr/lib/x86_64-linux-gnu/librdmacm.so.1",
        "/usr/lib/x86_64-linux-gnu/libmlx5.so.1",
        "/usr/lib/x86_64-linux-gnu/libefa.so.1",
        "/usr/lib/x86_64-linux-gnu/libfabric.so.1",
    ] {
        if std::path::Path::new(l).exists() {
            wanted.push(l.into());
        }
    }
    for f in &wanted {
        let out = Command::new("objdump").arg("-T").arg(f).output().unwrap();
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            if !l.contains("*UND*") || !l.contains("(IBVERBS") {
                continue;
            }
            let fs: Vec<&str> = l.split_whitespace().collect();
            let (v, s) = (fs[fs.len() - 2].trim_matches(['(', ')']), fs[fs.len() - 1]);
            assert_eq!(
                ours.get(s).map(String::as_str),
                Some(v),
                "{} imports {s}@{v}",
                f
            );
        }
    }
}

fn which_path(p: &str) -> Result<String, ()> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {p}")])
        .output()
        .map_err(|_| ())?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !s.is_empty() {
        Ok(s)
    } else {
        Err(())
    }
}

#[test]
fn librdmacm_has_rdma_cores_symbols_versions_and_soname() {
    let t = "librdmacm_has_rdma_cores_symbols_versions_and_soname";
    let real = std::path::Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    if !have(which("objdump"), t, "objdump (binutils)")
        || !have(real.exists(), t, "Debian's librdmacm.so.1 (librdmacm1)")
    {
        return;
    }
    let ours_path = lib_dir().join("librdmacm.so.1");
    let (ours, theirs) = (
        versions_of(&ours_path, "RDMACM"),
        versions_of(real, "RDMACM"),
    );
    // The same names, each in the same version node.
    assert_eq!(ours, theirs);
    let dyn_ = Command::new("objdump")
        .arg("-p")
        .arg(&ours_path)
        .output()
        .unwrap();
    let p = String::from_utf8_lossy(&dyn_.stdout);
    assert!(p.contains("SONAME               librdmacm.so.1"), "{p}");
    assert!(p.contains("NEEDED               libibverbs.so.1"), "{p}");
    // Every function it forwards to is exported by ferroce's libibverbs.so.1.
    let fwd = versions_of(&lib_dir().join("libibverbs.so.1"), "FERROCE_RDMACM");
    for s in ours.keys() {
        if s != "rpoll" && s != "rselect" {
            assert!(fwd.contains_key(&format!("ferroce_{s}")), "ferroce_{s}");
        }
    }
}
