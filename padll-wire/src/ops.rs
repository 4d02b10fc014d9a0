//! Operation types and classes: the vocabulary of request differentiation
//! (PADLL paper §III-A, "request differentiation").
//!
//! Every intercepted entry point maps to exactly one [`Op`]; every `Op` belongs to
//! exactly one [`Class`]. Rules select requests by op, by class, or `all`.

use std::fmt;

macro_rules! ops {
    ($($variant:ident => $name:literal, $class:ident;)*) => {
        /// The kind of file-system request an intercepted call makes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Op { $($variant,)* }

        impl Op {
            /// Every operation, in declaration order (`Op::ALL[op as usize] == op`).
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];
            /// Number of operation types.
            pub const COUNT: usize = Op::ALL.len();

            /// The lower-case name used in rules, statistics and the wire format.
            pub const fn name(self) -> &'static str {
                match self { $(Op::$variant => $name,)* }
            }

            /// The class this operation belongs to.
            pub const fn class(self) -> Class {
                match self { $(Op::$variant => Class::$class,)* }
            }
        }
    };
}

ops! {
    Open => "open", Metadata;
    Close => "close", Metadata;
    Getattr => "getattr", Metadata;
    Setattr => "setattr", Metadata;
    Access => "access", Metadata;
    Mkdir => "mkdir", Metadata;
    Rmdir => "rmdir", Metadata;
    Unlink => "unlink", Metadata;
    Rename => "rename", Metadata;
    Link => "link", Metadata;
    Symlink => "symlink", Metadata;
    Readlink => "readlink", Metadata;
    Mknod => "mknod", Metadata;
    Statfs => "statfs", Metadata;
    Truncate => "truncate", Metadata;
    Chdir => "chdir", Metadata;
    Lock => "lock", Metadata;
    Read => "read", Data;
    Write => "write", Data;
    Sync => "sync", Data;
    Allocate => "allocate", Data;
    Mmap => "mmap", Data;
    Opendir => "opendir", Directory;
    Readdir => "readdir", Directory;
    Closedir => "closedir", Directory;
    Getxattr => "getxattr", Xattr;
    Setxattr => "setxattr", Xattr;
    Listxattr => "listxattr", Xattr;
    Removexattr => "removexattr", Xattr;
}

impl Op {
    /// Parses an operation name as written in rules (`open`, `getattr`, …).
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.name() == name)
    }

    /// Whether its calls move bytes that a byte channel charges: reads and writes
    /// (copies too: a copy is a read and a write) and file mappings (the bytes mapped).
    /// Every other call carries no byte count (`sync`, `allocate` and all metadata,
    /// directory and xattr calls): a byte channel lets them pass freely.
    pub const fn moves_bytes(self) -> bool {
        matches!(self, Op::Read | Op::Write | Op::Mmap)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A coarse group of operations that one rule can limit together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Requests served by metadata servers: open, stat, rename, mkdir, …
    Metadata,
    /// Byte transfers and their companions (read, write, sync, allocate, mmap).
    Data,
    /// Directory listing (opendir, readdir, closedir).
    Directory,
    /// Extended attributes.
    Xattr,
}

impl Class {
    /// Every class.
    pub const ALL: [Class; 4] = [Class::Metadata, Class::Data, Class::Directory, Class::Xattr];

    /// The name used in rules (`metadata`, `data`, `directory`, `xattr`).
    pub const fn name(self) -> &'static str {
        match self {
            Class::Metadata => "metadata",
            Class::Data => "data",
            Class::Directory => "directory",
            Class::Xattr => "xattr",
        }
    }

    /// Parses a class name as written in rules.
    pub fn from_name(name: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_index_matches() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
            assert_eq!(Op::from_name(op.name()), Some(*op));
        }
        for class in Class::ALL {
            assert_eq!(Class::from_name(class.name()), Some(class));
        }
        assert_eq!(Op::from_name("bogus"), None);
    }
}
