//! What keeps the controllers bounded against hostile local users: safe
//! creation of the Unix sockets, accept loops that back off when descriptors run out,
//! capped TCP listeners whose connections cannot exhaust the descriptors, rate-limited
//! logging of peers' mistakes, and byte budgets for partial lines.
//!
//! One concept per module: `socket` (safe Unix sockets), `signals` (stop signals),
//! `accept` (back-off and the descriptor limit), `connections` (capped TCP listeners),
//! `log_limit` (peer-caused log lines), `budget` (partial lines' bytes) and
//! `stage_fields` (the sizes of a stage's registration, and what the global keeps of it).

mod accept;
mod budget;
mod connections;
mod log_limit;
mod signals;
mod socket;
mod stage_fields;

pub use accept::*;
pub use budget::*;
pub use connections::*;
pub use log_limit::*;
pub use signals::*;
pub use socket::*;
pub use stage_fields::*;
