//! ipv4 (to be written)
