//! PADLL data-plane stage (being written).
