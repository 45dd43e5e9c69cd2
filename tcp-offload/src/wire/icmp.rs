//! icmp (to be written)
