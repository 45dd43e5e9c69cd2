//! The verbs object model: protection domains, memory regions, STags, CQs, SRQs, QP states, work requests.
