//! The exit codes of the binaries (`padll`, `cheferd`, `policies`), named after BSD's
//! `sysexits.h` where it has one. Each binary maps its errors' kinds to these in one
//! place (its `exit_code`); scripts and service managers read them.

/// Something failed that is neither the caller's mistake nor one of the kinds below.
pub const EX_FAILURE: u8 = 1;
/// Bad usage or input: a flag, a value, a configuration file (clap's code for its own
/// refusals, kept for ours).
pub const EX_USAGE: u8 = 2;
/// A service needed is unavailable (a controller that cannot be reached or does not
/// answer).
pub const EX_UNAVAILABLE: u8 = 69;
/// The caller is not allowed to do this.
pub const EX_NOPERM: u8 = 77;
/// The program to run was found but could not be executed (as the shell says it).
pub const EX_CANNOT_EXECUTE: u8 = 126;
/// The program to run was not found (as the shell says it).
pub const EX_NOT_FOUND: u8 = 127;

/// Why a command failed: one line for stderr (it names the bad value), and its kind, from
/// which the binary's one mapping takes the exit code. `K` is the kinds a library or a
/// binary tells apart; [`Failure::into_kind`] carries one into a wider set of kinds.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure<K: std::fmt::Debug> {
    /// What kind of failure.
    pub kind: K,
    /// One line naming what went wrong.
    pub message: String,
}

impl<K: std::fmt::Debug> Failure<K> {
    /// A failure of `kind`.
    pub fn new(kind: K, message: impl Into<String>) -> Failure<K> {
        Failure {
            kind,
            message: message.into(),
        }
    }

    /// The same failure as one of a wider set of kinds.
    pub fn into_kind<J: std::fmt::Debug + From<K>>(self) -> Failure<J> {
        Failure {
            kind: self.kind.into(),
            message: self.message,
        }
    }
}

/// Writes `text` to stdout and flushes it. A reader that went away (`cheferd ctl top |
/// head -1`) ends the program quietly, exit 0, as SIGPIPE ends the other commands of a
/// pipeline (Rust ignores SIGPIPE, and `print!` panics on the closed pipe); any other
/// write error is one line, exit 1.
pub fn print(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("cannot write to stdout: {e}");
            std::process::exit(EX_FAILURE.into())
        }
    }
}
