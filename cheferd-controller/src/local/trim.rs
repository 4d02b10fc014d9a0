//! Giving freed heap memory back to the system after connections left, so a burst of
//! clients holding large partial lines leaves no lasting RSS.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static TRIM_WANTED: AtomicBool = AtomicBool::new(false);

/// Asks [`trim_loop`] to give freed memory back at its next turn.
pub(super) fn wanted() {
    TRIM_WANTED.store(true, Ordering::Relaxed);
}

/// Returns freed heap memory to the system at most once a second, when asked.
pub(super) async fn trim_loop() {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if TRIM_WANTED.swap(false, Ordering::Relaxed) {
            // SAFETY: malloc_trim only releases free memory.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}
