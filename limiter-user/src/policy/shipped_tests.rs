//! The policy file the Debian package installs as `/etc/limiter/limiter.toml`
//! (`packaging/limiter.toml`): as shipped it is the built-in policy; every
//! option of every section is shown; every default it shows is the real one.

use super::{Policy, file};

const SHIPPED: &str = include_str!("../../../packaging/limiter.toml");
/// The policy reference, which ends with the shipped file.
const REFERENCE: &str = include_str!("../../../docs/policy.md");

/// The shipped text with its option lines (`#key = ...`, `#[section]`)
/// uncommented: all of them, or with `examples_only` just the section
/// headers and the lines marked `# e.g.` (options without a fixed default).
fn uncomment(examples_only: bool) -> String {
    let mut out = String::new();
    for line in SHIPPED.lines() {
        let option =
            line.strip_prefix('#').filter(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '['));
        let line = match option {
            Some(rest) if !examples_only || rest.starts_with('[') || rest.contains("# e.g.") => rest,
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn parse(text: String) -> Policy {
    let loaded = file::parse("limiter.toml", text).unwrap_or_else(|e| panic!("{e}"));
    loaded.check().unwrap_or_else(|e| panic!("{e}"));
    loaded.policy
}

#[test]
fn as_shipped_it_is_the_built_in_policy() {
    assert_eq!(parse(SHIPPED.to_owned()), Policy::default());
}

/// Uncommenting the lines that claim to show a default changes nothing:
/// the file's defaults are the ones the code applies.
#[test]
fn every_default_it_shows_is_the_real_one() {
    let examples = parse(uncomment(true));
    let everything = parse(uncomment(false));
    assert!(!examples.classes.is_empty() && examples.fleet.is_some() && examples.feedback.is_some());
    assert_eq!(everything, examples);
}

/// The sections of a policy file, each as the text that opens one.
const SECTIONS: [&str; 14] = [
    "",
    "[[class]]\nname = \"x\"\n",
    "[[override]]\n",
    "[[forward]]\n",
    "[[tunnel]]\n",
    "[feedback]\n",
    "[feedback.escalate]\n",
    "[[feed]]\n",
    "[[group]]\n",
    "[[source]]\n",
    "[crowdsec]\n",
    "[fleet]\n",
    "[upstream]\nspeaker = \"/run/exabgp/x\"\n",
    "[attacks]\n",
];

/// A section's fields, as the parser lists them when it meets an unknown one.
fn parser_keys(section: &str) -> Vec<String> {
    let err = file::parse("p.toml", format!("{section}colour = 1\n")).expect_err("an unknown field is refused");
    let expected = err.problem.split_once("expected one of ").unwrap_or_else(|| panic!("{err}")).1;
    expected.split(", ").map(|n| n.trim_matches('`').to_owned()).collect()
}

/// Each section's fields are all shown in the file.
#[test]
fn every_option_is_shown() {
    let shown = |name: &str| {
        SHIPPED.lines().any(|l| {
            let l = l.trim_start_matches('#');
            l.starts_with(&format!("{name} ="))
                || l.starts_with(&format!("[[{name}]]"))
                || l.contains(&format!(".{name}]"))
                || l.starts_with(&format!("[{name}]"))
        })
    };
    let mut checked = 0;
    for section in SECTIONS {
        for name in parser_keys(section) {
            assert!(shown(&name), "`{name}` ({section:?}) is not shown in packaging/limiter.toml");
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} fields listed");
}

/// The reference's tables ("Every key: default and range") have a row
/// for every key the parser accepts in each section, and for no other.
#[test]
fn the_reference_tables_list_exactly_the_parsers_keys() {
    let headings = [
        "Top level",
        "`[[class]]`",
        "`[[override]]`",
        "`[[forward]]`",
        "`[[tunnel]]`",
        "`[feedback]`",
        "`[feedback.escalate]`",
        "`[[feed]]`",
        "`[[group]]`",
        "`[[source]]`",
        "`[crowdsec]`",
        "`[fleet]`",
        "`[upstream]`",
        "`[attacks]`",
    ];
    for (heading, section) in headings.into_iter().zip(SECTIONS) {
        let table = REFERENCE
            .split_once(&format!("\n### {heading}\n"))
            .unwrap_or_else(|| panic!("docs/policy.md has no table for {heading}"))
            .1;
        let table = table.split("\n#").next().unwrap_or_default();
        let mut rows: Vec<&str> =
            table.lines().filter_map(|l| l.strip_prefix("| `")?.split_once('`').map(|(k, _)| k)).collect();
        let mut keys = parser_keys(section);
        rows.sort_unstable();
        keys.sort_unstable();
        assert_eq!(rows, keys, "the table of {heading} in docs/policy.md");
    }
}

/// The reference (`docs/policy.md`, installed as `policy.md.gz` and
/// `limiter.toml(5)`) lists the keys through the shipped file, whole:
/// so it lists every key the parser accepts (above) and no other (the
/// file parses with every option uncommented).
#[test]
fn the_policy_reference_holds_the_shipped_file() {
    let block = format!("```toml\n{SHIPPED}```");
    assert!(REFERENCE.contains(&block), "docs/policy.md does not end with packaging/limiter.toml as it is");
    parse(uncomment(false));
}
