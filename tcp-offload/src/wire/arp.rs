//! arp (to be written)
