//! ethernet (to be written)
