//! A sans-IO host interface: Ethernet II, ARP (resolver and responder),
//! IPv4 (fragments refused and counted) and ICMP echo around a TCP
//! [`Stack`](crate::tcp::Stack). It turns received frames into stack input
//! and stack output into frames; the simulator and the kernel-interop test
//! drive it, and the dataplane's slow path follows the same logic.
