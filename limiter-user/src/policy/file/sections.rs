//! A policy file cut into its `[[override]]` tables and the rest, before
//! anything is parsed, so that parsing costs memory in proportion to the
//! file, not to what a hostile file can make a TOML parser build: a TOML
//! document tree costs about 2 KiB per override table and 160 bytes per
//! array element (a 7.8 MiB file of 131,072 overrides made a 280 MiB tree;
//! 30 MiB of `[0,0,...]` made 2.4 GiB). One pass of TOML's own lexer
//! (strings, comments and multi-line values are read as TOML reads them)
//! finds the table headers and counts the tokens; overrides are then
//! parsed in batches of [`BATCH`] tables, each dropped before the next,
//! and the rest of the document on its own, each override table's lines
//! left as empty lines so that line numbers stay (a blanked copy of the
//! text would cost the parser about 1.5 bytes per byte of blanks).
//!
//! Offsets given out are in the rest's coordinates: an override's span is
//! moved to the empty line standing for its own line, so one function
//! turns any of them into the line an error names.

use std::{borrow::Cow, ops::Range};

use toml::Spanned;
use toml_parser::lexer::TokenKind;

use super::OverrideSpec;

use limiter_common::maps::MAX_OVERRIDES;

/// Override tables parsed at once: a tree of at most 64 Ki tokens.
pub const BATCH: usize = 1024;
/// Keys, values and punctuation one override table may hold (a table of
/// every override field holds about 30).
pub const MAX_OVERRIDE_TOKENS: usize = 64;
/// Keys, values and separators outside the override tables: classes,
/// forwards, feedback, fleet and their port lists.
pub const MAX_REST_TOKENS: usize = 1 << 18;

/// The text cut up.
#[derive(Debug)]
pub struct Split<'a> {
    /// Everything but the override tables, whose lines are left empty.
    pub rest: Cow<'a, str>,
    /// Runs of consecutive override tables, at most [`BATCH`] each.
    pub batches: Vec<Batch>,
}

/// A run of override tables.
#[derive(Debug, PartialEq, Eq)]
pub struct Batch {
    /// Its bytes in the text.
    pub text: Range<usize>,
    /// Where its first line stands in the rest.
    pub at: usize,
}

impl Batch {
    /// Parse this batch's tables of `text` onto `into`, their spans (the
    /// table's and its cidr's) moved to the rest's coordinates; a syntax
    /// error with its offset there.
    pub(super) fn parse_into(
        &self,
        text: &str,
        into: &mut Vec<Spanned<OverrideSpec>>,
    ) -> Result<(), (toml::de::Error, usize)> {
        #[derive(serde::Deserialize)]
        struct Tables {
            #[serde(rename = "override")]
            overrides: Vec<Spanned<OverrideSpec>>,
        }
        let mut mover = self.mover(text);
        let base = self.text.start;
        let tables: Tables = toml::from_str(&text[self.text.clone()]).map_err(|e| {
            let at = mover.rest_offset(base + e.span().map_or(0, |s| s.start));
            (e, at)
        })?;
        into.extend(tables.overrides.into_iter().map(|o| {
            let at = mover.rest_offset(base + o.span().start);
            let mut spec = o.into_inner();
            let c = mover.rest_offset(base + spec.cidr.span().start);
            spec.cidr = Spanned::new(c..c, spec.cidr.into_inner());
            Spanned::new(at..at, spec)
        }));
        Ok(())
    }

    /// A cursor that moves offsets in this batch's text (which `text`
    /// holds at `self.text`) to the rest's coordinates, for offsets given
    /// in increasing order (spans of successive tables).
    #[must_use]
    pub fn mover<'t>(&self, text: &'t str) -> Mover<'t> {
        Mover { text, from: self.text.start, line: self.at }
    }
}

/// See [`Batch::mover`].
pub struct Mover<'t> {
    text: &'t str,
    from: usize,
    line: usize,
}

impl Mover<'_> {
    /// The rest's offset of the line holding `offset` of the text.
    pub fn rest_offset(&mut self, offset: usize) -> usize {
        let to = offset.clamp(self.from, self.text.len());
        self.line += self.text.get(self.from..to).map_or(0, |t| t.matches('\n').count());
        self.from = to;
        self.line
    }
}

/// What is too big, and where.
#[derive(Debug, PartialEq, Eq)]
pub struct TooBig {
    pub field: String,
    pub problem: String,
    pub offset: usize,
}

/// Cut `text` up, or say where it holds more than a policy can use.
pub fn split(text: &str) -> Result<Split<'_>, TooBig> {
    let mut overrides: Vec<Range<usize>> = Vec::new();
    // Tables past what fits are counted, not kept.
    let mut tables = 0usize;
    let (mut depth, mut line_start, mut in_header) = (0usize, true, false);
    let (mut rest_tokens, mut section_tokens) = (0usize, 0usize);
    // The override table being read, if any: its start.
    let mut current: Option<usize> = None;
    let mut header_start = 0;
    for token in toml_parser::Source::new(text).lex() {
        let span = token.span();
        match token.kind() {
            TokenKind::Whitespace | TokenKind::Comment => continue,
            TokenKind::Newline | TokenKind::Eof => {
                if in_header {
                    in_header = false;
                    let header = &text[header_start..span.start()];
                    let end_prev = header_start;
                    if let Some(start) = current.take()
                        && overrides.len() < MAX_OVERRIDES as usize
                    {
                        overrides.push(start..end_prev);
                    }
                    if is_override(header) {
                        current = Some(header_start);
                        section_tokens = 0;
                        tables += 1;
                    }
                }
                line_start = true;
                continue;
            }
            TokenKind::LeftSquareBracket if line_start && depth == 0 => {
                in_header = true;
                header_start = span.start();
            }
            _ if in_header => {}
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => depth = depth.saturating_sub(1),
            _ => {}
        }
        line_start = false;
        if in_header {
            continue;
        }
        if current.is_some() {
            section_tokens += 1;
            if section_tokens > MAX_OVERRIDE_TOKENS {
                return Err(TooBig {
                    field: format!("override[{}]", tables - 1),
                    problem: format!(
                        "more than {MAX_OVERRIDE_TOKENS} keys, values and separators in one override table"
                    ),
                    offset: span.start(),
                });
            }
        } else {
            rest_tokens += 1;
            if rest_tokens > MAX_REST_TOKENS {
                return Err(TooBig {
                    field: "(document)".into(),
                    problem: format!(
                        "more than {MAX_REST_TOKENS} keys, values and separators outside the [[override]] tables; no policy needs that many"
                    ),
                    offset: span.start(),
                });
            }
        }
    }
    if let Some(start) = current
        && overrides.len() < MAX_OVERRIDES as usize
    {
        overrides.push(start..text.len());
    }
    if tables > MAX_OVERRIDES as usize {
        return Err(TooBig {
            field: "override".into(),
            problem: format!("{tables} overrides, at most {MAX_OVERRIDES} fit"),
            offset: overrides.last().map_or(0, |r| r.end),
        });
    }
    let (rest, at) = without(text, &overrides);
    Ok(Split { rest, batches: batches(&overrides, &at) })
}

/// Whether a table header (`[[ override ]]`, with any comment after it) is
/// an override table's.
fn is_override(header: &str) -> bool {
    let Some(inner) = header.trim().strip_prefix("[[").and_then(|h| h.split_once("]]")).map(|(k, _)| k.trim()) else {
        return false;
    };
    matches!(inner, "override" | "\"override\"" | "'override'")
}

/// `text` with each of `ranges` (in order, apart) cut down to its
/// newlines, and where each one's first line stands in the result.
fn without<'a>(text: &'a str, ranges: &[Range<usize>]) -> (Cow<'a, str>, Vec<usize>) {
    if ranges.is_empty() {
        return (Cow::Borrowed(text), Vec::new());
    }
    let (mut out, mut at, mut from) = (String::new(), Vec::with_capacity(ranges.len()), 0);
    for r in ranges {
        out.push_str(&text[from..r.start]);
        at.push(out.len());
        let lines = text[r.clone()].matches('\n').count();
        out.extend(std::iter::repeat_n('\n', lines));
        from = r.end;
    }
    out.push_str(&text[from..]);
    (Cow::Owned(out), at)
}

/// Consecutive tables joined into runs of at most [`BATCH`].
fn batches(tables: &[Range<usize>], at: &[usize]) -> Vec<Batch> {
    let mut out: Vec<Batch> = Vec::new();
    let mut in_batch = 0;
    for (r, at) in tables.iter().zip(at) {
        match out.last_mut() {
            Some(b) if b.text.end == r.start && in_batch < BATCH => {
                b.text.end = r.end;
                in_batch += 1;
            }
            _ => {
                out.push(Batch { text: r.clone(), at: *at });
                in_batch = 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_tables_are_cut_out_in_runs_and_the_rest_keeps_its_lines() {
        let text = "rate = 1\n[[override]]\ncidr = \"a\" # [[override]]\n[[ 'override' ]] # c\ncidr = \"b\"\n\
                    [feedback]\nlisten = \"x\"\n[[override]]\ncidr = \"c\"\n";
        let s = split(text).unwrap();
        assert_eq!(s.rest, "rate = 1\n\n\n\n\n[feedback]\nlisten = \"x\"\n\n\n");
        let runs: Vec<(&str, usize)> = s.batches.iter().map(|b| (&text[b.text.clone()], b.at)).collect();
        assert_eq!(
            runs,
            [
                ("[[override]]\ncidr = \"a\" # [[override]]\n[[ 'override' ]] # c\ncidr = \"b\"\n", 9),
                ("[[override]]\ncidr = \"c\"\n", 37)
            ]
        );
        // Every offset of the text lands on the rest's line of the same number.
        for b in &s.batches {
            let mut m = b.mover(text);
            for off in b.text.clone() {
                let line = |t: &str, o: usize| t[..o].matches('\n').count();
                assert_eq!(line(&s.rest, m.rest_offset(off)), line(text, off), "offset {off}");
            }
        }
    }

    #[test]
    fn brackets_inside_values_and_strings_are_not_headers() {
        let text = "[[class]]\nports = [\n[1, 2],\n]\nname = \"\"\"\n[[override]]\n\"\"\"\n";
        let s = split(text).unwrap();
        assert!(s.batches.is_empty(), "{s:?}");
        assert_eq!(s.rest, text);
    }

    #[test]
    fn tables_past_what_fits_are_counted_not_kept() {
        let n = MAX_OVERRIDES as usize + 5;
        let e = split(&"[[override]]\n".repeat(n)).unwrap_err();
        assert_eq!(e.problem, format!("{n} overrides, at most {MAX_OVERRIDES} fit"));
        assert_eq!(e.offset, MAX_OVERRIDES as usize * 13, "at the first table that does not fit");
    }

    #[test]
    fn runs_are_at_most_a_batch_long() {
        let text = "[[override]]\ncidr = \"a\"\n".repeat(BATCH * 2 + 1);
        let s = split(&text).unwrap();
        let firsts: Vec<usize> = s.batches.iter().map(|b| b.at).collect();
        assert_eq!(firsts, [0, 2 * BATCH, 4 * BATCH], "two lines a table");
    }

    #[test]
    fn a_document_of_values_is_refused_where_it_grows_too_big() {
        let text = format!("rate = 1\nzzz = [{}]\n", "0,".repeat(MAX_REST_TOKENS));
        let e = split(&text).unwrap_err();
        assert_eq!(e.field, "(document)");
        assert!(e.offset > 9 && e.offset < text.len(), "{}", e.offset);
        let text = format!("[[override]]\ncidr = \"a\"\n[[override]]\ncidr = [{}]\n", "0,".repeat(40));
        let e = split(&text).unwrap_err();
        assert_eq!(e.field, "override[1]");
    }
}
