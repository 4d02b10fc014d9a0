//! Records the git commit for `padll --version` (`scripts/git-commit.rs`). It probes
//! nothing of the machine: the tools the tests drive are probed by the tests' own
//! package (`tests/build.rs`).

#[path = "../scripts/git-commit.rs"]
mod git_commit;

fn main() {
    git_commit::emit();
    version_script();
}

/// The symbol versions the library defines (x86-64): old programs bind to the old
/// versions of a few glibc functions (`hooks.rs`, "Versioned entry points"), so the
/// library exports those under both of glibc's versions; the `.symver` directives there
/// need these version nodes (rust-lld takes this script beside rustc's own).
fn version_script() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    let path =
        std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("versions.map");
    std::fs::write(
        &path,
        "GLIBC_2.2.5 { };\nGLIBC_2.3 { } GLIBC_2.2.5;\nGLIBC_2.3.3 { } GLIBC_2.3;\nGLIBC_2.27 { } GLIBC_2.3.3;\n",
    )
    .expect("the version script");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        path.display()
    );
}
