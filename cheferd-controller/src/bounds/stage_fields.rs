//! The sizes of what a stage registers, checked before anything is kept, and what the
//! global controller keeps of a node's stages.

/// Longest job id, user, account, host or program name a stage may register with (the
/// stage's configuration refuses longer ones under a controller).
pub const MAX_NAME_BYTES: usize = padll_wire::config::MAX_NAME_BYTES;
/// Most mountpoints a stage may register (as many as a stage manages).
pub const MAX_MOUNTPOINTS: usize = padll_wire::channel::MAX_MOUNTS;
/// Longest mountpoint, bytes (the longest a stage manages).
pub const MAX_MOUNT_BYTES: usize = padll_wire::config::MAX_MOUNT_BYTES;

/// Most bytes of names and mountpoints ([`stage_bytes`]) the global controller keeps of
/// one node's stages and orphans together: 4096 stages (`max_stages_per_node`) of 512
/// bytes (fields within [`check_stage`] alone let a node's stages hold 5 MiB).
pub const MAX_STAGE_BYTES_PER_NODE: usize = 2 << 20;

/// The bytes of names and mountpoints a stage's record keeps.
pub fn stage_bytes(stage: &crate::proto::Stage) -> usize {
    [
        &stage.job_id,
        &stage.user,
        &stage.account,
        &stage.hostname,
        &stage.stage_name,
    ]
    .into_iter()
    .chain(&stage.mountpoints)
    .map(String::len)
    .sum()
}

/// Checks the sizes of what a stage registers (every field is kept for as long as the
/// stage runs, on the local and the global controller).
pub fn check_stage(stage: &crate::proto::Stage) -> Result<(), StageTooLarge> {
    for (what, value) in [
        ("job id", &stage.job_id),
        ("user", &stage.user),
        ("account", &stage.account),
        ("hostname", &stage.hostname),
        ("program name", &stage.stage_name),
    ] {
        if value.len() > MAX_NAME_BYTES {
            return Err(StageTooLarge::Name {
                what,
                bytes: value.len(),
            });
        }
    }
    if stage.mountpoints.len() > MAX_MOUNTPOINTS {
        return Err(StageTooLarge::Mountpoints(stage.mountpoints.len()));
    }
    if let Some(long) = stage.mountpoints.iter().find(|m| m.len() > MAX_MOUNT_BYTES) {
        return Err(StageTooLarge::Mountpoint(long.len()));
    }
    Ok(())
}

/// Whether `text` holds a control character or a line or paragraph separator: a job id
/// never does (one would forge log lines and reach an administrator's terminal).
pub fn has_control(text: &str) -> bool {
    text.chars()
        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
}

/// What of a stage [`check_stage`] found too large (its size; the bytes themselves are
/// a peer's and not echoed).
#[derive(Debug, thiserror::Error)]
pub enum StageTooLarge {
    /// A name field.
    #[error("its {what} of {bytes} bytes exceeds {MAX_NAME_BYTES}")]
    Name {
        /// Which field.
        what: &'static str,
        /// Its length.
        bytes: usize,
    },
    /// Too many mountpoints.
    #[error("{0} mountpoints exceed {MAX_MOUNTPOINTS}")]
    Mountpoints(usize),
    /// A mountpoint too long.
    #[error("a mountpoint of {0} bytes exceeds {MAX_MOUNT_BYTES}")]
    Mountpoint(usize),
}
