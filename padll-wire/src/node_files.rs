//! The files a job keeps on a compute node, in `/dev/shm`: named here so that the stage,
//! which makes them, the root components that make their directory (the local
//! controller, the SPANK plugin) and whoever cleans up after a job agree on them.
//!
//! **Where.** `/dev/shm` is writable by everyone: anyone may create a job's file name
//! there before the job does. So a job's files go in its user's own directory,
//! `/dev/shm/padll/<uid>/` (the uid's, `0700`), inside `/dev/shm/padll/` (root's, not
//! writable by others), both made by a root component ([`prepare_user_directory`]).
//! Only root can create, rename or remove an entry of `/dev/shm/padll/` (and, `/dev/shm`
//! being sticky, `/dev/shm/padll` itself), so once a process has checked the two
//! directories ([`UserDirectory::open`]: opened without following a symlink, checked on
//! the opened descriptors) no other uid can put anything on the path of its files.
//! Without them — no root component on the node, e.g. a laptop — the files are flat in
//! `/dev/shm` (`padll-<uid>-<job>`), where another user can occupy the names first: the
//! stage refuses a planted file (owner and mode are checked) and says so.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Where they live.
pub const DIRECTORY: &str = "/dev/shm";
/// Root's directory of the per-uid directories.
pub const NODE_DIRECTORY: &str = "/dev/shm/padll";
/// [`NODE_DIRECTORY`]'s name in [`DIRECTORY`].
const NODE_DIRECTORY_NAME: &str = "padll";
/// Search only for others: a listing would tell which users have jobs on the node.
const NODE_DIRECTORY_MODE: u32 = 0o711;
const USER_DIRECTORY_MODE: u32 = 0o700;
/// Longest job id kept readable in a file name.
const MAX_NAME_JOB: usize = 64;
/// How many times [`prepare_user_directory`] makes a name anew after clearing what
/// occupied it, before it gives up on someone replacing it as fast.
const PREPARE_ATTEMPTS: usize = 4;

/// A job's files on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobFiles {
    /// Its shared token buckets.
    pub segment: String,
    /// Its last rules.
    pub last_rules: String,
}

/// The job's files: in the uid's own directory if it can be trusted now
/// ([`UserDirectory::open`]), else flat in `/dev/shm`.
pub fn job_files(uid: u32, job: &str) -> JobFiles {
    if UserDirectory::open(uid).is_some() {
        private_job_files(uid, job)
    } else {
        flat_job_files(uid, job)
    }
}

/// The job's files in `/dev/shm/padll/<uid>/`: `segment-<job>` and `rules-<job>`.
pub fn private_job_files(uid: u32, job: &str) -> JobFiles {
    JobFiles {
        segment: format!("{NODE_DIRECTORY}/{uid}/{}", job_file("segment", job)),
        last_rules: format!("{NODE_DIRECTORY}/{uid}/{}", private_rules_name(job)),
    }
}

/// The name of the job's last rules in its user's directory.
pub fn private_rules_name(job: &str) -> String {
    job_file("rules", job)
}

/// Both places the job's files may be (flat, and in the uid's directory): a stage
/// that started before the directory was made, or of an earlier release, kept them
/// flat. For whoever removes a job's files.
pub fn both_places(uid: u32, job: &str) -> [JobFiles; 2] {
    [flat_job_files(uid, job), private_job_files(uid, job)]
}

/// The job's files flat in `/dev/shm`: `padll-<uid>-<job>` and `padll-rules-<uid>-<job>`.
pub fn flat_job_files(uid: u32, job: &str) -> JobFiles {
    JobFiles {
        segment: format!("{DIRECTORY}/{}", job_file(&format!("padll-{uid}"), job)),
        last_rules: format!(
            "{DIRECTORY}/{}",
            job_file(&format!("padll-rules-{uid}"), job)
        ),
    }
}

/// The job's shared token buckets ([`job_files`]).
pub fn segment(uid: u32, job: &str) -> String {
    job_files(uid, job).segment
}

/// The job's last rules ([`job_files`]).
pub fn last_rules(uid: u32, job: &str) -> String {
    job_files(uid, job).last_rules
}

/// `<prefix>-<job>`: the job id as is when it is short and plain, else its plain
/// characters followed by a hash of the whole id (ids never collide by spelling;
/// prefixes never collide either: a flat one ends with the uid, all digits). Never holds
/// a NUL, a `/` or a `+` (a rules file being written is `<name>+<pid>`).
fn job_file(prefix: &str, job: &str) -> String {
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
    if plain == job && !job.is_empty() && !job.starts_with('.') {
        format!("{prefix}-{job}")
    } else {
        format!("{prefix}-{plain}-{:016x}", crate::fnv1a(job.as_bytes()))
    }
}

/// A uid's own directory, `/dev/shm/padll/<uid>/`, opened (`O_PATH`) once it can be
/// trusted: `/dev/shm/padll` a directory of root's that no one else may write, and in it
/// a directory of the uid's that no one else may use, neither of them a symlink. Raw
/// system calls only and no allocation, so a process can check it anywhere, in a signal
/// handler too, and the stage's own hooks never see these calls.
#[derive(Debug)]
pub struct UserDirectory {
    fd: i32,
}

impl UserDirectory {
    /// The uid's directory, if it can be trusted now.
    pub fn open(uid: u32) -> Option<UserDirectory> {
        Self::open_in(c"/dev/shm/padll", uid)
    }

    /// [`Self::open`] with `node_directory` for `/dev/shm/padll`.
    fn open_in(node_directory: &CStr, uid: u32) -> Option<UserDirectory> {
        let parent = UserDirectory {
            fd: open_path(libc::AT_FDCWD, node_directory)?,
        };
        let trusted = fstat_raw(parent.fd)
            .is_some_and(|st| is_directory(&st) && st.st_uid == 0 && st.st_mode & 0o022 == 0);
        if !trusted {
            return None;
        }
        let mut digits = [0u8; 11];
        let dir = UserDirectory {
            fd: open_path(parent.fd, decimal(uid, &mut digits))?,
        };
        fstat_raw(dir.fd)
            .is_some_and(|st| is_directory(&st) && st.st_uid == uid && st.st_mode & 0o077 == 0)
            .then_some(dir)
    }

    /// The opened directory, for `*at` calls.
    pub fn fd(&self) -> i32 {
        self.fd
    }
}

impl Drop for UserDirectory {
    fn drop(&mut self) {
        // SAFETY: our own descriptor; a raw call, no hook.
        unsafe { libc::syscall(libc::SYS_close, self.fd) };
    }
}

/// `name` under `dir`, opened `O_PATH` as a directory and never through a symlink.
fn open_path(dir: i32, name: &CStr) -> Option<i32> {
    // SAFETY: a NUL-terminated name alive across the call; a raw call, no hook.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            dir,
            name.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    (fd >= 0).then_some(fd as i32)
}

fn fstat_raw(fd: i32) -> Option<libc::stat> {
    // SAFETY: an all-zero `stat` is valid plain data and `st` a valid out-pointer of the
    // kernel's `struct stat`; a raw call, no hook.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::syscall(libc::SYS_fstat, fd, &mut st) == 0).then_some(st)
    }
}

fn is_directory(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// `n` in decimal, NUL-terminated, in `buffer`.
fn decimal(mut n: u32, buffer: &mut [u8; 11]) -> &CStr {
    let mut start = buffer.len() - 1;
    buffer[start] = 0;
    loop {
        start -= 1;
        buffer[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    CStr::from_bytes_with_nul(&buffer[start..]).expect("digits and one NUL")
}

/// Why a root component could not make the job files' directories.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct PrepareError {
    /// The directory at fault.
    pub path: String,
    /// What is wrong.
    pub kind: PrepareErrorKind,
}

/// What is wrong (see [`PrepareError`]).
#[derive(Debug, thiserror::Error)]
pub enum PrepareErrorKind {
    /// It cannot be opened.
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    /// `/dev/shm` itself is not root's: nothing in it can be trusted.
    #[error("owned by uid {0}, not by root")]
    NotRoots(u32),
    /// It cannot be made.
    #[error("cannot create: {0}")]
    Create(std::io::Error),
    /// Something of another user's occupies the name and cannot be cleared away.
    #[error("cannot clear away what occupies the name: {0}")]
    Clear(std::io::Error),
    /// Its owner or mode cannot be set.
    #[error("cannot set its owner and mode: {0}")]
    Own(std::io::Error),
    /// Whatever is cleared away comes back at once.
    #[error("something keeps taking the name ({PREPARE_ATTEMPTS} tries)")]
    KeepsChanging,
}

/// Something that occupied a directory's name and was cleared away, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleared {
    /// The name it occupied.
    pub path: String,
    /// Its owner.
    pub owner: u32,
    /// Where a directory was moved to (a file, symlink… is removed: `None`).
    pub moved_to: Option<String>,
}

impl std::fmt::Display for Cleared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was occupied by uid {}: ", self.path, self.owner)?;
        match &self.moved_to {
            Some(to) => write!(f, "moved to {to}"),
            None => write!(f, "removed"),
        }
    }
}

/// Makes `/dev/shm/padll` (root's, `0711`), for root components: the local controller
/// at start. Returns what occupied the name and was cleared away.
pub fn prepare_node_directory() -> Result<Vec<Cleared>, PrepareError> {
    prepare_in(Path::new(DIRECTORY), None)
}

/// Makes `/dev/shm/padll/<uid>` (the uid's and `gid`'s, `0700`) and its parent, for
/// root components: the local controller when a stage of `uid` says hello, the SPANK
/// plugin before a job's tasks start. Returns what occupied the names and was cleared
/// away: a file, symlink or FIFO is removed, another user's directory moved aside
/// whole (`<name>.squatted-by-<uid>-<inode>-<random>`: never walked into as root).
pub fn prepare_user_directory(uid: u32, gid: u32) -> Result<Vec<Cleared>, PrepareError> {
    prepare_in(Path::new(DIRECTORY), Some((uid, gid)))
}

/// [`prepare_user_directory`] (or the parent only) with `shm` for `/dev/shm`.
fn prepare_in(shm: &Path, user: Option<(u32, u32)>) -> Result<Vec<Cleared>, PrepareError> {
    let shm_path = shm.display().to_string();
    let error = |kind| PrepareError {
        path: shm_path.clone(),
        kind,
    };
    let c_shm = CString::new(shm.as_os_str().as_encoded_bytes())
        .map_err(|e| error(PrepareErrorKind::Open(e.into())))?;
    // `/dev/shm` may be a symlink of root's (`/run/shm` on older systems): followed.
    let shm_fd =
        open_directory(libc::AT_FDCWD, &c_shm, 0).map_err(|e| error(PrepareErrorKind::Open(e)))?;
    let owner = fstat(&shm_fd)
        .map_err(|e| error(PrepareErrorKind::Open(e)))?
        .st_uid;
    if owner != 0 {
        return Err(error(PrepareErrorKind::NotRoots(owner)));
    }
    let mut cleared = Vec::new();
    let node = Entry {
        parent: &shm_fd,
        parent_path: &shm_path,
        name: NODE_DIRECTORY_NAME,
    }
    .make_directory(0, 0, NODE_DIRECTORY_MODE, &mut cleared)?;
    if let Some((uid, gid)) = user {
        Entry {
            parent: &node,
            parent_path: &format!("{shm_path}/{NODE_DIRECTORY_NAME}"),
            name: &uid.to_string(),
        }
        .make_directory(uid, gid, USER_DIRECTORY_MODE, &mut cleared)?;
    }
    Ok(cleared)
}

/// A name in an opened directory.
struct Entry<'a> {
    parent: &'a OwnedFd,
    parent_path: &'a str,
    name: &'a str,
}

impl Entry<'_> {
    /// Makes this name a directory of `owner`:`group` with `mode`. One that exists is
    /// kept if root's or `owner`'s (only root makes entries here, so either was made by
    /// root) and given that owner and mode; anything else is cleared away and the name
    /// made anew. Every change goes through the opened directory's descriptor: nothing
    /// is followed.
    fn make_directory(
        &self,
        owner: u32,
        group: u32,
        mode: u32,
        cleared: &mut Vec<Cleared>,
    ) -> Result<OwnedFd, PrepareError> {
        let path = format!("{}/{}", self.parent_path, self.name);
        let error = |kind| PrepareError {
            path: path.clone(),
            kind,
        };
        let name =
            CString::new(self.name).map_err(|e| error(PrepareErrorKind::Create(e.into())))?;
        let parent = self.parent.as_raw_fd();
        for _ in 0..PREPARE_ATTEMPTS {
            // SAFETY: a NUL-terminated name alive across the call.
            if unsafe { libc::mkdirat(parent, name.as_ptr(), mode) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(error(PrepareErrorKind::Create(e)));
                }
            }
            let dir = match open_directory(parent, &name, libc::O_NOFOLLOW) {
                Ok(dir) => dir,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
                    // A file, symlink, FIFO…: unlinking a symlink removes the link only.
                    let occupant = lstat_at(parent, &name).map_or(u32::MAX, |st| st.st_uid);
                    // SAFETY: a NUL-terminated name alive across the call.
                    if unsafe { libc::unlinkat(parent, name.as_ptr(), 0) } != 0 {
                        let e = std::io::Error::last_os_error();
                        if e.raw_os_error() != Some(libc::ENOENT) {
                            return Err(error(PrepareErrorKind::Clear(e)));
                        }
                    }
                    cleared.push(Cleared {
                        path: path.clone(),
                        owner: occupant,
                        moved_to: None,
                    });
                    continue;
                }
                Err(e) => return Err(error(PrepareErrorKind::Open(e))),
            };
            let st = fstat(&dir).map_err(|e| error(PrepareErrorKind::Open(e)))?;
            if st.st_uid == 0 || st.st_uid == owner {
                own(&dir, &st, owner, group, mode).map_err(|e| error(PrepareErrorKind::Own(e)))?;
                return Ok(dir);
            }
            let aside = self
                .move_aside(&name, &st)
                .map_err(|e| error(PrepareErrorKind::Clear(e)))?;
            cleared.push(Cleared {
                path: path.clone(),
                owner: st.st_uid,
                moved_to: Some(format!("{}/{aside}", self.parent_path)),
            });
        }
        Err(error(PrepareErrorKind::KeepsChanging))
    }

    /// Renames the directory at `name` (another user's, `st`) aside, never replacing
    /// anything; returns its new name.
    fn move_aside(&self, name: &CStr, st: &libc::stat) -> std::io::Result<String> {
        let parent = self.parent.as_raw_fd();
        let mut attempts = 0;
        loop {
            let aside = aside_name(self.name, st);
            let c_aside = CString::new(aside.as_str()).expect("no NUL in a number");
            // SAFETY: NUL-terminated names alive across the call.
            let moved = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    parent,
                    name.as_ptr(),
                    parent,
                    c_aside.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if moved == 0 {
                return Ok(aside);
            }
            let e = std::io::Error::last_os_error();
            attempts += 1;
            // EEXIST: 64 random bits taken already, by chance alone.
            if e.raw_os_error() != Some(libc::EEXIST) || attempts == PREPARE_ATTEMPTS {
                return Err(e);
            }
        }
    }
}

/// A name for another user's directory moved aside that its owner cannot have made
/// beforehand (a known name, taken first, would make the move fail and the root
/// component give up): `<name>.squatted-by-<uid>-<inode>-<64 random bits>`.
fn aside_name(name: &str, st: &libc::stat) -> String {
    let mut random = [0u8; 8];
    // SAFETY: a buffer of the length given, alive across the call.
    let filled = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    if filled != random.len() as isize {
        // No kernel randomness (never on Linux ≥ 3.17 once booted): the clock's
        // nanoseconds, which a squatter cannot see in advance either.
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        random = ((now.tv_sec as u64) << 30 ^ now.tv_nsec as u64).to_le_bytes();
    }
    format!(
        "{name}.squatted-by-{}-{}-{:016x}",
        st.st_uid,
        st.st_ino,
        u64::from_le_bytes(random)
    )
}

/// Gives the opened directory `owner`:`group` and `mode` where it differs.
fn own(dir: &OwnedFd, st: &libc::stat, owner: u32, group: u32, mode: u32) -> std::io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: our own descriptor.
    if (st.st_uid != owner || st.st_gid != group) && unsafe { libc::fchown(fd, owner, group) } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if st.st_mode & 0o7777 != mode && unsafe { libc::fchmod(fd, mode) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `name` under `dir` opened as a directory, with `flags` added.
fn open_directory(dir: i32, name: &CStr, flags: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name alive across the call.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | flags,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is valid plain data; `st` is a valid out-pointer.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) == 0 {
            Ok(st)
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// `name` under `dir`, not followed if a symlink.
fn lstat_at(dir: i32, name: &CStr) -> Option<libc::stat> {
    // SAFETY: as in `fstat`, with a NUL-terminated name alive across the call.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0).then_some(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;

    #[test]
    fn names_keep_plain_ids_and_hash_the_rest() {
        assert_eq!(
            private_job_files(1000, "42"),
            JobFiles {
                segment: "/dev/shm/padll/1000/segment-42".into(),
                last_rules: "/dev/shm/padll/1000/rules-42".into(),
            }
        );
        assert_eq!(
            flat_job_files(1000, "42"),
            JobFiles {
                segment: "/dev/shm/padll-1000-42".into(),
                last_rules: "/dev/shm/padll-rules-1000-42".into(),
            }
        );
        for job in ["../x", "a/b", ".hidden", "", "a+b", &"x".repeat(65)] {
            let name = job_file("rules", job);
            assert!(
                name.len() < 100 && !name.contains(['/', '+', '\0']),
                "{job}: {name}"
            );
            assert_ne!(name, job_file("rules", &format!("{job}_")), "{job}");
        }
        let mut digits = [0u8; 11];
        for n in [0, 7, 65534, u32::MAX] {
            assert_eq!(decimal(n, &mut digits).to_str().unwrap(), n.to_string());
        }
    }

    /// Only root can give files away (and these tests make root's directories).
    fn is_root() -> bool {
        // SAFETY: geteuid takes no arguments and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// A stand-in for `/dev/shm` (root's, sticky, writable by all), removed at the end.
    struct Shm(PathBuf);

    impl Shm {
        fn new(name: &str) -> Shm {
            let path =
                std::env::temp_dir().join(format!("padll-shm-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir(&path).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o1777)).unwrap();
            Shm(path)
        }
        fn node(&self) -> PathBuf {
            self.0.join(NODE_DIRECTORY_NAME)
        }
        fn trusted(&self, uid: u32) -> bool {
            let node = CString::new(self.node().to_str().unwrap()).unwrap();
            UserDirectory::open_in(&node, uid).is_some()
        }
    }

    impl Drop for Shm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn chown(path: &Path, uid: u32) {
        std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
    }

    fn mode(path: &Path) -> (u32, u32) {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (meta.uid(), meta.mode() & 0o7777)
    }

    #[test]
    fn the_user_directory_is_made_owned_and_trusted() {
        if !is_root() {
            eprintln!("skipped: needs root to give a directory away");
            return;
        }
        let shm = Shm::new("made");
        assert!(!shm.trusted(1000), "nothing made yet");
        assert_eq!(prepare_in(&shm.0, Some((1000, 1001))).unwrap(), vec![]);
        let user = shm.node().join("1000");
        assert_eq!(mode(&shm.node()), (0, 0o711));
        assert_eq!(mode(&user), (1000, 0o700));
        assert_eq!(std::fs::metadata(&user).unwrap().gid(), 1001);
        assert!(shm.trusted(1000));
        assert!(!shm.trusted(1001), "another uid's directory is not");
        // Again: nothing to do. A mode the user loosened is tightened back.
        std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!shm.trusted(1000), "open to others: not trusted");
        assert_eq!(prepare_in(&shm.0, Some((1000, 1001))).unwrap(), vec![]);
        assert_eq!(mode(&user), (1000, 0o700));
        assert!(shm.trusted(1000));
        // A parent others may write is not trusted, nor one that is not root's.
        std::fs::set_permissions(shm.node(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!shm.trusted(1000));
        assert_eq!(prepare_node_in(&shm), vec![]);
        assert_eq!(mode(&shm.node()), (0, 0o711));
        assert!(shm.trusted(1000));
    }

    fn prepare_node_in(shm: &Shm) -> Vec<Cleared> {
        prepare_in(&shm.0, None).unwrap()
    }

    #[test]
    fn what_squats_the_names_is_cleared_away() {
        if !is_root() {
            eprintln!("skipped: needs root to plant another user's files");
            return;
        }
        let squatter = 65534;
        // A file, a symlink (to a directory the user could use) and a FIFO of another
        // user's at /dev/shm/padll are removed; its directory is moved aside, untouched.
        let shm = Shm::new("squat");
        let node = shm.node();
        let target = shm.0.join("target");
        std::fs::create_dir(&target).unwrap();
        let plant = |what: &str, p: &Path| match what {
            "file" => std::fs::write(p, vec![0; 4096]).unwrap(),
            "symlink" => std::os::unix::fs::symlink(&target, p).unwrap(),
            "fifo" => {
                let c = CString::new(p.to_str().unwrap()).unwrap();
                // SAFETY: a NUL-terminated path alive across the call.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
            }
            _ => {
                std::fs::create_dir(p).unwrap();
                std::fs::create_dir(p.join("1000")).unwrap();
                std::os::unix::fs::symlink("/etc", p.join("1000").join("segment-42")).unwrap();
                chown(&p.join("1000"), squatter);
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
            }
        };
        for what in ["file", "symlink", "fifo", "directory"] {
            plant(what, &node);
            chown(&node, squatter);
            assert!(!shm.trusted(1000), "{what}");
            let cleared = prepare_in(&shm.0, Some((1000, 1000))).unwrap();
            assert_eq!(cleared.len(), 1, "{what}: {cleared:?}");
            assert_eq!(cleared[0].owner, squatter, "{what}");
            assert_eq!(mode(&node), (0, 0o711), "{what}");
            assert_eq!(mode(&node.join("1000")), (1000, 0o700), "{what}");
            assert!(shm.trusted(1000), "{what}");
            assert_eq!(std::fs::read_dir(&node).unwrap().count(), 1, "{what}");
            match &cleared[0].moved_to {
                Some(aside) => {
                    assert_eq!(what, "directory");
                    let aside = Path::new(aside);
                    assert!(
                        cleared[0].to_string().contains("moved to"),
                        "{}",
                        cleared[0]
                    );
                    // Moved whole, its contents never touched or followed.
                    assert_eq!(mode(&aside.join("1000")).0, squatter);
                    assert!(aside.join("1000/segment-42").is_symlink());
                }
                None => assert!(target.is_dir(), "{what}: the link's target stays"),
            }
            std::fs::remove_dir_all(&node).unwrap();
        }
        // Inside root's directory only root makes entries, but an entry of another user
        // (e.g. from a world-writable parent since tightened) is cleared too.
        prepare_node_in(&shm);
        std::fs::write(node.join("1000"), "").unwrap();
        chown(&node.join("1000"), squatter);
        let cleared = prepare_in(&shm.0, Some((1000, 1000))).unwrap();
        assert_eq!(cleared.len(), 1, "{cleared:?}");
        assert!(shm.trusted(1000));
    }

    /// The name another user's directory is moved to cannot be taken beforehand: a
    /// squatter who knows its uid and the directory's inode made the old name (and
    /// those with a counter) first, and the move failed, so root components gave up.
    #[test]
    fn the_name_a_squatters_directory_is_moved_to_cannot_be_taken_first() {
        if !is_root() {
            eprintln!("skipped: needs root to plant another user's directory");
            return;
        }
        let squatter = 65534;
        let shm = Shm::new("aside");
        let node = shm.node();
        std::fs::create_dir(&node).unwrap();
        chown(&node, squatter);
        let inode = std::fs::metadata(&node).unwrap().ino();
        let known = format!("padll.squatted-by-{squatter}-{inode}");
        for taken in [known.clone(), format!("{known}-0"), format!("{known}-1")] {
            std::fs::create_dir(shm.0.join(&taken)).unwrap();
            chown(&shm.0.join(taken), squatter);
        }
        let cleared = prepare_in(&shm.0, Some((1000, 1000))).unwrap();
        assert_eq!(cleared.len(), 1, "{cleared:?}");
        let aside = cleared[0].moved_to.as_deref().expect("moved aside");
        assert!(aside.contains(&format!("{known}-")), "{aside}");
        assert_eq!(mode(Path::new(aside)).0, squatter);
        assert_eq!(mode(&node), (0, 0o711));
        assert!(shm.trusted(1000));
    }

    #[test]
    fn a_shm_that_is_not_roots_is_refused() {
        if !is_root() {
            eprintln!("skipped: needs root to give a directory away");
            return;
        }
        let shm = Shm::new("foreign");
        chown(&shm.0, 65534);
        let error = prepare_in(&shm.0, Some((1000, 1000))).unwrap_err();
        assert!(
            matches!(error.kind, PrepareErrorKind::NotRoots(65534)),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .ends_with("owned by uid 65534, not by root"),
            "{error}"
        );
        assert!(!shm.node().exists());
    }
}
