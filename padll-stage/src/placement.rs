//! Placement of new files on storage targets (Paul et al., paper 004 §III):
//! for a mountpoint configured for placement (`PADLL_PLACEMENT`), a call that creates a
//! file asks the control plane for its targets (Lustre OSTs) and gives them to the file
//! system before the program can write, as the paper's client library does.
//!
//! The creation is done the way `llapi_file_open_param` does it: the file is opened
//! with the program's flags plus `O_EXCL` and Lustre's "delay the layout" flags
//! ([`O_LOV_DELAY_CREATE`]), then `LL_IOC_LOV_SETSTRIPE` gives it a
//! `lov_user_md_v3` with magic `LOV_USER_MAGIC_SPECIFIC` and the chosen OST list
//! ([`layout`]), and the program gets that descriptor (Lustre clears the delay flags
//! from it at open). Anything else goes to the real call unchanged: no answer within
//! `PADLL_PLACEMENT_WAIT_MS`, a file that exists already, an open of ours that fails
//! (the real call then fails the same way, with its own `errno`). A failing ioctl (a
//! target that is down) is ignored: the file gets the default layout at its first
//! write, and `errno` is the program's. The descriptor is then followed until its
//! file's last close, whose size goes to the controller ([`crate::placed_files`]).
//!
//! Only Lustre has this interface: a configured mountpoint that `statfs` does not report
//! as Lustre ([`LL_SUPER_MAGIC`]) keeps placement off (one line at start), so other file
//! systems see no change at all. Costs nothing for other calls: the creation hooks test
//! one bit per mountpoint.

use crate::call::Target;
use crate::guard::{shielded, StageIo};
use crate::paths::Place;
use libc::{c_char, c_int, mode_t};
use padll_wire::config::Placement;
use padll_wire::control::MAX_STRIPES;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// `LOV_USER_MAGIC_SPECIFIC` (lustre_user.h): a v3 layout with an explicit OST list.
pub const LOV_USER_MAGIC_SPECIFIC: u32 = 0x0BD5_0BD0;
/// `LL_IOC_LOV_SETSTRIPE` = `_IOW('f', 154, long)` on 64-bit Linux.
pub const LL_IOC_LOV_SETSTRIPE: libc::c_ulong = 0x4008_669a;
/// `O_LOV_DELAY_CREATE_MASK` (`O_NOCTTY | FASYNC`): open without allocating objects, so
/// that the layout can still be set (the old `0100000000` bit is masked by the kernel).
pub const O_LOV_DELAY_CREATE: c_int = libc::O_NOCTTY | libc::O_ASYNC;
/// `sizeof(struct lov_user_md_v3)`: magic, pattern, `ost_id` (16), stripe size, stripe
/// count (u16), stripe offset (u16), pool name (16).
const HEADER_BYTES: usize = 48;
/// `sizeof(struct lov_user_ost_data_v1)`: `ost_id` (16), generation, index.
const OBJECT_BYTES: usize = 24;

/// Stripe count per mountpoint index; 0 = no placement there.
static STRIPES: [AtomicU32; crate::channels::MAX_MOUNTS] =
    [const { AtomicU32::new(0) }; crate::channels::MAX_MOUNTS];
/// Bit `m` set: mountpoint `m` has placement (the creation hooks' one test).
static CONFIGURED: AtomicU64 = AtomicU64::new(0);
/// `PADLL_PLACEMENT_WAIT_MS`.
static WAIT_MS: AtomicU64 = AtomicU64::new(0);

/// `LL_SUPER_MAGIC`: the `f_type` `statfs` reports for a Lustre client mount.
pub const LL_SUPER_MAGIC: libc::c_long = 0x0BD0_0BD0;

/// Turns placement on for the configured mountpoints (`names` in mount-table order)
/// that are Lustre file systems; for any other, says in one line that it stays off.
pub fn configure(names: &[String], placements: &[Placement], wait_ms: u64) {
    WAIT_MS.store(wait_ms, Ordering::Relaxed);
    for placement in placements {
        let Some(m) = names.iter().position(|n| *n == placement.mount) else {
            continue;
        };
        if let Err(why) = lustre(&placement.mount) {
            crate::log(
                padll_wire::config::LogLevel::Error,
                &format!("no placement on {}: {why}", placement.mount),
            );
            continue;
        }
        STRIPES[m].store(placement.stripes, Ordering::Relaxed);
        CONFIGURED.fetch_or(1 << m, Ordering::Release);
    }
}

/// Why placement stays off on a mountpoint.
#[derive(Debug, thiserror::Error)]
enum NotLustre {
    /// The name cannot be passed to the kernel.
    #[error("a NUL in its name")]
    Nul,
    /// `statfs` failed.
    #[error("{0}")]
    Statfs(std::io::Error),
    /// Another file system type.
    #[error("not a Lustre file system (type {0:#x})")]
    Type(libc::c_long),
}

/// Whether `mount` is a Lustre file system (the only one with this layout interface).
fn lustre(mount: &str) -> Result<(), NotLustre> {
    let path = std::ffi::CString::new(mount).map_err(|_| NotLustre::Nul)?;
    // SAFETY: a zeroed `statfs` is valid plain data; a NUL-terminated path alive across
    // the call and a valid out-pointer.
    let (found, st) = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        (libc::statfs(path.as_ptr(), &mut st), st)
    };
    if found != 0 {
        return Err(NotLustre::Statfs(std::io::Error::last_os_error()));
    }
    if st.f_type != LL_SUPER_MAGIC {
        return Err(NotLustre::Type(st.f_type));
    }
    Ok(())
}

/// The `lov_user_md_v3` (host byte order, as the ioctl takes it) that places a new
/// file's stripes on `targets`, in order: magic `LOV_USER_MAGIC_SPECIFIC`, pattern 0
/// (the default, RAID0), stripe size 0 (the file system's default), stripe count, the
/// first target as stripe offset, no pool, then one `lov_user_ost_data_v1` per stripe
/// naming its OST index. `None` for no targets or more than [`MAX_STRIPES`].
pub fn layout(targets: &[u32]) -> Option<Vec<u8>> {
    let count = u16::try_from(targets.len()).ok()?;
    if targets.is_empty() || u32::from(count) > MAX_STRIPES {
        return None;
    }
    // Stripe offsets are 16-bit: an index beyond cannot be the offset.
    let offset = u16::try_from(targets[0]).ok()?;
    let mut bytes = vec![0u8; HEADER_BYTES + OBJECT_BYTES * targets.len()];
    bytes[0..4].copy_from_slice(&LOV_USER_MAGIC_SPECIFIC.to_ne_bytes());
    // pattern (4..8), lmm_oi (8..24), stripe size (24..28): zero.
    bytes[28..30].copy_from_slice(&count.to_ne_bytes());
    bytes[30..32].copy_from_slice(&offset.to_ne_bytes());
    // pool name (32..48): empty.
    for (i, target) in targets.iter().enumerate() {
        let object = HEADER_BYTES + i * OBJECT_BYTES;
        // l_ost_oi (16 bytes) and l_ost_gen: zero.
        bytes[object + 20..object + 24].copy_from_slice(&target.to_ne_bytes());
    }
    Some(bytes)
}

/// On a creation hook's managed path: if `place` has placement and this call creates a
/// file, creates it placed and returns its descriptor (the call's result); `None`: make
/// the real call as usual. Never changes `errno` and never panics.
#[inline(always)]
pub fn create(place: Place, target: Target, flags: c_int, mode: mode_t) -> Option<c_int> {
    let Place::Managed(m) = place else {
        return None;
    };
    if CONFIGURED.load(Ordering::Acquire) & (1u64 << (m as u32 % 64)) == 0 {
        return None;
    }
    let (dirfd, path) = match target {
        Target::Path(path) => (libc::AT_FDCWD, path),
        Target::At(dirfd, path) => (dirfd, path),
        _ => return None,
    };
    create_shielded(m, dirfd, path, flags, mode)
}

/// [`create_placed`] keeping `errno`; a panic means "make the real call". Out of line
/// with its arguments in registers, so that the managed path builds nothing for it
/// before the bit test.
#[cold]
#[inline(never)]
fn create_shielded(
    m: u16,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> Option<c_int> {
    shielded(|| create_placed(m, dirfd, path, flags, mode)).flatten()
}

#[cold]
#[inline(never)]
fn create_placed(
    m: u16,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> Option<c_int> {
    let tmpfile = flags & libc::O_TMPFILE == libc::O_TMPFILE;
    if flags & libc::O_CREAT == 0 || tmpfile || path.is_null() || exists(dirfd, path) {
        return None;
    }
    let stripes = STRIPES[m as usize].load(Ordering::Relaxed);
    let mount = crate::mountpoints().get(m as usize)?.clone();
    let wait = Duration::from_millis(WAIT_MS.load(Ordering::Relaxed));
    let _io = StageIo::enter();
    let targets = crate::control::ask_placement(&mount, stripes, wait)?;
    let layout = layout(&targets[..targets.len().min(MAX_STRIPES as usize)])?;
    // SAFETY: the application's path and dirfd; a raw system call, no hook.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            dirfd,
            path,
            flags | libc::O_EXCL | O_LOV_DELAY_CREATE,
            mode as libc::c_uint,
        )
    } as c_int;
    if fd < 0 {
        // Created meanwhile by someone else, or an error the real call will report.
        return None;
    }
    // SAFETY: our new descriptor and a buffer of the layout's size, which the ioctl only
    // reads. Its outcome does not matter: without it the file has the default layout.
    unsafe { libc::ioctl(fd, LL_IOC_LOV_SETSTRIPE as _, layout.as_ptr()) };
    crate::placed_files::created(fd, m);
    Some(fd)
}

/// Whether anything (a file, a link, a dangling symlink) has that name already.
fn exists(dirfd: c_int, path: *const libc::c_char) -> bool {
    // SAFETY: a zeroed `stat` is valid plain data; the application's path and dirfd;
    // a raw system call, no hook.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let found = libc::syscall(
            libc::SYS_newfstatat,
            dirfd,
            path,
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        );
        found == 0 || *libc::__errno_location() != libc::ENOENT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected bytes, field by field at the offsets of lustre_user.h's packed
    /// `struct lov_user_md_v3` and `struct lov_user_ost_data_v1` (x86-64, little-endian).
    #[test]
    fn layout_matches_lustre_user_h_byte_for_byte() {
        let bytes = layout(&[7, 2, 0x1234]).unwrap();
        let mut expected = Vec::new();
        expected.extend_from_slice(&[0xD0, 0x0B, 0xD5, 0x0B]); // lmm_magic 0x0BD50BD0
        expected.extend_from_slice(&[0; 4]); // lmm_pattern: default (RAID0)
        expected.extend_from_slice(&[0; 16]); // lmm_oi
        expected.extend_from_slice(&[0; 4]); // lmm_stripe_size: default
        expected.extend_from_slice(&[3, 0]); // lmm_stripe_count
        expected.extend_from_slice(&[7, 0]); // lmm_stripe_offset: the first OST
        expected.extend_from_slice(&[0; 16]); // lmm_pool_name: none
        for index in [[7, 0, 0, 0], [2, 0, 0, 0], [0x34, 0x12, 0, 0]] {
            expected.extend_from_slice(&[0; 16]); // l_ost_oi
            expected.extend_from_slice(&[0; 4]); // l_ost_gen
            expected.extend_from_slice(&index); // l_ost_idx
        }
        assert_eq!(bytes.len(), 48 + 3 * 24);
        assert_eq!(bytes, expected);
        // _IOW('f', 154, long): direction write (1 << 30), size 8, type 'f', number 154.
        let ioc: libc::c_ulong = (1 << 30) | (8 << 16) | ((b'f' as libc::c_ulong) << 8) | 154;
        assert_eq!(LL_IOC_LOV_SETSTRIPE, ioc);
        assert_eq!(O_LOV_DELAY_CREATE, 0o400 | 0o20000);
    }

    #[test]
    fn layouts_out_of_range_are_not_made() {
        assert_eq!(layout(&[]), None);
        assert_eq!(layout(&vec![1; MAX_STRIPES as usize + 1]), None);
        assert_eq!(layout(&[70_000]), None);
        assert_eq!(
            layout(&vec![3; MAX_STRIPES as usize]).map(|b| b.len()),
            Some(48 + 24 * MAX_STRIPES as usize)
        );
    }
}
