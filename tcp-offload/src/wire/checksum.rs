//! checksum (to be written)
