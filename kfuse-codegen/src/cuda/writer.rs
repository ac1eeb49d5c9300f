//! An indenting line writer over any `fmt::Write`.

use std::fmt;

/// Writes lines at the current indentation level; `open`/`close` bracket blocks.
pub struct Writer<W: fmt::Write> {
    out: W,
    level: usize,
}

impl<W: fmt::Write> Writer<W> {
    /// A writer at indentation level 0 over `out`.
    pub fn new(out: W) -> Self {
        Writer { out, level: 0 }
    }

    /// A writer over `out` at the level of `other` (for text spliced in at another place
    /// of the same block).
    pub fn beside<V: fmt::Write>(out: W, other: &Writer<V>) -> Self {
        Writer { out, level: other.level }
    }

    /// One line at the current level.
    pub fn line(&mut self, s: impl AsRef<str>) -> fmt::Result {
        let s = s.as_ref();
        if s.is_empty() {
            return self.out.write_char('\n');
        }
        for _ in 0..self.level {
            self.out.write_str("  ")?;
        }
        self.out.write_str(s)?;
        self.out.write_char('\n')
    }

    /// A line that opens a block (`... {`), then one level deeper.
    pub fn open(&mut self, s: impl AsRef<str>) -> fmt::Result {
        let s = s.as_ref();
        self.line(if s.is_empty() { "{".to_string() } else { format!("{s} {{") })?;
        self.level += 1;
        Ok(())
    }

    /// One level deeper without a line (for text spliced into a block later).
    pub fn indent(&mut self) {
        self.level += 1;
    }

    /// Closes a block.
    pub fn close(&mut self) -> fmt::Result {
        self.level = self.level.saturating_sub(1);
        self.line("}")
    }

    /// Writes text as-is (used for the prelude).
    pub fn raw(&mut self, s: &str) -> fmt::Result {
        self.out.write_str(s)
    }

    /// The sink, with everything written.
    pub fn finish(self) -> W {
        self.out
    }
}
