//! How a connection-setup failure reads: the rules every such message
//! follows, checked by the tests (rdmap's and the dataplane's) that walk
//! each error type's `ALL` list.
//!
//! An operator sees these messages in one log line (`iwarp rping`,
//! `iwarp perf`, `iwarp serve`), often about a peer they do not run, so
//! each is one sentence in two parts: what happened, naming what the peer
//! did; then, after `"; "`, what to change, starting with a verb ("offer a
//! Write RTR, or turn peer-to-peer off"). Messages start lowercase and end
//! without a full stop, so that callers can prefix them ("connection to
//! 10.0.0.2:7174 failed: …"). No Rust debug shapes (`Foo(…)`, `{ … }`,
//! `::`), and no variant names.

/// Verbs a remedy may start with: what the operator (or the peer's
/// operator) is told to do.
pub const REMEDY_VERBS: &[&str] = &[
    "accept", "allow", "ask", "check", "connect", "fix", "give", "have", "let", "listen", "lower",
    "make", "offer", "post", "raise", "register", "retry", "send", "set", "start", "stop", "turn",
    "use", "wait",
];

/// Words with an inner capital that are not variant names.
const PROPER_WORDS: &[&str] = &["iWARP"];

/// Why `message` breaks the rules above, if it does; `needs_remedy` when
/// the failure is the peer's (or the network's) and the operator must be
/// told what to change.
pub fn rule_broken(message: &str, needs_remedy: bool) -> Option<String> {
    if message.trim().is_empty() {
        return Some("empty".into());
    }
    if message.contains('\n') || message.contains('\r') {
        return Some("more than one line".into());
    }
    if message.trim() != message {
        return Some("leading or trailing blanks".into());
    }
    for shape in ["{", "}", "::", "\"", "Some(", "None"] {
        if message.contains(shape) {
            return Some(format!("contains `{shape}`, a debug shape"));
        }
    }
    if message.ends_with('.') {
        return Some("ends with a full stop".into());
    }
    if message.chars().next().is_some_and(char::is_uppercase) && !starts_with_acronym(message) {
        return Some("starts with a capital".into());
    }
    for word in message.split(|c: char| !c.is_alphanumeric() && c != '_') {
        if word.is_empty() || PROPER_WORDS.contains(&word) {
            continue;
        }
        if word.contains('_') && word.chars().any(char::is_uppercase) {
            return Some(format!("`{word}` looks like a constant name"));
        }
        let camel = word
            .as_bytes()
            .windows(2)
            .any(|p| p[0].is_ascii_lowercase() && p[1].is_ascii_uppercase());
        if camel {
            return Some(format!("`{word}` looks like a variant name"));
        }
    }
    // A word glued to an opening parenthesis is a tuple variant's shape.
    if message
        .as_bytes()
        .windows(2)
        .any(|p| p[0].is_ascii_alphanumeric() && p[1] == b'(')
    {
        return Some("a word glued to `(`, a debug shape".into());
    }
    if message.split_whitespace().count() < 4 {
        return Some("fewer than four words: not a sentence".into());
    }
    if needs_remedy {
        let Some((_, remedy)) = message.rsplit_once("; ") else {
            return Some("no remedy after `; `".into());
        };
        let first = remedy.split_whitespace().next().unwrap_or("");
        if !REMEDY_VERBS.contains(&first) {
            return Some(format!(
                "the remedy `{remedy}` does not start with one of {REMEDY_VERBS:?}"
            ));
        }
    }
    None
}

fn starts_with_acronym(message: &str) -> bool {
    let first = message.split_whitespace().next().unwrap_or("");
    first.len() > 1
        && first
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_catch_debug_output_and_missing_remedies() {
        let good = "the peer chose a Write RTR, which we did not offer; offer a Write RTR, \
                    or turn peer-to-peer off";
        assert_eq!(rule_broken(good, true), None);
        assert_eq!(
            rule_broken("MPA reply without CRC (2/1/0x07) came in", false),
            None
        );
        for bad in [
            "Setup(Negotiation(NoMatchingRtr(Framing { crc: true })))",
            "the peer chose NoMatchingRtr and more",
            "the peer sent rdmap::mpa junk here",
            "connection ended: Some(Reset) here",
            "two\nlines of text here",
            "no matching RTR",
            "the peer did something odd here.",
        ] {
            assert!(rule_broken(bad, false).is_some(), "{bad}");
        }
        assert!(rule_broken("the peer chose a Write RTR, not offered", true).is_some());
        assert!(rule_broken("the peer chose a Write RTR; whatever you like", true).is_some());
    }
}
