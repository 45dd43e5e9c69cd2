//! The placement trait: the only way the protocol core reaches application memory.
