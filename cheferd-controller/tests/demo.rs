//! The README's main command, shortened: `cheferd demo` runs its embedded controllers
//! and jobs under the stage, prints the live table and the summary, writes the plot, and
//! keeps the aggregate under `Max_R`.

#[test]
fn the_demo_runs_and_keeps_the_aggregate_under_max_r() {
    let _turn = crate::util::alone();
    // The demo looks for the stage beside itself (or in the profile's deps/).
    crate::util::stage_library();
    let out_dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(crate::util::cheferd());
    command
        .args([
            "demo",
            "--seconds",
            "8",
            "--stagger",
            "2",
            "--jobs",
            "2",
            "--max-rate",
            "3000",
        ])
        .arg("--out")
        .arg(out_dir.path());
    let output = crate::util::run_with_timeout(&mut command, std::time::Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed: {stderr}\n{stdout}");
    assert!(
        stdout.contains("job-1") && stdout.contains("job-2") && stdout.contains("mutual TLS"),
        "{stdout}"
    );
    let summary = stdout
        .split("summary")
        .nth(1)
        .unwrap_or_else(|| panic!("no summary: {stdout}"));
    assert!(
        summary.contains(" 0 of "),
        "windows above Max_R + 5 %: {summary}"
    );
    for file in ["rates.csv", "rates.png", "rates.svg"] {
        let path = out_dir.path().join(file);
        assert!(
            path.metadata().is_ok_and(|m| m.len() > 0),
            "{} not written",
            path.display()
        );
    }
}
