//! Probes what the tests drive (`has_root`: the permission check runs `ctl` as another
//! uid; `has_prometheus`, `has_promtool`: the dashboard's queries run against a real
//! Prometheus; Slurm, munge, `slurm/spank.h` and `cc`: `slurm.rs`; `systemd-analyze`:
//! the units; `has_bash`: the fail-closed tests run a job's processes from a shell;
//! `has_etcd`: `standby.rs` starts a real etcd; `has_groff`: the man pages are
//! formatted; `has_moosefs`: `end_to_end.rs` runs its jobs on a real MooseFS), see
//! `scripts/test-tools.rs`.

#[path = "../../scripts/test-tools.rs"]
mod tools;

use tools::Need::{File, Program, Root};

fn main() {
    tools::probe(&[
        Root,
        Program("setpriv"),
        Program("prometheus"),
        Program("promtool"),
        Program("slurmctld"),
        Program("slurmd"),
        Program("sbatch"),
        Program("munged"),
        Program("cc"),
        File("spank.h", "/usr/include/slurm/spank.h"),
        Program("systemd-analyze"),
        Program("bash"),
        Program("etcd"),
        Program("groff"),
        tools::MOOSEFS,
    ]);
}
