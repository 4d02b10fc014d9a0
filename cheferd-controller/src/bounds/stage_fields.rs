//! The sizes of what a stage registers, checked before anything is kept.

/// Longest job id, user, account, host or program name a stage may register with.
pub const MAX_NAME_BYTES: usize = 256;
/// Most mountpoints a stage may register, and the longest one.
pub const MAX_MOUNTPOINTS: usize = 64;
/// Longest mountpoint, bytes.
pub const MAX_MOUNT_BYTES: usize = 4096;

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
