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

    /// The mountpoint index, if managed.
    #[inline]
    pub const fn mount(self) -> Option<u16> {
        match self {
            Place::Managed(i) => Some(i),
            _ => None,
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
    };

    /// Builds the table from configured mountpoints. Each must be absolute; its
    /// canonical form (symlinks resolved) is registered too when it differs.
    pub fn new(mounts: &[String]) -> Result<MountTable, String> {
        let mut table = MountTable::default();
        for mount in mounts {
            if !mount.starts_with('/') {
                return Err(format!("mountpoint '{mount}' is not an absolute path"));
            }
            let mut buf = PathBuffer::new();
            if !buf.push_normalized(mount.as_bytes()) {
                return Err(format!("mountpoint '{mount}' is too long"));
            }
            let index = u16::try_from(table.names.len())
                .ok()
                .filter(|i| *i < u16::MAX - 2)
                .ok_or_else(|| "too many mountpoints".to_string())?;
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

    /// [`MountTable::place_of`] by comparison with every mountpoint.
    #[inline(never)]
    fn compare(&self, path: &[u8]) -> Place {
        let head = prefix_word(path);
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
            ancestor |= is_within(mount, path);
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
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn maybe_dirty_sse2(path: &[u8]) -> bool {
    use std::arch::x86_64::*;
    let slash = _mm_set1_epi8(b'/' as i8);
    let dot = _mm_set1_epi8(b'.' as i8);
    let mut offset = 0;
    let mut carry = 0u32;
    loop {
        let start = offset.min(path.len() - 16);
        let block = _mm_loadu_si128(path.as_ptr().add(start).cast());
        let slashes = _mm_movemask_epi8(_mm_cmpeq_epi8(block, slash)) as u32;
        let followers = slashes | _mm_movemask_epi8(_mm_cmpeq_epi8(block, dot)) as u32;
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
        assert_eq!(table.place_of(b"/data/y"), Place::Unrelated);
        assert!(MountTable::new(&["relative".into()]).is_err());
    }

    #[test]
    fn root_mountpoint_manages_everything() {
        let table = MountTable::new(&["/".into()]).unwrap();
        assert_eq!(table.place_of(b"/etc/passwd"), Place::Managed(0));
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

        // Normalisation is idempotent and never leaves dot components.
        #[test]
        fn normalisation_is_idempotent(path in "[a-z./]{0,30}") {
            let once = normalize("/base/dir", &path);
            prop_assert_eq!(normalize("/", &once), once.clone());
            prop_assert!(is_clean(once.as_bytes()));
        }
    }
}
