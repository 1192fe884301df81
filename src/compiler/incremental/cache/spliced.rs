//! A memory's export after a patch: the lines as they were read (the memory file mapped, or
//! a buffer something else holds) with the patched ones swapped, put together only when
//! somebody asks for the whole.
//!
//! Why: a `steward deploy` that patches one literal of a 100,000-resource model uploads
//! only the changed resources, and writes the export to the next memory. Copying the 32 MB
//! of mapped lines into a buffer of their own for that was ~40 ms of CPU (fresh pages are
//! zeroed, and on a VM each is a fault of the host too) in the seconds where the private
//! server starts on the same two cores. Written from the pieces, the file needs no copy.

use std::io::Write;
use std::sync::{Arc, OnceLock};

use super::Part;

/// One swapped line: where the old one starts in the base and how long it is, and the new.
struct Swap {
    at: usize,
    old_len: usize,
    new: Vec<u8>,
}

/// An export in lines: a part of a buffer, with some of its lines swapped.
#[derive(Clone)]
pub(super) struct Export {
    base: Part,
    /// By place, none overlapping; empty: the base is the export.
    swaps: Arc<[Swap]>,
    /// The whole, once put together.
    joined: Arc<OnceLock<Arc<Vec<u8>>>>,
}

impl Export {
    pub(super) fn whole(base: Part) -> Export {
        Export {
            base,
            swaps: Arc::new([]),
            joined: Default::default(),
        }
    }

    /// `base` with each `(at, len, new)` swapped: the `len` bytes at `at` (a whole line of
    /// the base) become `new`; no two overlap.
    pub(super) fn spliced(
        base: Part,
        lines: impl IntoIterator<Item = (usize, usize, Vec<u8>)>,
    ) -> Export {
        let mut swaps: Vec<Swap> = lines
            .into_iter()
            .map(|(at, old_len, new)| {
                debug_assert!(at + old_len <= base.len(), "a line of the base");
                Swap { at, old_len, new }
            })
            .collect();
        swaps.sort_by_key(|s| s.at);
        debug_assert!(swaps.windows(2).all(|w| w[0].at + w[0].old_len <= w[1].at));
        Export {
            base,
            swaps: swaps.into(),
            joined: Default::default(),
        }
    }

    /// The bytes when nothing is swapped (the base is the export).
    pub(super) fn as_whole(&self) -> Option<&Part> {
        self.swaps.is_empty().then_some(&self.base)
    }

    /// The base part, to change in place; only for an export with nothing swapped.
    pub(super) fn whole_mut(&mut self) -> Option<&mut Part> {
        // (nothing is ever joined of an export with nothing swapped: see `to_arc`)
        self.swaps.is_empty().then_some(&mut self.base)
    }

    pub(super) fn len(&self) -> usize {
        self.swaps
            .iter()
            .fold(self.base.len(), |n, s| n - s.old_len + s.new.len())
    }

    /// The pieces in order: the base between the swaps, and the new lines.
    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        let mut copied = 0;
        self.swaps
            .iter()
            .flat_map(move |s| {
                let before = &self.base[copied..s.at];
                copied = s.at + s.old_len;
                [before, s.new.as_slice()]
            })
            .chain(std::iter::once_with(move || {
                let last = self.swaps.last().map_or(0, |s| s.at + s.old_len);
                &self.base[last..]
            }))
    }

    pub(super) fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        for piece in self.pieces() {
            w.write_all(piece)?;
        }
        Ok(())
    }

    /// The whole export, in a buffer (shared with the base's when nothing is swapped and
    /// the base is a whole buffer of this process; else put together once).
    pub(super) fn to_arc(&self) -> Arc<Vec<u8>> {
        if self.swaps.is_empty() {
            return self.base.to_arc();
        }
        self.joined
            .get_or_init(|| {
                let mut out = crate::alloc::populated(self.len());
                for piece in self.pieces() {
                    out.extend_from_slice(piece);
                }
                Arc::new(out)
            })
            .clone()
    }

    /// Its bytes before any swap: the lines of the export but the swapped ones.
    pub(super) fn base(&self) -> &[u8] {
        &self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(bytes: &[u8]) -> Part {
        Part::whole(Arc::new(bytes.to_vec()))
    }

    /// The export in each of its forms (joined, written in pieces) and its length agree
    /// with `want`.
    fn assert_reads_as(export: &Export, want: &[u8]) {
        assert_eq!(export.to_arc().as_slice(), want, "joined");
        assert_eq!(export.len(), want.len(), "length");
        let mut written = Vec::new();
        export.write_to(&mut written).unwrap();
        assert_eq!(written, want, "written");
    }

    #[test]
    fn a_spliced_export_is_the_base_with_its_lines_swapped_in_every_form() {
        let text: &[u8] = b"head\nline a,\nline b,\nline c\ntail\n";
        let base = part(text);
        let find = |needle: &[u8]| {
            let at = text
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap();
            (at, needle.len())
        };
        let (a, c) = (find(b"line a"), find(b"line c"));
        // given out of order: kept by place
        let export = Export::spliced(
            base.clone(),
            [(c.0, c.1, b"the third".to_vec()), (a.0, a.1, b"A".to_vec())],
        );
        assert_reads_as(&export, b"head\nA,\nline b,\nthe third\ntail\n");
        assert!(export.as_whole().is_none());
        assert_eq!(export.base(), text);
        // joined once, then shared
        assert!(Arc::ptr_eq(&export.to_arc(), &export.clone().to_arc()));

        let whole = Export::whole(base);
        assert_reads_as(&whole, text);
        assert!(whole.as_whole().is_some());
    }

    #[test]
    fn a_swap_at_the_start_or_the_end_of_the_base_keeps_the_rest() {
        let text: &[u8] = b"first\nlast";
        let base = part(text);
        let export = Export::spliced(base.clone(), [(0, 5, b"1".to_vec()), (6, 4, b"2".to_vec())]);
        assert_reads_as(&export, b"1\n2");
        let none = Export::spliced(base, std::iter::empty());
        assert_reads_as(&none, text);
    }
}
