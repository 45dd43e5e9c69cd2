//! perftest's control exchange in `-R` (rdma_cm) mode, byte for byte.
