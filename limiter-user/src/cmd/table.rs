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
                let cells = self.rows.iter().map(|r| super::paint::width(&cell(r, i)));
                cells.chain([self.columns[i].0.len()]).max().unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    // Padded by the columns it shows (a colour code takes none).
                    let pad = " ".repeat(widths[i].saturating_sub(super::paint::width(c)));
                    match self.columns[i].1 {
                        Align::Left => format!("{c}{pad}"),
                        Align::Right => format!("{pad}{c}"),
                    }
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

/// A byte count as people read one: `512 B`, `1.5 KiB`, `12.0 MiB`,
/// `3.2 GiB`, `1.0 TiB` (`-j` keeps the raw number).
#[must_use]
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut unit, mut whole) = (0, bytes);
    while whole >= 1024 && unit + 1 < UNITS.len() {
        whole /= 1024;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    #[expect(clippy::cast_precision_loss, reason = "one decimal shown")]
    let v = bytes as f64 / 1024f64.powi(i32::try_from(unit).unwrap_or(4));
    format!("{v:.1} {}", UNITS[unit])
}

/// Bits a second as people read them: `950 bit/s`, `12.5 Mbit/s`
/// (`-j` keeps the raw number).
#[must_use]
pub fn bits_per_sec(b: u64) -> String {
    const UNITS: [&str; 5] = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
    let mut unit = 0;
    #[expect(clippy::cast_precision_loss, reason = "one decimal shown")]
    let mut v = b as f64;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{b} bit/s") } else { format!("{v:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_their_largest_unit() {
        let got: Vec<String> = [0, 1023, 1024, 1536, 12 << 20, (3 << 30) + (1 << 29), 5 << 40].map(size).to_vec();
        assert_eq!(got, ["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "12.0 MiB", "3.5 GiB", "5.0 TiB"]);
    }

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
