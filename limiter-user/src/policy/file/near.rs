//! "Did you mean": a misspelt key or word (`burts`, `denny`) is answered
//! with the one it is near, not with every key the table takes.

/// `message` (serde's `unknown field `K`, expected one of `a`, `b`` or
/// `unknown variant ...`) with the expected word nearest to `K` named
/// instead of the list, when one is near (at most a third of its letters
/// apart, and at most 3); any other message as it is.
pub(super) fn near(message: &str) -> String {
    let Some((kind, rest)) = ["unknown field `", "unknown variant `"]
        .into_iter()
        .find_map(|k| message.strip_prefix(k).map(|r| (k.trim_end_matches(" `"), r)))
    else {
        return message.to_owned();
    };
    let Some((word, expected)) = rest.split_once("`, expected ") else { return message.to_owned() };
    let candidates: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let best = candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), *c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 3).clamp(1, 3))
        .min_by_key(|(d, _)| *d);
    match best {
        Some((_, c)) => format!("{kind} `{word}`: did you mean `{c}`?"),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::near;

    #[test]
    fn a_near_word_is_named_and_a_far_one_keeps_the_list() {
        let keys = "expected one of `allow_empty`, `rate`, `burst`, `cost`, `class`, `override`";
        assert_eq!(near(&format!("unknown field `burts`, {keys}")), "unknown field `burts`: did you mean `burst`?");
        assert_eq!(near(&format!("unknown field `rat`, {keys}")), "unknown field `rat`: did you mean `rate`?");
        assert_eq!(
            near("unknown variant `denny`, expected `allow` or `deny`"),
            "unknown variant `denny`: did you mean `deny`?"
        );
        // Nothing near: the list stays, and other messages are untouched.
        let far = format!("unknown field `zzzzzz`, {keys}");
        assert_eq!(near(&far), far);
        assert_eq!(near("invalid type: string \"x\", expected u64"), "invalid type: string \"x\", expected u64");
    }
}
