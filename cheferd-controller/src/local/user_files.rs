//! Each user's directory for its jobs' files, `/dev/shm/padll/<uid>/`
//! (`padll_wire::node_files`): the local controller makes it before a stage of that
//! user gets its first rules, so that the job's shared buckets and last rules live where
//! no other user can occupy their names. Without the privilege (a controller run by an
//! ordinary user), jobs keep their files flat in `/dev/shm`, as the stage decides.

use super::PEER_LOG;
use crate::limited_warn;
use padll_wire::node_files;
use tracing::{info, warn};

/// Whether this controller can make users' directories (it made the node's at start).
pub(super) struct UserDirectories {
    enabled: bool,
}

impl UserDirectories {
    /// Makes `/dev/shm/padll`, logging what occupied it; disabled when that fails.
    pub(super) fn prepare() -> UserDirectories {
        match node_files::prepare_node_directory() {
            Ok(cleared) => {
                cleared.iter().for_each(|c| warn!("{c}"));
                info!(
                    directory = node_files::NODE_DIRECTORY,
                    "jobs keep their files in their users' directories"
                );
                UserDirectories { enabled: true }
            }
            Err(e) => {
                warn!("{e}: jobs keep their files flat in /dev/shm, where another user can occupy their names");
                UserDirectories { enabled: false }
            }
        }
    }

    /// Makes none: a test's controller leaves the node's `/dev/shm` alone.
    #[cfg(test)]
    pub(super) fn disabled() -> UserDirectories {
        UserDirectories { enabled: false }
    }

    /// Makes `uid`'s directory (a blocking call: a few system calls on a tmpfs).
    pub(super) fn prepare_for(&self, uid: u32, gid: u32) {
        if !self.enabled {
            return;
        }
        match node_files::prepare_user_directory(uid, gid) {
            Ok(cleared) => cleared.iter().for_each(|c| limited_warn!(PEER_LOG, "{c}")),
            Err(e) => limited_warn!(
                PEER_LOG,
                "{e}: uid {uid}'s jobs keep their files flat in /dev/shm"
            ),
        }
    }
}
