//! A table as the verbs print it: each column as wide as its widest cell
//! or header, text left and numbers right, two spaces between columns,
//! so every value sits under its header whatever its length (a network,
//! `crowdsec:lists:NAME`, `runtime (shadow)`).

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table being filled: its headers, then rows of cells.
#[derive(Debug)]
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    #[must_use]
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Self { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// A row: one cell per column (missing cells are empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, the header first; no trailing spaces.
    #[must_use]
    pub fn render(&self) -> String {
        let cell = |row: &[String], i: usize| row.get(i).map_or("", String::as_str).to_owned();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                let cells = self.rows.iter().map(|r| cell(r, i).chars().count());
                cells.chain([self.columns[i].0.len()]).max().unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| match self.columns[i].1 {
                    Align::Left => format!("{c:<w$}", w = widths[i]),
                    Align::Right => format!("{c:>w$}", w = widths[i]),
                })
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut out = line(self.columns.iter().map(|(h, _)| (*h).to_owned()).collect());
        for r in &self.rows {
            out.push('\n');
            out.push_str(&line((0..self.columns.len()).map(|i| cell(r, i)).collect()));
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cell_sits_under_its_header() {
        let mut t = Table::new(&[("prefix", Align::Left), ("rate", Align::Right), ("origin", Align::Left)]);
        t.row(vec!["2001:2:0:100::/56".into(), "5".into(), "runtime (shadow)".into()]);
        t.row(vec!["198.18.7.0/24".into(), "1000000".into(), "file".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        let at = |name: &str| lines[0].find(name).unwrap();
        let end = |name: &str| at(name) + name.len();
        for (l, (prefix, rate, origin)) in lines[1..]
            .iter()
            .zip([("2001:2:0:100::/56", "5", "runtime (shadow)"), ("198.18.7.0/24", "1000000", "file")])
        {
            assert_eq!(l.find(prefix), Some(at("prefix")), "{text}");
            assert_eq!(l.find(origin), Some(at("origin")), "{text}");
            // Right-aligned: it ends where its header (or the widest) ends.
            let rate_end =
                l[at("prefix") + prefix.len()..].find(rate).unwrap() + at("prefix") + prefix.len() + rate.len();
            assert_eq!(rate_end, end("rate"), "{text}");
            assert!(!l.ends_with(' '), "{l:?}");
        }
    }
}
