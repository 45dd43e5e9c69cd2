//! Terminate causes: the (layer, error type, error code) triples of RFC 5040, 5041, 5044 and 6581.
