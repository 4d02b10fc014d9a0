//! The job's last rules on this node (fail closed): every rule set a stage of the job
//! receives from the controller is kept in the job's rules file — `rules-<job>` in the
//! uid's own directory `/dev/shm/padll/<uid>/` when a root component made it, else
//! `/dev/shm/padll-rules-<uid>-<job>` (`padll_wire::node_files`) — and a process of the
//! job that starts while the controller gives it none applies them.
//!
//! The file outlives the job's processes (a batch script's steps run one after
//! another, and the controller may be down between them), so it is left for the
//! epilog, like the segment of a job whose last process was killed. A job `padll run`
//! named `run-<pid>` cannot recur: its last process on the node removes the file
//! when it leaves the job's segment ([`Passing`]). Written `0600`
//! under a temporary name and renamed into place, so a reader never sees half a file;
//! read only if it is a regular file owned by this uid that no one else can write, of at
//! most [`MAX_LAST_RULES_BYTES`], and decoded with [`LastRules::decode`]. In the uid's
//! directory no other user can put anything; flat in `/dev/shm` (world-writable) another
//! user can plant a file under the name, but not make it used: the stage then falls
//! back to the default limit and says why.

use padll_wire::channel::ChannelSpec;
use padll_wire::control::{LastRules, MAX_LAST_RULES_BYTES};
use std::ffi::{CStr, CString};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};

/// Why the job's last rules cannot be kept or used: the file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct RulesFileError {
    /// The file's path.
    pub path: String,
    /// What is wrong.
    pub kind: RulesFileErrorKind,
}

/// What is wrong with the job's last rules file (see [`RulesFileError`]).
#[derive(Debug, thiserror::Error)]
pub enum RulesFileErrorKind {
    /// Its temporary file cannot be created.
    #[error("cannot create: {0}")]
    Create(std::io::Error),
    /// Another user's file holds the temporary name.
    #[error("cannot create: a file of another owner is in the way")]
    InTheWay,
    /// Writing it failed.
    #[error("cannot write: {0}")]
    Write(std::io::Error),
    /// Renaming it into place failed.
    #[error("cannot replace it: {0}")]
    Replace(std::io::Error),
    /// It exists but cannot be opened.
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    /// Its metadata cannot be read.
    #[error("cannot stat: {0}")]
    Stat(std::io::Error),
    /// Not a file only the job's user can use: anyone could have put rules in it.
    #[error(transparent)]
    NotPrivate(#[from] crate::shared::NotPrivate),
    /// Reading it failed.
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    /// Its contents are not rules.
    #[error(transparent)]
    Decode(padll_wire::control::LastRulesError),
}

/// Where the job's last rules are kept now.
fn path(uid: u32, job: &str) -> CString {
    CString::new(padll_wire::node_files::last_rules(uid, job)).expect("no NUL in a job file's name")
}

/// The last rules of a job that cannot recur, for its last process on the node to
/// remove wherever they were kept: flat, or in the uid's directory (which a root
/// component may have made after this process started).
pub struct Passing {
    uid: u32,
    flat: CString,
    private_name: CString,
}

impl Passing {
    /// The rules of `job` of `uid`.
    pub fn new(uid: u32, job: &str) -> Passing {
        let c = |name: String| CString::new(name).expect("no NUL in a job file's name");
        Passing {
            uid,
            flat: c(padll_wire::node_files::flat_job_files(uid, job).last_rules),
            private_name: c(padll_wire::node_files::private_rules_name(job)),
        }
    }

    /// Removes the rules. Raw system calls only and no allocation: it may run in
    /// `_exit`, in a signal handler.
    pub fn remove(&self) {
        // SAFETY: a NUL-terminated path alive across the call; a raw call, no hook.
        unsafe { libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, self.flat.as_ptr(), 0) };
        // Only once the directory is checked: nothing but its owner and root can change it.
        if let Some(dir) = padll_wire::node_files::UserDirectory::open(self.uid) {
            // SAFETY: as above, in the opened directory.
            unsafe { libc::syscall(libc::SYS_unlinkat, dir.fd(), self.private_name.as_ptr(), 0) };
        }
    }
}

/// Keeps `rules` as the job's last rules (replacing the previous ones at once).
pub fn save(uid: u32, job: &str, rules: &[ChannelSpec]) -> Result<(), RulesFileError> {
    let path = path(uid, job);
    // `+` never appears in a job file's name, so no job's file is ever this one.
    let mut staged = path.as_bytes().to_vec();
    staged.extend_from_slice(format!("+{}", std::process::id()).as_bytes());
    let staged = CString::new(staged).expect("no NUL in a job file's name");
    let error = |kind| RulesFileError {
        path: path.to_string_lossy().into_owned(),
        kind,
    };
    let mut file = create_private(&staged).map_err(error)?;
    let written = file
        .write_all(LastRules::encode(rules).as_bytes())
        .map_err(|e| error(RulesFileErrorKind::Write(e)));
    drop(file);
    let renamed = written.and_then(|()| {
        // SAFETY: NUL-terminated paths alive across the call.
        if unsafe { libc::rename(staged.as_ptr(), path.as_ptr()) } == 0 {
            Ok(())
        } else {
            Err(error(RulesFileErrorKind::Replace(
                std::io::Error::last_os_error(),
            )))
        }
    });
    if renamed.is_err() {
        // SAFETY: as above.
        unsafe { libc::unlink(staged.as_ptr()) };
    }
    renamed
}

/// A new file only we can read or write, at `path`; one left there by a process of
/// ours with the same pid that was killed between create and rename is replaced.
fn create_private(path: &CStr) -> Result<std::fs::File, RulesFileErrorKind> {
    for _ in 0..2 {
        // SAFETY: NUL-terminated path; a new file (O_EXCL), never through a symlink.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor we just opened and own.
            return Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EEXIST) {
            return Err(RulesFileErrorKind::Create(error));
        }
        // SAFETY: NUL-terminated path. In the sticky /dev/shm only our own file goes.
        unsafe { libc::unlink(path.as_ptr()) };
    }
    Err(RulesFileErrorKind::InTheWay)
}

/// The job's last rules, `None` if it has none here.
pub fn load(uid: u32, job: &str) -> Result<Option<Vec<ChannelSpec>>, RulesFileError> {
    let path = path(uid, job);
    let error = |kind| RulesFileError {
        path: path.to_string_lossy().into_owned(),
        kind,
    };
    // SAFETY: NUL-terminated path; O_NONBLOCK so a FIFO planted here cannot hang us.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        let os_error = std::io::Error::last_os_error();
        return match os_error.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(error(RulesFileErrorKind::Open(os_error))),
        };
    }
    // SAFETY: a descriptor we just opened and own.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let meta = file
        .metadata()
        .map_err(|e| error(RulesFileErrorKind::Stat(e)))?;
    use std::os::unix::fs::MetadataExt;
    crate::shared::check_private(meta.mode(), meta.uid(), uid).map_err(|e| error(e.into()))?;
    let mut bytes = Vec::new();
    file.take(MAX_LAST_RULES_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error(RulesFileErrorKind::Read(e)))?;
    LastRules::decode(&bytes)
        .map(Some)
        .map_err(|e| error(RulesFileErrorKind::Decode(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use padll_wire::channel::{Costs, Scope, Unit};
    use padll_wire::ops::{Class, Op};
    use std::os::unix::fs::PermissionsExt;

    /// A job id of this test process alone, and its file removed at the end.
    struct Job(String);

    impl Job {
        fn new(name: &str) -> Job {
            Job(format!("test-{name}-{}", std::process::id()))
        }
        fn path(&self) -> String {
            path(uid(), &self.0).into_string().unwrap()
        }
    }

    impl Drop for Job {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.path());
        }
    }

    fn uid() -> u32 {
        // SAFETY: geteuid takes no arguments and cannot fail.
        unsafe { libc::geteuid() }
    }

    fn rule(rate: u64) -> ChannelSpec {
        ChannelSpec {
            mount: Some("/scratch".into()),
            scope: Scope::Class(Class::Metadata),
            rate,
            unit: Unit::Requests,
            burst: 3,
            costs: Default::default(),
        }
    }

    #[test]
    fn saved_rules_are_loaded_and_replaced() {
        let job = Job::new("saved");
        assert_eq!(load(uid(), &job.0).unwrap(), None);
        save(uid(), &job.0, &[rule(300)]).unwrap();
        assert_eq!(load(uid(), &job.0).unwrap(), Some(vec![rule(300)]));
        // A weighted rule keeps its costs.
        let weighted = ChannelSpec {
            costs: Costs::new([(Op::Open, 3000), (Op::Close, 0), (Op::Getattr, 500)]).unwrap(),
            ..rule(100)
        };
        save(uid(), &job.0, &[rule(200), weighted.clone()]).unwrap();
        assert_eq!(
            load(uid(), &job.0).unwrap(),
            Some(vec![rule(200), weighted])
        );
        save(uid(), &job.0, &[]).unwrap();
        assert_eq!(load(uid(), &job.0).unwrap(), Some(vec![]));
        let meta = std::fs::metadata(job.path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Nothing staged is left behind.
        let staged = format!("{}+{}", job.path(), std::process::id());
        assert!(!std::path::Path::new(&staged).exists());
    }

    #[test]
    fn planted_or_malformed_files_are_refused() {
        let job = Job::new("planted");
        let path = job.path();
        let error = |why: &str| {
            let e = load(uid(), &job.0).unwrap_err().to_string();
            assert!(e.starts_with(&path) && e.contains(why), "{e}");
        };
        std::fs::write(&path, LastRules::encode(&[rule(300)])).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        error("mode 644 lets others in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "{\"version\":1,\"rules\":[{\"rate\":0}]}").unwrap();
        error("malformed");
        std::fs::write(&path, vec![b' '; MAX_LAST_RULES_BYTES + 1]).unwrap();
        error("exceeds");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        error("cannot open");
        std::fs::remove_file(&path).unwrap();
        let c_path = CString::new(path.clone()).unwrap();
        // SAFETY: a NUL-terminated path alive across the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // A FIFO without a writer must not hang the load.
        error("not a regular file");
        // Saving over anything of ours replaces it.
        save(uid(), &job.0, &[rule(7)]).unwrap();
        assert_eq!(load(uid(), &job.0).unwrap(), Some(vec![rule(7)]));
        // Another owner's file is never used (only root can make one here).
        if uid() == 0 {
            // SAFETY: a NUL-terminated path alive across the call.
            assert_eq!(unsafe { libc::chown(c_path.as_ptr(), 65534, 65534) }, 0);
            error("owned by uid 65534");
        }
    }
}
