//! DDP (RFC 5041) and RDMAP (RFC 5040) headers, the Read Request payload and the Terminate message.
