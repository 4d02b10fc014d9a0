//! Unix sockets created safely: refusing symlinks, live controllers and unsafe
//! directories, replacing stale sockets, removed again at shutdown ([`bind_unix`]).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tracing::warn;

/// Creates a listening Unix socket at `path` with `mode`, refusing anything unsafe, in
/// one line naming the path; the [`SocketFile`] removes it again when dropped.
///
/// - a missing directory is named (`/run/cheferd` is made by systemd's
///   `RuntimeDirectory=`; elsewhere give the socket's path);
/// - a stale socket (connecting to it is refused: nobody listens) owned by us or root
///   is replaced;
/// - a live one (a controller answers on it) is never taken over, nor one whose state
///   cannot be told;
/// - a symbolic link (dangling or not) or a file of another type is refused;
/// - a parent directory writable by others is refused unless it has the sticky bit
///   (as `/tmp` has: there nobody else can remove or rename our socket), in which case a
///   stale socket must be our own to be replaced.
pub fn bind_unix(
    path: &Path,
    mode: u32,
) -> Result<(std::os::unix::net::UnixListener, SocketFile), SocketError> {
    let bad = |kind| SocketError {
        path: path.to_path_buf(),
        kind,
    };
    let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => parent,
        None => Path::new("."),
    };
    let dir_error = |error| {
        bad(SocketErrorKind::Directory {
            dir: parent.to_path_buf(),
            error,
        })
    };
    let dir = std::fs::metadata(parent).map_err(dir_error)?;
    let sticky = dir.mode() & 0o1000 != 0;
    // SAFETY: geteuid takes no arguments, touches no memory of ours and cannot fail.
    let me = unsafe { libc::geteuid() };
    if dir.mode() & 0o022 != 0 && !sticky {
        return Err(bad(SocketErrorKind::OpenDirectory {
            dir: parent.to_path_buf(),
            mode: dir.mode() & 0o7777,
        }));
    }
    if dir.uid() != me && dir.uid() != 0 && dir.mode() & 0o022 == 0 {
        // Another user's private directory: they could replace our socket.
        return Err(bad(SocketErrorKind::ForeignDirectory {
            dir: parent.to_path_buf(),
            uid: dir.uid(),
        }));
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(SocketErrorKind::Inspect(e))),
        Ok(meta) if meta.file_type().is_symlink() => return Err(bad(SocketErrorKind::Symlink)),
        Ok(meta) if !meta.file_type().is_socket() => return Err(bad(SocketErrorKind::NotSocket)),
        Ok(meta) => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(bad(SocketErrorKind::Live)),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(bad(SocketErrorKind::Undecidable(e))),
            }
            if meta.uid() != me && meta.uid() != 0 && (sticky || me != 0) {
                return Err(bad(SocketErrorKind::ForeignStale(meta.uid())));
            }
            std::fs::remove_file(path).map_err(|e| bad(SocketErrorKind::Replace(e)))?;
        }
    }
    let listen = |e| bad(SocketErrorKind::Listen(e));
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(listen)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| bad(SocketErrorKind::Permissions(e)))?;
    listener.set_nonblocking(true).map_err(listen)?;
    let created = std::fs::symlink_metadata(path).map_err(listen)?;
    let file = SocketFile {
        path: path.to_path_buf(),
        identity: (created.dev(), created.ino()),
        _bound: listener.try_clone().map_err(listen)?,
    };
    Ok((listener, file))
}

/// A socket [`bind_unix`] refused or could not make: the path and why.
#[derive(Debug, thiserror::Error)]
#[error("{} {}: {kind}", kind.what_of(), path.display())]
pub struct SocketError {
    /// The socket's path.
    pub path: PathBuf,
    /// Why.
    pub kind: SocketErrorKind,
}

/// Why a socket was refused or not made.
#[derive(Debug, thiserror::Error)]
pub enum SocketErrorKind {
    /// Its directory cannot be examined.
    #[error("its directory {}: {error}", dir.display())]
    Directory {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// Its directory is writable by others and not sticky.
    #[error("its directory {} is writable by others (mode {mode:o}) and not sticky", dir.display())]
    OpenDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Its directory is another user's.
    #[error("its directory {} belongs to uid {uid}", dir.display())]
    ForeignDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// What is at the path cannot be examined.
    #[error("{0}")]
    Inspect(io::Error),
    /// A symbolic link is there.
    #[error("it is a symbolic link (remove it if it is yours)")]
    Symlink,
    /// Some other file is there.
    #[error("it exists and is not a socket")]
    NotSocket,
    /// A controller answers on it.
    #[error("a running controller answers on it (stop it first, or give another path)")]
    Live,
    /// Whether a controller answers on it cannot be told.
    #[error("cannot tell whether a controller answers on it: {0}")]
    Undecidable(io::Error),
    /// A stale socket of another uid.
    #[error("the stale socket there belongs to uid {0}")]
    ForeignStale(u32),
    /// The stale socket could not be removed.
    #[error("{0}")]
    Replace(io::Error),
    /// Binding or listening failed.
    #[error("{0}")]
    Listen(io::Error),
    /// Its mode could not be set.
    #[error("{0}")]
    Permissions(io::Error),
}

impl SocketErrorKind {
    /// How the message begins, before the path.
    fn what_of(&self) -> &'static str {
        match self {
            SocketErrorKind::Directory { .. } | SocketErrorKind::Inspect(_) => {
                "cannot use the socket"
            }
            SocketErrorKind::Replace(_) => "cannot replace the stale socket",
            SocketErrorKind::Listen(_) => "cannot listen on",
            SocketErrorKind::Permissions(_) => "cannot set permissions of",
            _ => "refusing the socket",
        }
    }
}

/// A socket file [`bind_unix`] created: removed when dropped (at shutdown, or when a
/// start fails half-way), unless it is no longer ours (removed by someone else, and
/// perhaps bound again by another controller).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// Device and inode of the file we bound.
    identity: (u64, u64),
    /// The bound socket, kept open until the file is removed: it pins the file's inode,
    /// so a file made at the path meanwhile never has our inode number.
    _bound: std::os::unix::net::UnixListener,
}

impl SocketFile {
    /// Whether the path still names the socket bound. Not once it was removed or
    /// replaced (`tmpfiles` cleaning `/run`, an administrator, a package script): the
    /// listener still serves the connections made, but nothing new can reach it.
    pub fn still_bound(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.identity)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.still_bound() {
            if let Err(e) = std::fs::remove_file(&self.path) {
                warn!("cannot remove the socket {}: {e}", self.path.display());
            }
        }
    }
}
