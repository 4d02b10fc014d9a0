//! The stop signals a daemon catches to remove its sockets and log its stop.

use std::io;

/// SIGTERM and SIGINT (what systemd, `kill` and Ctrl-C send to stop a daemon), caught
/// from [`StopSignals::install`] on so that a daemon can remove its sockets and log
/// its stop.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Catches both signals from now on (inside a tokio runtime).
    pub fn install() -> Result<StopSignals, SignalsError> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind| signal(kind).map_err(SignalsError);
        Ok(StopSignals {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
        })
    }

    /// Waits for either signal and returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// The stop signals could not be caught.
#[derive(Debug, thiserror::Error)]
#[error("cannot handle SIGTERM and SIGINT: {0}")]
pub struct SignalsError(pub io::Error);
