//! Mountpoint differentiation (PADLL paper §III-A): deciding, without touching the
//! file system, whether a path lies under a registered mountpoint.
//!
//! Paths are resolved lexically: `.`/`..` and repeated slashes are folded, relative
//! paths are joined to a base (the current directory or a directory descriptor).
//! Symbolic links inside a path are not followed (documented limitation); mountpoints
//! are registered both as given and as their canonical path, so a link on the way to
//! the mountpoint itself (`/scratch -> /lustre/scratch`) is handled.

/// Longest path the stage resolves; longer paths pass through unmanaged.
pub const PATH_CAPACITY: usize = libc::PATH_MAX as usize;
// The configuration refuses a mountpoint longer than the stage can hold.
const _: () = assert!(padll_wire::config::MAX_MOUNT_BYTES <= PATH_CAPACITY);

/// Where a path lies relative to the registered mountpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Neither under a mountpoint nor above one: nothing reachable from here is managed
    /// without `..`.
    Unrelated,
    /// A proper ancestor of some mountpoint (`/` for `/scratch`): relative paths from
    /// here may descend into a mountpoint.
    Ancestor,
    /// Under (or equal to) the mountpoint with this index.
    Managed(u16),
}

impl Place {
    /// Compact encoding for atomics: 0 = unrelated, 1 = ancestor, 2+i = mountpoint i.
    pub const fn encode(self) -> u16 {
        match self {
            Place::Unrelated => 0,
            Place::Ancestor => 1,
            Place::Managed(i) => i + 2,
        }
    }

    /// Inverse of [`Place::encode`].
    pub const fn decode(code: u16) -> Place {
        match code {
            0 => Place::Unrelated,
            1 => Place::Ancestor,
            i => Place::Managed(i - 2),
        }
    }
}

/// Why a mountpoint cannot be registered: the mountpoint at fault.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A relative path.
    #[error("mountpoint {} is not an absolute path", padll_wire::quote(.0))]
    NotAbsolute(String),
    /// Longer than a path the stage can hold.
    #[error("mountpoint {} is too long", padll_wire::quote(.0))]
    TooLong(String),
    /// More mountpoints than a table entry can number.
    #[error("too many mountpoints ({0})")]
    TooMany(usize),
}

/// The registered mountpoints, normalised, each with the index the rest of the stage
/// uses for it (several spellings of one mountpoint share an index).
#[derive(Clone, Debug, Default)]
pub struct MountTable {
    /// (normalised absolute path without trailing slash, mountpoint index).
    entries: Vec<(Vec<u8>, u16)>,
    /// The mountpoints as configured, by index.
    names: Vec<String>,
    /// Some mountpoint lies inside another.
    nested: bool,
    /// Which second-and-third-byte pairs a path under or above a mountpoint can start
    /// with (hashed, see [`pair_bit`]); `None` when `/` itself is a mountpoint.
    pairs: Option<[u64; PAIR_WORDS]>,
    /// The first bytes of every mountpoint, for [`MountTable::quick_absolute`].
    prefixes: Prefixes,
    /// [`WIDE`] when the CPU has AVX2, else 0: how [`MountTable::quick_absolute`] scans
    /// paths ([`scan_head`]). Chosen once, when the table is built.
    wide_scan: usize,
}

/// Most mountpoint spellings [`Prefixes`] holds one by one; beyond that one entry
/// matching every path sends them all to the full comparison.
const PREFIXES: usize = 8;

/// The longest spelling [`MountTable::quick_absolute`] compares whole: three 16-byte
/// compares at most, in straight-line code (a loop for longer ones made every path
/// hook keep more registers).
const QUICK_LENGTH: usize = 48;

/// The first (up to) 16 bytes of each mountpoint spelling, compared with a path's first
/// 16 bytes in one vector compare each: a path lies under or above a mountpoint only if
/// the two agree on their first min(len, 16) bytes. Before that, one byte: a path whose
/// second byte (after the `/`) no mountpoint has there is neither. A spelling longer
/// than 16 bytes (up to [`QUICK_LENGTH`]) is compared on its last 16 bytes too
/// ([`Prefixes::tails`]), and one longer than 32 on its second 16 ([`Prefixes::mids`]).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
struct Prefixes {
    bytes: [[u8; 16]; PREFIXES],
    /// Bit i set: byte i of the prefix must match (bits below min(len, 16)).
    need: [u32; PREFIXES],
    /// The spelling's length if [`MountTable::quick_absolute`] can compare all of it
    /// (at most [`QUICK_LENGTH`] bytes), else 0; also 0 for `/`.
    len: [usize; PREFIXES],
    /// Bit `min(len, 16) − 1` (0 when `len` is): among a path's first 16 bytes, the
    /// last a path needs to hold the spelling's first 16.
    end_bit: [u32; PREFIXES],
    /// A spelling of 17 to [`QUICK_LENGTH`] bytes: its last 16 bytes (else zeros), and
    /// whether it has them.
    tails: [[u8; 16]; PREFIXES],
    long: [bool; PREFIXES],
    /// A spelling of 33 to [`QUICK_LENGTH`] bytes: its bytes 16 to 31 (else zeros).
    mids: [[u8; 16]; PREFIXES],
    /// Every other spelling differs from this one within its own first min(len, 16)
    /// bytes: a path that agrees with this one on its first 16 bytes is neither under
    /// nor above any other.
    alone: [bool; PREFIXES],
    /// Its mountpoint index.
    index: [u16; PREFIXES],
    count: usize,
    /// `near[b]`: some mountpoint spelling has `b` as its second byte (all are set when
    /// `/` itself is one), or `b` is the NUL ending the path `/` (above everything).
    near: [bool; 256],
}

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes::EMPTY
    }
}

impl Prefixes {
    const EMPTY: Prefixes = Prefixes {
        bytes: [[0; 16]; PREFIXES],
        need: [0; PREFIXES],
        len: [0; PREFIXES],
        end_bit: [0; PREFIXES],
        tails: [[0; 16]; PREFIXES],
        long: [false; PREFIXES],
        mids: [[0; 16]; PREFIXES],
        alone: [false; PREFIXES],
        index: [0; PREFIXES],
        count: 0,
        near: [false; 256],
    };

    fn new(mounts: &[(Vec<u8>, u16)]) -> Prefixes {
        let mut prefixes = Prefixes::EMPTY;
        prefixes.near[0] = true;
        for (mount, _) in mounts {
            match mount.get(1) {
                Some(&second) => prefixes.near[second as usize] = true,
                None => prefixes.near = [true; 256],
            }
        }
        if mounts.len() > PREFIXES {
            // need = 0: every path is a candidate.
            prefixes.count = 1;
            return prefixes;
        }
        for (i, (mount, index)) in mounts.iter().enumerate() {
            let n = mount.len().min(16);
            prefixes.bytes[i][..n].copy_from_slice(&mount[..n]);
            prefixes.need[i] = (1u32 << n) - 1;
            // "/" (length 1) and spellings too long to hold are left to the full
            // comparison.
            if (2..=QUICK_LENGTH).contains(&mount.len()) {
                prefixes.len[i] = mount.len();
                prefixes.end_bit[i] = 1 << (n - 1);
                if mount.len() > 16 {
                    prefixes.tails[i].copy_from_slice(&mount[mount.len() - 16..]);
                    prefixes.long[i] = true;
                }
                if mount.len() > 32 {
                    prefixes.mids[i].copy_from_slice(&mount[16..32]);
                }
                prefixes.alone[i] = mounts.iter().enumerate().all(|(j, (other, _))| {
                    let n = other.len().min(16);
                    j == i || mount.get(..n) != other.get(..n)
                });
            }
            prefixes.index[i] = *index;
        }
        prefixes.count = mounts.len();
        prefixes
    }
}

/// Words of the [`MountTable`] pair filter (1024 bits).
const PAIR_WORDS: usize = 16;

/// The filter bit of a path whose bytes 1 and 2 are `second` and `third`. Collisions
/// only send a path to the exact comparison.
#[inline(always)]
fn pair_bit(second: u8, third: u8) -> usize {
    (second as usize * 31 + third as usize) % (PAIR_WORDS * 64)
}

impl MountTable {
    /// A table with no mountpoint.
    pub const EMPTY: MountTable = MountTable {
        entries: Vec::new(),
        names: Vec::new(),
        nested: false,
        pairs: None,
        prefixes: Prefixes::EMPTY,
        wide_scan: 0,
    };

    /// Builds the table from configured mountpoints. Each must be absolute; its
    /// canonical form (symlinks resolved) is registered too when it differs.
    pub fn new(mounts: &[String]) -> Result<MountTable, MountError> {
        let mut table = MountTable::default();
        for mount in mounts {
            if !mount.starts_with('/') {
                return Err(MountError::NotAbsolute(mount.clone()));
            }
            let mut buf = PathBuffer::new();
            if !buf.push_normalized(mount.as_bytes()) {
                return Err(MountError::TooLong(mount.clone()));
            }
            let index = u16::try_from(table.names.len())
                .ok()
                .filter(|i| *i < u16::MAX - 2)
                .ok_or(MountError::TooMany(mounts.len()))?;
            table.names.push(mount.clone());
            table.insert(buf.as_bytes().to_vec(), index);
            if let Ok(canonical) = std::fs::canonicalize(mount) {
                let mut canon_buf = PathBuffer::new();
                if canon_buf.push_normalized(canonical.as_os_str().as_encoded_bytes()) {
                    table.insert(canon_buf.as_bytes().to_vec(), index);
                }
            }
        }
        // Longest first, so nested mountpoints resolve to the innermost one.
        table
            .entries
            .sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        table.nested = table.entries.iter().any(|(inner, i)| {
            table
                .entries
                .iter()
                .any(|(outer, j)| i != j && is_within(inner, outer))
        });
        table.pairs = table.pair_filter();
        table.prefixes = Prefixes::new(&table.entries);
        table.wide_scan = if has_avx2() { WIDE } else { 0 };
        Ok(table)
    }

    fn insert(&mut self, path: Vec<u8>, index: u16) {
        if !self.entries.iter().any(|(p, _)| *p == path) {
            self.entries.push((path, index));
        }
    }

    /// A clean absolute path of three bytes or more lies under or above mountpoint `m`
    /// only if its bytes 1 and 2 are `m`'s (or, for a two-byte `m` such as `/s`, are
    /// `s/`): one bit per such pair lets most unrelated paths skip the comparisons.
    fn pair_filter(&self) -> Option<[u64; PAIR_WORDS]> {
        let mut pairs = [0u64; PAIR_WORDS];
        for (mount, _) in &self.entries {
            let bit = match mount.as_slice() {
                [b'/', second, third, ..] => pair_bit(*second, *third),
                [b'/', second] => pair_bit(*second, b'/'),
                _ => return None,
            };
            pairs[bit / 64] |= 1 << (bit % 64);
        }
        Some(pairs)
    }

    /// True when one mountpoint lies inside another, so a relative path from a managed
    /// directory may still cross into a different mountpoint.
    pub fn has_nested(&self) -> bool {
        self.nested
    }

    /// The configured mountpoints, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// True when no mountpoint is registered (every request passes through).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Classifies a clean (see [`is_clean`]) absolute path.
    #[inline(always)]
    pub fn place_of(&self, path: &[u8]) -> Place {
        if let (Some(pairs), [_, second, third, ..]) = (&self.pairs, path) {
            let bit = pair_bit(*second, *third);
            if pairs[bit / 64] & (1 << (bit % 64)) == 0 {
                return Place::Unrelated;
            }
        }
        self.compare(path)
    }

    /// Classifies an absolute path when that is cheap, reading it once ([`scan_head`]),
    /// in the order of [`MountTable::compare`] (longest spelling first): a clean path
    /// whose second byte starts no mountpoint's second component, or that agrees with
    /// no mountpoint on its first bytes, is [`Place::Unrelated`]; one that starts with a
    /// whole mountpoint followed by `/` or its end is [`Place::Managed`] by it. `None`:
    /// anything else (a path that may need folding, one that ends inside a mountpoint
    /// it agrees with so far, which it may lie above, a path that agrees with a
    /// spelling of more than 16 bytes on its first 16 but is not under it, `/` or a
    /// spelling longer than [`QUICK_LENGTH`] bytes as a mountpoint, a read that would reach the next
    /// page) — the caller resolves in full. Its cost grows with the path only by the
    /// scan's. No call, no panic, no lock.
    ///
    /// # Safety
    /// `path` must point to a NUL-terminated string that starts with `/`.
    #[inline(always)]
    pub unsafe fn quick_absolute(&self, path: *const u8) -> Option<Place> {
        // SAFETY: `path` points to a NUL-terminated string (our caller's contract).
        let (head, within) = unsafe { scan_head(path, self.wide_scan) }?;
        // SAFETY: the string's first byte is `/`, not its NUL, so its second byte is
        // part of it or its NUL (our caller's contract).
        let second = unsafe { *path.add(1) };
        if !self.prefixes.near[second as usize] {
            return Some(Place::Unrelated);
        }
        let prefixes = &self.prefixes;
        let mut i = 0;
        while i < prefixes.count.min(PREFIXES) {
            if mismatches(head, &prefixes.bytes[i]) & prefixes.need[i] & within == 0 {
                // The first min(len, 16, mount length) bytes agree. A spelling not held
                // whole, or one that goes on past the string's end, which it may lie
                // above: compare in full.
                if within & prefixes.end_bit[i] == 0 {
                    return None;
                }
                if prefixes.long[i] {
                    // SAFETY: the string goes on past its first 16 bytes (the end bit is
                    // the 16th for a spelling longer than 16 bytes).
                    return unsafe { self.quick_long(i, path) };
                }
                let mount_len = prefixes.len[i];
                // SAFETY: the string is at least mount_len bytes long: at most the NUL.
                if matches!(unsafe { *path.add(mount_len) }, b'/' | 0) {
                    return Some(Place::Managed(prefixes.index[i]));
                }
                // A longer name beside the mountpoint (`/scratch2`): neither under nor
                // above this one.
            }
            i += 1;
        }
        Some(Place::Unrelated)
    }

    /// [`MountTable::quick_absolute`] for a path that agrees with spelling `i`, of 17 to
    /// [`QUICK_LENGTH`] bytes, on its first 16: its bytes 16 to 31 (if it is longer than
    /// 32) and its last 16 bytes are compared with the path's bytes there, one vector
    /// compare each. [`Place::Managed`] if the path holds it all
    /// followed by `/` or its end; if it does not and goes on past the spelling's end
    /// (a longer or another name beside it), [`Place::Unrelated`] when no other
    /// spelling shares this one's first bytes ([`Prefixes::alone`]); `None` otherwise
    /// (a path ending inside it, which may lie above it, one that later spellings
    /// could hold, a read that would reach the next page): the caller resolves in full.
    ///
    /// # Safety
    /// `path` points to a NUL-terminated string whose first 16 bytes precede its NUL.
    #[inline(always)]
    unsafe fn quick_long(&self, i: usize, path: *const u8) -> Option<Place> {
        let prefixes = &self.prefixes;
        let mount_len = prefixes.len[i];
        let beside = || prefixes.alone[i].then_some(Place::Unrelated);
        if mount_len > 32 {
            // SAFETY: the string's first 16 bytes precede its NUL (our caller's
            // contract), so the block starts at a byte of the string or its NUL.
            let middle = unsafe { head16(path.add(16)) }?;
            if mismatches(middle, &prefixes.mids[i]) != 0 {
                // As for the last 16 bytes below.
                return if zeros(middle) == 0 { beside() } else { None };
            }
        }
        // SAFETY: the bytes before the block's start are the string's (the first 16:
        // our caller's contract; for a spelling longer than 32, the next 16 agree with
        // it, which has no NUL), so it starts at a byte of the string or its NUL.
        let at = unsafe { path.add(mount_len - 16) };
        // SAFETY: the block's first byte is readable (just above).
        let bytes = unsafe { head16(at) }?;
        if mismatches(bytes, &prefixes.tails[i]) != 0 {
            // No NUL among the bytes that differ: the path goes on past the spelling.
            return if zeros(bytes) == 0 { beside() } else { None };
        }
        // SAFETY: the string's first mount_len bytes agree with the spelling, which has
        // no NUL: the next byte is the string's or its NUL.
        match unsafe { *path.add(mount_len) } {
            b'/' | 0 => Some(Place::Managed(prefixes.index[i])),
            _ => beside(),
        }
    }

    /// [`MountTable::place_of`] by comparison with every mountpoint.
    #[inline(never)]
    fn compare(&self, path: &[u8]) -> Place {
        let head = prefix_word(path);
        // Above a mountpoint is a test on whole components: `/scratch/` is above
        // `/scratch/a` as `/scratch` is.
        let directory = match path {
            [rest @ .., b'/'] if !rest.is_empty() => rest,
            _ => path,
        };
        let mut ancestor = false;
        for (mount, index) in &self.entries {
            // Within or above each other, the two share their first min(len, 8) bytes:
            // compare those as one word before comparing whole strings.
            let shared = path.len().min(mount.len()).min(8);
            let mask = if shared == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * shared)) - 1
            };
            if (head ^ prefix_word(mount)) & mask != 0 {
                continue;
            }
            if is_within(path, mount) {
                return Place::Managed(*index);
            }
            ancestor |= is_within(mount, directory);
        }
        if ancestor {
            Place::Ancestor
        } else {
            Place::Unrelated
        }
    }
}

/// The first eight bytes of `bytes` as a little-endian word, zero-padded.
#[inline(always)]
fn prefix_word(bytes: &[u8]) -> u64 {
    match bytes.first_chunk::<8>() {
        Some(word) => u64::from_le_bytes(*word),
        None => {
            let mut word = [0u8; 8];
            word[..bytes.len()].copy_from_slice(bytes);
            u64::from_le_bytes(word)
        }
    }
}

/// Reads the NUL-terminated string at `path` once, in aligned 16-byte blocks, and
/// returns its length if it is *clean* for certain: no two bytes of `.`/`/` in a row
/// (so no `/` followed by `/` or `.`), and no leading `.` (a hidden file's name, `a..b`
/// or `a./b` is clean but reported as `None` too: the caller then checks exactly). Fuses `strlen` with the cleanliness scan of [`is_clean`].
///
/// **Reading past the end.** The first block starts at the aligned address at or below
/// `path` and every block is 16-byte aligned, so no load crosses a 4 KiB page boundary:
/// each block lies in a page that also holds at least one byte of the string (the first
/// block holds its first byte, each later one is loaded only if the string did not end
/// before it), and memory protection works by pages, so the loads cannot fault — the
/// same argument glibc's `strlen` relies on. Bytes outside the string (before `path`,
/// after its NUL) are masked off and never influence the result. Such a load is outside
/// the Rust abstract machine's bounds for the object, so it is done in inline assembly
/// (`movdqu`), whose semantics are the hardware's; the compiler sees an opaque read.
/// Memory checkers that track object bounds (ASan, Valgrind's memcheck) would flag it
/// like they flag glibc's `strlen` without their interceptors; under Miri, and off
/// x86-64, a byte-by-byte version runs instead.
///
/// # Safety
/// `path` must be non-null and point to a NUL-terminated string.
#[inline(always)]
pub unsafe fn scan(path: *const u8) -> Option<usize> {
    // SAFETY: non-null and NUL-terminated (our caller's contract): its first byte is
    // readable.
    if unsafe { *path } == b'.' {
        return None;
    }
    // SAFETY: our caller's contract, passed on.
    unsafe { scan_absolute(path) }
}

/// [`scan`] for a path known to start with `/` (so without the leading-`.` check).
///
/// # Safety
/// As for [`scan`].
#[inline(always)]
pub unsafe fn scan_absolute(path: *const u8) -> Option<usize> {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: our caller's contract, passed on.
        unsafe { scan_sse2(path) }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        // SAFETY: non-null and NUL-terminated (our caller's contract), and not written
        // while `bytes` lives (the application's argument during its call, or ours).
        let bytes = unsafe { std::ffi::CStr::from_ptr(path.cast()) }.to_bytes();
        (!maybe_dirty(bytes)).then_some(bytes.len())
    }
}

/// [`scan_absolute`] on x86-64: see [`scan`].
///
/// # Safety
/// As for [`scan`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn scan_sse2(path: *const u8) -> Option<usize> {
    let start = path as usize;
    let skip = start & 15;
    let mut block = start - skip;
    // Bit i of each mask: byte i of the block is NUL / is '/' or '.'. Two such bytes in
    // a row are reported: that covers every `//` and `/.`, and also `..` and `./`
    // inside a name (`a..b`), which are rare and only cost the exact check.
    let masks = |block: usize| {
        // SAFETY: `block` is 16-byte aligned, so its 16 bytes lie in one page, which
        // holds a byte of the string (the first block holds its first byte; a later one
        // is loaded only if the string did not end before it), so it is mapped.
        let v = unsafe { load16(block as *const u8) };
        (zeros(v), specials(v))
    };
    let (nul, special) = masks(block);
    // Bytes before the string are not part of it.
    let mut nul = nul >> skip << skip;
    let mut special = special >> skip << skip;
    let mut dirty = (special << 1) & special;
    while nul | dirty == 0 {
        let carry = special >> 15;
        block += 16;
        (nul, special) = masks(block);
        dirty = ((special << 1) | carry) & special;
    }
    // Only what lies before the NUL counts (no NUL: the loop stopped on a dirty pair,
    // and every bit counts).
    let before_nul = nul.wrapping_sub(1) & !nul;
    if dirty & before_nul != 0 {
        return None;
    }
    Some(block + nul.trailing_zeros() as usize - start)
}

/// One 16-byte load that may extend past the object it starts in (see [`scan`]);
/// aligned or not (`movdqu` costs the same as `movdqa` on aligned data).
///
/// # Safety
/// The 16 bytes at `at` must lie in mapped pages.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn load16(at: *const u8) -> std::arch::x86_64::__m128i {
    let v: std::arch::x86_64::__m128i;
    // SAFETY: a 16-byte read of mapped memory (our caller's contract) cannot fault; it
    // writes nothing and touches no stack or flags (the options say so).
    unsafe {
        std::arch::asm!(
            "movdqu {v}, xmmword ptr [{p}]",
            p = in(reg) at,
            v = out(xmm_reg) v,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    v
}

/// The 16 bytes at `path`, if they lie in `path`'s page (unaligned; bytes after the
/// NUL are garbage and must be masked by the caller). `None` in the last 16 bytes of a
/// page, where the read could reach the next, possibly unmapped, page.
///
/// # Safety
/// `path` must point to a NUL-terminated string.
#[inline(always)]
unsafe fn head16(path: *const u8) -> Option<Head> {
    // 16 bytes on from `path` is within the first 16 of the next page: `path` is in
    // the last 16 of its own (of which the very first could be read, but one check of
    // this form is the cheapest).
    if (path as usize + 16) & 0xff0 == 0 {
        return None;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: the 16 bytes at `path` lie in its page (checked above), which is mapped
    // since it holds the string's first byte.
    unsafe {
        Some(load16(path))
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        // Portable: copy the string's bytes only (the caller masks the rest).
        let mut head = [0u8; 16];
        for (i, byte) in head.iter_mut().enumerate() {
            // SAFETY: bytes up to the string's NUL (the loop stops there) are readable
            // (our caller's contract).
            *byte = unsafe { *path.add(i) };
            if *byte == 0 {
                break;
            }
        }
        Some(head)
    }
}

/// Reads an absolute path once, like [`scan_absolute`], and returns its first 16 bytes
/// (as [`head16`]) and which of them are the string's (bit i: byte i precedes the NUL)
/// if it is certainly clean; `None` if it may need folding or lies in the last 16
/// bytes of its page. On x86-64 the first 16 bytes are read unaligned (so the bytes
/// before the path need no masking, and the prefix comparison reuses them), then the
/// rest in blocks, each with the byte before it (read unaligned too: the string's), so
/// a `/` ending one block and a `/` or `.` opening the next need no carry. Each block is
/// one test of one mask ([`block_stops`]): the string's first *stop* — its NUL, or a `/`
/// or `.` right after a `/` — ends the scan, and the byte there says which. With `wide`
/// [`WIDE`] (the CPU must have AVX2) the blocks are 32 bytes ([`stops_avx2`]) where they
/// fit in a page; else (`wide` 0) 16 and aligned.
///
/// # Safety
/// `path` must point to a NUL-terminated string; `wide` is 0, or [`WIDE`] if the CPU
/// has AVX2.
#[inline(always)]
unsafe fn scan_head(path: *const u8, wide: usize) -> Option<(Head, u32)> {
    // SAFETY: our caller's contract, passed on.
    let head = unsafe { head16(path) }?;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let mut stops = head_stops(head);
        // The bytes before the first stop; if the scan finds it is the NUL, the
        // string's among the 16 (all of them when the string goes on past them).
        let within = stops.wrapping_sub(1) & !stops & 0xffff;
        let mut block = path as usize;
        if stops == 0 {
            // No NUL among the first 16 bytes: the string goes on past them.
            let rest = path as usize + 16;
            // One test for both: AVX2 and the 32 bytes at `rest` in one page.
            if (rest + 32) & wide != 0 {
                // SAFETY: the CPU has AVX2 (our caller's contract); the byte before
                // `rest` is the string's, and the 32 bytes at `rest` lie in one page,
                // which holds its byte 16, the string's or its NUL (checked above).
                (block, stops) = unsafe { stops_avx2(rest as *const u8) };
            } else {
                block = rest & !15;
                loop {
                    // SAFETY: `block` is 16-byte aligned, so its 16 bytes lie in one
                    // page, which holds a byte of the string (the bytes before it had
                    // no NUL), so it is mapped; the byte before it is the string's
                    // (block > path).
                    stops = unsafe { block_stops(block as *const u8) };
                    if stops != 0 {
                        break;
                    }
                    block += 16;
                }
            }
        }
        let stop = block + stops.trailing_zeros() as usize;
        // SAFETY: the first stop is at or before the string's NUL: readable.
        if unsafe { *(stop as *const u8) } != 0 {
            return None;
        }
        Some((head, within))
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = wide;
        // SAFETY: our caller's contract, passed on.
        let len = unsafe { scan_absolute(path) }?;
        Some((head, (1u32 << len.min(16)) - 1))
    }
}

/// [`scan_head`]'s `wide` when the CPU has AVX2: the bits of an address that are all 0
/// only within the first 32 bytes of a page, so that one mask test of the address 32
/// bytes on from a read both chooses the 32-byte scan and refuses a read that may reach
/// the next page.
const WIDE: usize = 0xfe0;

/// True when the CPU has AVX2 (for [`stops_avx2`]).
fn has_avx2() -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        false
    }
}

/// The first stop (as [`block_stops`]) of a string from `from` on, 32 bytes at a
/// time: the 32 bytes at `from`, then 32-byte aligned blocks, each in one page (the
/// first overlaps bytes already seen, which have no stop). Returns the address of the
/// block holding it and the block's stop mask. Written whole in assembly, the loop
/// included, so that the hook keeps no more registers than the pointer and the mask;
/// the constants stay in vector registers, which the caller does not keep (all are
/// caller-saved), and `vzeroupper` ends it, as the SSE code after it needs.
///
/// # Safety
/// The CPU has AVX2; the byte before `from` is the string's; the 32 bytes at `from`
/// lie in one page, which holds a byte of the string or its NUL.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn stops_avx2(from: *const u8) -> (usize, u32) {
    let mut block = from as usize;
    let mask: u32;
    // SAFETY: the CPU has AVX2 (our caller's contract). Reads: the 32 bytes at `from`
    // and the 32 from the byte before it, which lie in mapped pages (our caller's
    // contract); then each aligned block after them, read only while no NUL came before
    // it, so its page holds a byte of the string, and the 32 bytes from the byte before
    // it, the string's; two 16-byte statics and a 32-byte one. Writes only the named
    // registers (the ymm ones are declared through their xmm halves: a caller built
    // without AVX keeps nothing in the upper halves), no stack; the flags are declared.
    unsafe {
        std::arch::asm!(
            "vbroadcasti128 ymm0, xmmword ptr [rip + {slashes}]",
            "vbroadcasti128 ymm1, xmmword ptr [rip + {ones}]",
            // Bytes after a `/` that are `/` or `.` (or-ed with 1, both are `/`) are
            // cleared; then the zero bytes are the stops.
            "vpcmpeqb ymm3, ymm0, ymmword ptr [{p} - 1]",
            "vpor ymm4, ymm1, ymmword ptr [{p}]",
            "vpcmpeqb ymm4, ymm4, ymm0",
            "vpand ymm4, ymm4, ymm3",
            "vpandn ymm4, ymm4, ymmword ptr [{p}]",
            "vpcmpeqb ymm4, ymm4, ymmword ptr [rip + {zeros}]",
            "vptest ymm4, ymm4",
            "jnz 3f",
            "and {p}, -32",
            "2:",
            "add {p}, 32",
            "vpcmpeqb ymm3, ymm0, ymmword ptr [{p} - 1]",
            "vpor ymm4, ymm1, ymmword ptr [{p}]",
            "vpcmpeqb ymm4, ymm4, ymm0",
            "vpand ymm4, ymm4, ymm3",
            "vpandn ymm4, ymm4, ymmword ptr [{p}]",
            "vpcmpeqb ymm4, ymm4, ymmword ptr [rip + {zeros}]",
            "vptest ymm4, ymm4",
            "jz 2b",
            "3:",
            "vpmovmskb {mask:e}, ymm4",
            "vzeroupper",
            p = inout(reg) block,
            mask = out(reg) mask,
            slashes = sym SLASHES,
            ones = sym ONES,
            zeros = sym ZEROS,
            out("xmm0") _,
            out("xmm1") _,
            out("xmm3") _,
            out("xmm4") _,
            options(nostack, readonly, pure),
        );
    }
    (block, mask)
}

/// Bit i set when byte i of the first 16 bytes of a path is a stop: a NUL, or a `/` or
/// `.` right after a `/` (bytes past the NUL may set bits too; only the first counts).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn head_stops(head: Head) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86-64 baseline.
    unsafe {
        let slash = _mm_set1_epi8(b'/' as i8);
        let after_slash = _mm_slli_si128::<1>(_mm_cmpeq_epi8(head, slash));
        let special = _mm_cmpeq_epi8(_mm_or_si128(head, _mm_set1_epi8(1)), slash);
        let nul = _mm_cmpeq_epi8(head, _mm_setzero_si128());
        _mm_movemask_epi8(_mm_or_si128(_mm_and_si128(after_slash, special), nul)) as u32
    }
}

/// [`head_stops`] for the aligned 16-byte block at `block`, whose preceding byte is
/// read too (so a pair across two blocks is seen). In assembly, with the constants as
/// memory operands (see [`specials`]); one aligned and one unaligned load.
///
/// # Safety
/// `block` is 16-byte aligned, its page is mapped, and so is the byte before it.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn block_stops(block: *const u8) -> u32 {
    let mask: u32;
    // SAFETY: two 16-byte reads of mapped memory (our caller's contract), the first
    // aligned; two aligned 16-byte statics; writes nothing and touches no stack or
    // flags (the options say so).
    unsafe {
        std::arch::asm!(
            "movdqa {v}, xmmword ptr [{p}]",
            "movdqu {before}, xmmword ptr [{p} - 1]",
            "pcmpeqb {before}, xmmword ptr [rip + {slashes}]",
            "pxor {nul}, {nul}",
            "pcmpeqb {nul}, {v}",
            "por {v}, xmmword ptr [rip + {ones}]",
            "pcmpeqb {v}, xmmword ptr [rip + {slashes}]",
            "pand {v}, {before}",
            "por {v}, {nul}",
            "pmovmskb {mask:e}, {v}",
            p = in(reg) block,
            v = out(xmm_reg) _,
            before = out(xmm_reg) _,
            nul = out(xmm_reg) _,
            mask = out(reg) mask,
            ones = sym ONES,
            slashes = sym SLASHES,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    mask
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
type Head = std::arch::x86_64::__m128i;
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
type Head = [u8; 16];

/// Bit i set when byte i of `head` is NUL.
#[inline(always)]
fn zeros(head: Head) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: SSE2 is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::*;
        _mm_movemask_epi8(_mm_cmpeq_epi8(head, _mm_setzero_si128())) as u32
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        (0..16).fold(0, |m, i| m | (((head[i] == 0) as u32) << i))
    }
}

/// 16 aligned bytes, for constants the assembly reads from memory.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[repr(C, align(16))]
struct Bytes([u8; 16]);
#[cfg(all(target_arch = "x86_64", not(miri)))]
static ONES: Bytes = Bytes([1; 16]);
#[cfg(all(target_arch = "x86_64", not(miri)))]
static SLASHES: Bytes = Bytes([b'/'; 16]);
/// 32 zero bytes, a memory operand of [`stops_avx2`] (so it needs no register set to 0).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[repr(C, align(32))]
struct Zeros([u8; 32]);
#[cfg(all(target_arch = "x86_64", not(miri)))]
static ZEROS: Zeros = Zeros([0; 32]);

/// Bit i set when byte i of `v` is `/` or `.` (`.` = 0x2e and `/` = 0x2f both become
/// 0x2f when or-ed with 1). In assembly so that the two constants stay memory operands:
/// hoisted into registers, they would cost two loads per path whose scan loops once,
/// which is most of them.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn specials(v: Head) -> u32 {
    let mask: u32;
    // SAFETY: SSE2 is part of the x86-64 baseline; reads two aligned 16-byte statics,
    // writes nothing and touches no stack or flags (the options say so).
    unsafe {
        std::arch::asm!(
            "por {v}, xmmword ptr [rip + {ones}]",
            "pcmpeqb {v}, xmmword ptr [rip + {slashes}]",
            "pmovmskb {mask:e}, {v}",
            v = inout(xmm_reg) v => _,
            mask = out(reg) mask,
            ones = sym ONES,
            slashes = sym SLASHES,
            options(nostack, readonly, preserves_flags, pure),
        );
    }
    mask
}

/// Bit i set when byte i of `head` and `prefix` differ.
#[inline(always)]
fn mismatches(head: Head, prefix: &[u8; 16]) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: SSE2 is part of the x86-64 baseline; `prefix` is 16 readable bytes.
    unsafe {
        use std::arch::x86_64::*;
        let p = _mm_loadu_si128(prefix.as_ptr().cast());
        !(_mm_movemask_epi8(_mm_cmpeq_epi8(head, p)) as u32) & 0xffff
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        (0..16).fold(0, |m, i| m | (((head[i] != prefix[i]) as u32) << i))
    }
}

/// True when `path` equals `dir` or lies below it (`dir` has no trailing slash, except
/// `/` itself). A trailing slash on `path` is tolerated.
fn is_within(path: &[u8], dir: &[u8]) -> bool {
    if dir == b"/" {
        return path.first() == Some(&b'/');
    }
    path.starts_with(dir) && matches!(path.get(dir.len()), None | Some(b'/'))
}

/// True when a path needs no lexical folding: no empty, `.` or `..` component.
/// Such a path can be compared with mountpoints as it is (a trailing `/` is fine).
///
/// A vector scan first looks for any `/` followed by `/` or `.` (and a leading `.`);
/// only paths that have one (hidden files, `..`) take the exact byte-by-byte check.
#[inline]
pub fn is_clean(path: &[u8]) -> bool {
    !maybe_dirty(path) || is_clean_exact(path)
}

/// True if `path` might contain a foldable component (no false negatives).
#[inline(always)]
fn maybe_dirty(path: &[u8]) -> bool {
    if path.first() == Some(&b'.') {
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if path.len() >= 16 {
        // SAFETY: SSE2 is part of the x86-64 baseline; every load is in bounds.
        return unsafe { maybe_dirty_sse2(path) };
    }
    path.windows(2)
        .any(|w| w[0] == b'/' && (w[1] == b'/' || w[1] == b'.'))
}

/// 16 bytes at a time; the last block overlaps the previous one, which is harmless
/// for a search. A `/` ending one block and a `/` or `.` opening the next is caught by
/// carrying the block's last bit.
///
/// # Safety
/// `path` must be at least 16 bytes long (and the CPU have SSE2, as every x86-64 has).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn maybe_dirty_sse2(path: &[u8]) -> bool {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86-64 baseline.
    let slash = unsafe { _mm_set1_epi8(b'/' as i8) };
    // SAFETY: as above.
    let dot = unsafe { _mm_set1_epi8(b'.' as i8) };
    let mut offset = 0;
    let mut carry = 0u32;
    loop {
        let start = offset.min(path.len() - 16);
        // SAFETY: `start` ≤ len − 16 (len ≥ 16: our caller's contract), so the 16
        // bytes read are in the slice; SSE2 is part of the x86-64 baseline.
        let block = unsafe { _mm_loadu_si128(path.as_ptr().add(start).cast()) };
        // SAFETY: SSE2 is part of the x86-64 baseline.
        let slashes = unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(block, slash)) } as u32;
        // SAFETY: as above.
        let followers = slashes | unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(block, dot)) } as u32;
        let boundary = if start == offset { carry } else { 0 };
        if ((slashes << 1) | boundary) & followers != 0 {
            return true;
        }
        carry = slashes >> 15;
        offset += 16;
        if offset >= path.len() {
            return false;
        }
    }
}

fn is_clean_exact(path: &[u8]) -> bool {
    let mut components = path.split(|b| *b == b'/').enumerate().peekable();
    while let Some((index, component)) = components.next() {
        let last = components.peek().is_none();
        match component {
            // A leading empty component is the root; a trailing one is a final slash.
            b"" if index == 0 || last => {}
            b"" | b"." | b".." => return false,
            _ => {}
        }
    }
    true
}

/// A fixed-capacity path on the stack: resolving a path never allocates.
pub struct PathBuffer {
    bytes: [u8; PATH_CAPACITY],
    len: usize,
}

impl PathBuffer {
    /// An empty buffer.
    #[inline]
    pub fn new() -> PathBuffer {
        PathBuffer {
            bytes: [0; PATH_CAPACITY],
            len: 0,
        }
    }

    /// The path so far (`/` when only the root was pushed).
    pub fn as_bytes(&self) -> &[u8] {
        if self.len == 0 {
            b"/"
        } else {
            &self.bytes[..self.len]
        }
    }

    /// Appends `path`'s components, folding `.`, `..` and repeated slashes. An
    /// absolute `path` restarts from `/`. Returns false if the result does not fit.
    /// The buffer holds an absolute path without trailing slash (empty means `/`).
    pub fn push_normalized(&mut self, path: &[u8]) -> bool {
        if path.first() == Some(&b'/') {
            self.len = 0;
        }
        for component in path.split(|b| *b == b'/') {
            match component {
                b"" | b"." => {}
                b".." => {
                    while self.len > 0 {
                        self.len -= 1;
                        if self.bytes[self.len] == b'/' {
                            break;
                        }
                    }
                }
                name => {
                    if self.len + 1 + name.len() > PATH_CAPACITY {
                        return false;
                    }
                    self.bytes[self.len] = b'/';
                    self.bytes[self.len + 1..self.len + 1 + name.len()].copy_from_slice(name);
                    self.len += 1 + name.len();
                }
            }
        }
        true
    }
}

impl Default for PathBuffer {
    fn default() -> Self {
        PathBuffer::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn normalize(base: &str, path: &str) -> String {
        let mut buf = PathBuffer::new();
        assert!(buf.push_normalized(base.as_bytes()));
        assert!(buf.push_normalized(path.as_bytes()));
        String::from_utf8(buf.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn folds_dots_and_slashes() {
        assert_eq!(normalize("/", "//scratch///a/./b/../c/"), "/scratch/a/c");
        assert_eq!(normalize("/home/u", "../../scratch/x"), "/scratch/x");
        assert_eq!(normalize("/home/u", "/../../etc"), "/etc");
        assert_eq!(normalize("/home/u", "."), "/home/u");
        assert_eq!(normalize("/", ".."), "/");
        assert_eq!(normalize("/a", "b/.."), "/a");
    }

    #[test]
    fn clean_paths_are_recognised() {
        for clean in [
            "/scratch/a",
            "/scratch/a/",
            "a/b",
            "/a/.hidden",
            "/a/..x",
            "x",
            "/",
        ] {
            assert!(is_clean(clean.as_bytes()), "{clean}");
        }
        for dirty in [
            "//a", "/a//b", "/a/./b", "/a/../b", "/a/.", "/a/..", ".", "..", "./a", "../a",
        ] {
            assert!(!is_clean(dirty.as_bytes()), "{dirty}");
        }
    }

    #[test]
    fn places() {
        let table = MountTable::new(&[
            "/scratch".into(),
            "/scratch/nested/".into(),
            "/data/x".into(),
        ])
        .unwrap();
        assert_eq!(table.place_of(b"/scratch"), Place::Managed(0));
        assert_eq!(table.place_of(b"/scratch/a/b"), Place::Managed(0));
        assert_eq!(table.place_of(b"/scratch/nested/f"), Place::Managed(1));
        assert_eq!(table.place_of(b"/scratchy"), Place::Unrelated);
        assert_eq!(table.place_of(b"/"), Place::Ancestor);
        assert_eq!(table.place_of(b"/data"), Place::Ancestor);
        assert_eq!(
            table.place_of(b"/data/"),
            Place::Ancestor,
            "as `find /data/` says it"
        );
        assert_eq!(table.place_of(b"/scratch/"), Place::Managed(0));
        assert_eq!(table.place_of(b"/data/y"), Place::Unrelated);
        assert_eq!(table.place_of(b"/data/x/"), Place::Managed(2));
        // SAFETY: NUL-terminated, starting with `/`.
        let quick = unsafe { table.quick_absolute(c"/data/".as_ptr().cast()) };
        assert!(quick.is_none_or(|place| place == Place::Ancestor));
        assert!(MountTable::new(&["relative".into()]).is_err());
    }

    #[test]
    fn root_mountpoint_manages_everything() {
        let table = MountTable::new(&["/".into()]).unwrap();
        assert_eq!(table.place_of(b"/etc/passwd"), Place::Managed(0));
    }

    /// Two pages, the second inaccessible: a string ending on the first page's last
    /// byte is read right up to the page the scans must not touch.
    struct GuardedPage {
        base: *mut u8,
    }

    const PAGE: usize = 4096;

    impl GuardedPage {
        fn new() -> GuardedPage {
            // SAFETY: a plain anonymous mapping, then its second page made inaccessible.
            unsafe {
                let map = libc::mmap(
                    std::ptr::null_mut(),
                    2 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(map, libc::MAP_FAILED);
                let base = map.cast::<u8>();
                assert_eq!(
                    libc::mprotect(base.add(PAGE).cast(), PAGE, libc::PROT_NONE),
                    0
                );
                GuardedPage { base }
            }
        }

        /// Writes `path` and its NUL at the end of the accessible page; returns where
        /// it starts.
        fn place_at_end(&mut self, path: &[u8]) -> *const u8 {
            assert!(path.len() < PAGE);
            // SAFETY: the last path.len() + 1 bytes of the accessible page.
            unsafe {
                let start = self.base.add(PAGE - 1 - path.len());
                std::ptr::copy_nonoverlapping(path.as_ptr(), start, path.len());
                *start.add(path.len()) = 0;
                start
            }
        }
    }

    impl Drop for GuardedPage {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer used.
            unsafe { libc::munmap(self.base.cast(), 2 * PAGE) };
        }
    }

    /// The `wide` arguments of [`scan_head`] this CPU can run: 16-byte blocks, and
    /// 32-byte ones with AVX2.
    fn scan_widths() -> Vec<usize> {
        if has_avx2() {
            vec![0, WIDE]
        } else {
            vec![0]
        }
    }

    /// What [`scan_head`] must return for the string `bytes` at `at`: which of its
    /// first 16 bytes are the string's, unless it has a `/` followed by `/` or `.`, or
    /// starts in the last 16 bytes of a page.
    fn expected_head(bytes: &[u8], at: *const u8) -> Option<u32> {
        let dirty = bytes
            .windows(2)
            .any(|w| w[0] == b'/' && matches!(w[1], b'/' | b'.'));
        let page_end = (at as usize + 16) & 0xff0 == 0;
        (!dirty && !page_end).then_some((1u32 << bytes.len().min(16)) - 1)
    }

    /// Checks [`scan_head`] at every width against [`expected_head`], and its head
    /// against the string's first bytes.
    ///
    /// # Safety
    /// `at` points to `bytes` followed by a NUL.
    unsafe fn check_scan_head(bytes: &[u8], at: *const u8) -> Result<(), TestCaseError> {
        for wide in scan_widths() {
            // SAFETY: our caller's contract; `wide` is one this CPU runs.
            let scanned = unsafe { scan_head(at, wide) };
            let within = scanned.map(|(_, within)| within);
            prop_assert_eq!(within, expected_head(bytes, at), "wide {:#x}", wide);
            if let Some((head, _)) = scanned {
                let n = bytes.len().min(16);
                prop_assert_eq!(mismatches(head, &bytes_16(bytes)) & ((1 << n) - 1), 0);
            }
        }
        Ok(())
    }

    /// The first (up to) 16 bytes of `bytes`, zero-padded.
    fn bytes_16(bytes: &[u8]) -> [u8; 16] {
        let mut first = [0; 16];
        let n = bytes.len().min(16);
        first[..n].copy_from_slice(&bytes[..n]);
        first
    }

    /// A path of `len` bytes made of names from `names` (a leading `/` if `absolute`),
    /// with `special` (`//`, `/.`, `/..` or nothing) put in at `at` (modulo its length).
    fn path_with(
        names: &[String],
        len: usize,
        absolute: bool,
        special: &str,
        at: usize,
    ) -> Vec<u8> {
        let mut path: Vec<u8> = if absolute { b"/".to_vec() } else { Vec::new() };
        let mut names = names.iter().cycle();
        while path.len() < len {
            path.extend_from_slice(names.next().map_or(b"a", |n| n.as_bytes()));
            path.push(b'/');
        }
        path.truncate(len);
        let at = at % (path.len() + 1);
        path.splice(at..at, special.bytes());
        path
    }

    #[test]
    fn scans_stop_at_the_page_end() {
        // A path ending on the last byte of a page whose next page is inaccessible: the
        // aligned reads of `scan` and `scan_head`, and the page checks of `head16` and
        // of the 32-byte read, must not fault.
        let mut page = GuardedPage::new();
        let table = MountTable::new(&["/tmp/x-m".into()]).unwrap();
        for len in 0..300usize {
            // `/t…`: a second byte some mountpoint has, so the 16 bytes are read.
            let path: Vec<u8> = (0..len)
                .map(|i| match i {
                    0 => b'/',
                    1 => b't',
                    _ => b'a' + (i % 26) as u8,
                })
                .collect();
            let start = page.place_at_end(&path);
            // SAFETY: `start` points to `path` and its NUL.
            unsafe {
                assert_eq!(scan(start), Some(len), "length {len}");
                check_scan_head(&path, start).unwrap();
                if len > 0 {
                    let quick = table.quick_absolute(start);
                    // Within the page's last 16 bytes the 16-byte read is refused.
                    assert_eq!(quick.is_none(), len < 16, "length {len}");
                }
            }
        }
    }

    /// A buffer holding `path` `offset` bytes past a 16-byte boundary, NUL-terminated,
    /// with `garbage` after its NUL, and where the path starts in it.
    fn placed(path: &str, offset: usize, garbage: &str) -> (Vec<u8>, usize) {
        let mut storage = vec![b'/'; 256];
        let base = (16 - storage.as_ptr() as usize % 16) % 16 + offset;
        storage[base..base + path.len()].copy_from_slice(path.as_bytes());
        storage[base + path.len()] = 0;
        let tail = base + path.len() + 1;
        storage[tail..tail + garbage.len()].copy_from_slice(garbage.as_bytes());
        (storage, base)
    }

    #[test]
    fn place_encoding_round_trips() {
        for place in [
            Place::Unrelated,
            Place::Ancestor,
            Place::Managed(0),
            Place::Managed(77),
        ] {
            assert_eq!(Place::decode(place.encode()), place);
        }
    }

    proptest! {
        // A clean path and its normalised form classify the same way.
        #[test]
        fn clean_paths_need_no_folding(parts in proptest::collection::vec("[a-z.]{1,4}", 1..6)) {
            let path = format!("/{}", parts.join("/"));
            if is_clean(path.as_bytes()) {
                prop_assert_eq!(normalize("/", &path), path.trim_end_matches('/'));
            }
        }

        // The vector pre-check never hides a dirty path.
        #[test]
        fn fast_check_agrees_with_exact(path in "[a./]{0,70}") {
            prop_assert_eq!(is_clean(path.as_bytes()), is_clean_exact(path.as_bytes()));
        }

        // The pair filter never hides a path under or above a mountpoint.
        #[test]
        fn pair_filter_agrees_with_comparison(path in "/[sdax/]{0,10}") {
            let table = MountTable::new(&["/s".into(), "/sa/x".into(), "/data/x".into()]).unwrap();
            if is_clean(path.as_bytes()) {
                prop_assert_eq!(table.place_of(path.as_bytes()), table.compare(path.as_bytes()));
            }
        }

        // The fused scan agrees with strlen + the exact check, wherever the string
        // starts relative to a 16-byte boundary and whatever follows its NUL.
        #[test]
        fn scan_agrees_with_strlen_and_exact_check(
            path in "[a./]{0,70}",
            offset in 0usize..16,
            garbage in "[a./]{0,20}",
        ) {
            let (storage, base) = placed(&path, offset, &garbage);
            // SAFETY: NUL-terminated inside `storage`.
            let scanned = unsafe { scan(storage[base..].as_ptr()) };
            let bytes = path.as_bytes();
            let expected = (is_clean(bytes) && bytes.first() != Some(&b'.')).then_some(bytes.len());
            match scanned {
                Some(len) => prop_assert_eq!(Some(len), expected),
                // Only paths the exact check must look at are refused, and those with
                // two `.`/`/` bytes in a row (`a..b`, `a./b`).
                None => prop_assert!(
                    expected.is_none()
                        || maybe_dirty(bytes)
                        || bytes.windows(2).any(|w| w.iter().all(|b| matches!(b, b'.' | b'/')))
                ),
            }
        }

        // Both scans of `scan_head` agree with a byte-by-byte check, wherever the string
        // starts relative to a 32-byte boundary, whatever follows its NUL, with a `//`,
        // `/.` or `/..` anywhere or none.
        #[test]
        fn scan_head_agrees_with_bytewise_check(
            names in proptest::collection::vec("[a-z][a-z.]{0,11}", 1..8),
            len in 0usize..300,
            absolute in proptest::bool::ANY,
            special in prop_oneof!["", "//", "/[.]", "/[.][.]"],
            at in 0usize..320,
            offset in 0usize..32,
            garbage in "[a./]{0,40}",
        ) {
            let path = path_with(&names, len, absolute, &special, at);
            let mut storage = vec![b'/'; 400];
            let base = (32 - storage.as_ptr() as usize % 32) % 32 + offset;
            storage[base..base + path.len()].copy_from_slice(&path);
            storage[base + path.len()] = 0;
            let tail = base + path.len() + 1;
            storage[tail..tail + garbage.len()].copy_from_slice(garbage.as_bytes());
            // SAFETY: `path` and its NUL, inside `storage`.
            unsafe { check_scan_head(&path, storage[base..].as_ptr()) }?;
        }

        // And up to the end of a page whose next page is inaccessible.
        #[test]
        fn scan_head_agrees_with_bytewise_check_at_the_page_end(
            names in proptest::collection::vec("[a-z][a-z.]{0,11}", 1..8),
            len in 0usize..300,
            special in prop_oneof!["", "//", "/[.]", "/[.][.]"],
            at in 0usize..320,
        ) {
            let path = path_with(&names, len, true, &special, at);
            let mut page = GuardedPage::new();
            let start = page.place_at_end(&path);
            // SAFETY: `start` points to `path` and its NUL.
            unsafe { check_scan_head(&path, start) }?;
        }

        // Normalisation is idempotent and never leaves dot components.
        #[test]
        fn normalisation_is_idempotent(path in "[a-z./]{0,30}") {
            let once = normalize("/base/dir", &path);
            prop_assert_eq!(normalize("/", &once), once.clone());
            prop_assert!(is_clean(once.as_bytes()));
        }
    }

    /// Where a clean absolute path lies, component by component: under the mountpoint
    /// with the most components it starts with, else above one whose components start
    /// with all of its own, else unrelated.
    fn place_by_components(mounts: &[&str], path: &str) -> Place {
        let components = |p: &str| {
            p.split('/')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let path = components(path);
        let mut under: Option<(usize, u16)> = None;
        let mut above = false;
        for (index, mount) in mounts.iter().enumerate() {
            let mount = components(mount);
            if path.starts_with(&mount) {
                if under.is_none_or(|(depth, _)| mount.len() > depth) {
                    under = Some((mount.len(), index as u16));
                }
            } else if mount.starts_with(&path) {
                above = true;
            }
        }
        match under {
            Some((_, index)) => Place::Managed(index),
            None if above => Place::Ancestor,
            None => Place::Unrelated,
        }
    }

    proptest! {
        // Mountpoints of repeated short names, some the prefix of another's name, and
        // paths cut from them at any byte, with or without a trailing `/`.
        #[test]
        fn place_of_agrees_with_components(
            names in proptest::collection::vec(("[ab][ab]{0,3}", 1usize..4), 1..5),
            pick in 0usize..4,
            cut in 1usize..40,
            suffix in "[ab/]{0,8}",
        ) {
            let mut mounts: Vec<String> = names
                .iter()
                .map(|(name, times)| format!("/{name}").repeat(*times))
                .collect();
            mounts.sort();
            mounts.dedup();
            let table = MountTable::new(&mounts).unwrap();
            let spelling = &mounts[pick % mounts.len()];
            let path = format!("{}{suffix}", &spelling[..cut.min(spelling.len())]);
            prop_assume!(is_clean(path.as_bytes()));
            let mounts: Vec<&str> = mounts.iter().map(String::as_str).collect();
            prop_assert_eq!(table.place_of(path.as_bytes()), place_by_components(&mounts, &path));
        }
    }

    proptest! {
        // Dirty pairs straddling a 16-byte boundary are rare among random paths: many
        // cases, each cheap.
        #![proptest_config(ProptestConfig::with_cases(4096))]

        // The quick classification never contradicts the full one, wherever the path
        // starts relative to a 16-byte boundary and whatever follows its NUL; a clean
        // path whose second byte starts no mountpoint is classified quickly.
        #[test]
        fn quick_place_agrees_with_place_of(
            path in "/[tmpxu/.-]{0,40}",
            offset in 0usize..16,
            garbage in "[./]{0,20}",
        ) {
            let table = MountTable::new(&[
                "/tmp/x-m".into(),
                "/tm".into(),
                "/p/x".into(),
                "/tmp/x-m/p/-/-/mmmm".into(),
                "/tmp/x-m/p/-".into(),
            ])
            .unwrap();
            let (storage, base) = placed(&path, offset, &garbage);
            let start = storage[base..].as_ptr();
            // SAFETY: NUL-terminated inside `storage`, starting with `/`.
            let quick = unsafe { table.quick_absolute(start) };
            if let Some(place) = quick {
                prop_assert!(is_clean(path.as_bytes()));
                prop_assert_eq!(place, table.place_of(path.as_bytes()));
            }
            let far = !matches!(path.as_bytes().get(1), None | Some(b't' | b'p'));
            // SAFETY: as above.
            let clean = unsafe { scan(start) }.is_some();
            let page_end = (start as usize + 16) & 0xff0 == 0;
            if far && clean && !page_end {
                prop_assert_eq!(quick, Some(Place::Unrelated));
            }
        }

        // Spellings of 17 to 48 bytes (compared on their last 16 bytes too, and past
        // 32 on their second 16) and one longer (compared in full), some the prefix of
        // another's name: the quick classification never contradicts the full one, and
        // a clean path under one of up to 48 bytes is classified quickly.
        #[test]
        fn quick_place_agrees_with_place_of_for_long_mountpoints(
            mount in 0usize..7,
            cut in 1usize..60,
            suffix in "[ab/.]{0,24}",
            offset in 0usize..16,
            garbage in "[./]{0,20}",
        ) {
            let mounts = [
                "/aaaa/bbbb/aaaa/bb",
                "/aaaa/bbbb/aaaa/bbbb/aa",
                "/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/a",
                "/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/aaaa/b",
                "/aaaa/bbbb/a",
                "/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/aaaa/bbb",
                "/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/aaaa/bbbb/a",
            ];
            let table = MountTable::new(&mounts.map(String::from)).unwrap();
            let spelling = mounts[mount];
            let path = format!("{}{suffix}", &spelling[..cut.min(spelling.len())]);
            let (storage, base) = placed(&path, offset, &garbage);
            let start = storage[base..].as_ptr();
            // SAFETY: NUL-terminated inside `storage`, starting with `/`.
            let quick = unsafe { table.quick_absolute(start) };
            let clean = is_clean(path.as_bytes());
            if let Some(place) = quick {
                prop_assert!(clean);
                prop_assert_eq!(place, table.place_of(path.as_bytes()));
            }
            // Without the spelling compared in full (which sends every path sharing its
            // first 16 bytes to the full comparison), and with one alone on its first
            // 16 bytes (a path beside it is unrelated at once).
            let held = MountTable::new(&[0, 1, 2, 3, 4, 5].map(|m| mounts[m].to_string())).unwrap();
            let alone = MountTable::new(&[spelling.into(), "/bbbb".into()]).unwrap();
            for table in [held, alone] {
                // SAFETY: as above.
                if let Some(place) = unsafe { table.quick_absolute(start) } {
                    prop_assert!(clean);
                    prop_assert_eq!(place, table.place_of(path.as_bytes()));
                }
            }
            // With no other spelling sharing its first 16 bytes (but a shorter one that
            // is the prefix of its name), a path under a spelling of up to 48 bytes is
            // classified quickly.
            let under = cut >= spelling.len()
                && (suffix.is_empty() || suffix.starts_with('/'))
                && spelling.len() <= QUICK_LENGTH
                && !suffix.contains('.');
            let page_end = |at: *const u8| (at as usize + 16) & 0xff0 == 0;
            // SAFETY: the spelling's second and last 16 bytes lie in `storage`, as the
            // path does.
            let (middle, tail) = unsafe { (start.add(16), start.add(spelling.len().max(16) - 16)) };
            let middle_read = spelling.len() > 32 && page_end(middle);
            if under && clean && !page_end(start) && !page_end(tail) && !middle_read {
                let single = MountTable::new(&[spelling.into(), mounts[4].into()]).unwrap();
                // SAFETY: as above.
                let quick = unsafe { single.quick_absolute(start) };
                prop_assert_eq!(quick, Some(single.place_of(path.as_bytes())));
                prop_assert!(matches!(quick, Some(Place::Managed(_))));
            }
        }
    }
}
