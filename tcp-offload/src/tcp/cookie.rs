//! SYN cookies: when a listener's backlog of half-open connections is full,
//! its SYN-ACK carries all the state in the ISN, so that a SYN flood cannot
//! exhaust memory and a genuine client still completes its handshake.
