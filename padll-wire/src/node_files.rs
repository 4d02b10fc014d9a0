//! The files a job keeps on a compute node, in `/dev/shm`: named here so that the stage,
//! which makes them, and whoever cleans up after a job (`cheferd demo`, a Slurm epilog's
//! documentation) agree on their names.

/// Where they live.
pub const DIRECTORY: &str = "/dev/shm";
/// Longest job id kept readable in a file name.
const MAX_NAME_JOB: usize = 64;

/// The job's shared token buckets: `/dev/shm/padll-<uid>-<job>`.
pub fn segment(uid: u32, job: &str) -> String {
    job_file("padll", uid, job)
}

/// The job's last rules: `/dev/shm/padll-rules-<uid>-<job>`.
pub fn last_rules(uid: u32, job: &str) -> String {
    job_file("padll-rules", uid, job)
}

/// `/dev/shm/<kind>-<uid>-<job>`: the job id as is when it is short and plain, else its
/// plain characters followed by a hash of the whole id (ids never collide by spelling;
/// kinds never collide either, as a uid is all digits). Never holds a NUL.
fn job_file(kind: &str, uid: u32, job: &str) -> String {
    let plain: String = job
        .chars()
        .take(MAX_NAME_JOB)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = if plain == job && !job.is_empty() && !job.starts_with('.') {
        format!("{kind}-{uid}-{job}")
    } else {
        format!("{kind}-{uid}-{plain}-{:016x}", crate::fnv1a(job.as_bytes()))
    };
    format!("{DIRECTORY}/{name}")
}
