//! MPA (RFC 5044, RFC 6581): connection setup frames, negotiation, FPDU framing and deframing.
