//! CLI (placeholder).
