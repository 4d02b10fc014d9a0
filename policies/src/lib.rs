//! QoS control algorithms (being written).
