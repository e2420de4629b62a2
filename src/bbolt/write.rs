//! Writing a bbolt file as a stream, as a bulk load in two passes over the same input: each
//! bucket's keys arrive in order and fill leaf pages one after the other; each level of branch
//! pages above them keeps one page in the making, so memory is a page per level (plus a value
//! larger than a page) whatever the file's size. bbolt's metas come first in the file (pages 0
//! and 1, then 2, an empty freelist) but name the root bucket's page and the page count, known
//! only at the end: so a first pass ([`Writer::planning`]) writes nothing and measures the
//! [`Layout`], and a second ([`Writer::new`]) writes the metas from it and then every page in
//! order, to any [`Write`] (a file, or a stream to a client), never seeking. Every page up to the
//! high-water mark is in use, as bbolt's consistency check requires.

use std::io::{self, Write};

use super::layout::{
    Meta, PageHeader, BRANCH_ELEMENT, BRANCH_PAGE, BUCKET_HEADER, BUCKET_LEAF, FREELIST_PAGE,
    LEAF_ELEMENT, LEAF_PAGE, META_PAGE, PAGE_HEADER,
};

/// The page size written (the one etcd's bbolt uses on Linux).
pub const PAGE_SIZE: usize = 4096;

/// The first page a tree may use: 0 and 1 are the metas, 2 the freelist.
const FIRST_DATA_PAGE: u64 = 3;

/// Zeros for padding pages.
static ZEROS: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// Where a file's trees end up: what its metas name, measured by a first pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The root bucket's page.
    pub root: u64,
    /// The pages in the file (its high-water mark).
    pub pages: u64,
}

impl Layout {
    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.pages * PAGE_SIZE as u64
    }
}

/// A bbolt file being written, or measured.
pub struct Writer<W: Write> {
    out: W,
    /// What the metas already written say; `None` while measuring.
    promised: Option<Layout>,
    next: u64,
    buckets: Vec<(Vec<u8>, u64)>,
}

impl Writer<io::Sink> {
    /// The first pass: writes nothing, and [`Writer::finish`] returns the [`Layout`] the second
    /// pass needs.
    pub fn planning() -> Self {
        Writer {
            out: io::sink(),
            promised: None,
            next: FIRST_DATA_PAGE,
            buckets: Vec::new(),
        }
    }
}

impl<W: Write> Writer<W> {
    /// The second pass: writes the metas (transaction ids 0 and 1, as bbolt initialises a file)
    /// and the freelist for `layout` to `out` now, the pages as they fill. The buckets and keys
    /// must be the first pass's, in the same order.
    ///
    /// # Errors
    /// On a write failure.
    pub fn new(mut out: W, layout: Layout) -> io::Result<Self> {
        for txid in [0u64, 1] {
            let meta = Meta {
                page_size: PAGE_SIZE as u32,
                flags: 0,
                root: layout.root,
                sequence: 0,
                freelist: 2,
                pgid: layout.pages,
                txid,
            };
            let header = PageHeader {
                id: txid,
                flags: META_PAGE,
                count: 0,
                overflow: 0,
            };
            write_page(&mut out, &[&header.encode()[..], &meta.encode()].concat())?;
        }
        let freelist = PageHeader {
            id: 2,
            flags: FREELIST_PAGE,
            count: 0,
            overflow: 0,
        };
        write_page(&mut out, &freelist.encode())?;
        Ok(Writer {
            out,
            promised: Some(layout),
            next: FIRST_DATA_PAGE,
            buckets: Vec::new(),
        })
    }

    /// Starts the top-level bucket `name`; it is added when its [`BucketWriter::finish`] runs.
    pub fn bucket(&mut self, name: &[u8]) -> BucketWriter<'_, W> {
        BucketWriter {
            name: name.to_vec(),
            tree: Tree::new(self),
        }
    }

    /// Writes the root bucket; returns the output and the layout written (or, from
    /// [`Writer::planning`], measured).
    ///
    /// # Errors
    /// On a write failure, or when the second pass's pages differ from the first's (its input
    /// was not the same).
    pub fn finish(mut self) -> io::Result<(W, Layout)> {
        let mut buckets = std::mem::take(&mut self.buckets);
        buckets.sort();
        let mut root = Tree::new(&mut self);
        for (name, page) in &buckets {
            let mut header = [0u8; BUCKET_HEADER];
            header[..8].copy_from_slice(&page.to_le_bytes());
            root.add(name, &header, BUCKET_LEAF)?;
        }
        let root = root.finish()?;
        let layout = Layout {
            root,
            pages: self.next,
        };
        if self.promised.is_some_and(|p| p != layout) {
            return Err(io::Error::other(format!(
                "bbolt file changed between its passes: {:?} measured, {layout:?} written",
                self.promised
            )));
        }
        self.out.flush()?;
        Ok((self.out, layout))
    }

    /// Appends `bytes` as the next `pages` pages, zero-filled.
    fn append_pages(&mut self, bytes: &[u8], pages: usize) -> io::Result<()> {
        if self.promised.is_some() {
            self.out.write_all(bytes)?;
            let mut padding = pages * PAGE_SIZE - bytes.len();
            while padding > 0 {
                let n = padding.min(PAGE_SIZE);
                self.out.write_all(&ZEROS[..n])?;
                padding -= n;
            }
        }
        self.next += pages as u64;
        Ok(())
    }
}

/// Writes `bytes` as one page, zero-filled.
fn write_page(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    out.write_all(bytes)?;
    out.write_all(&ZEROS[..PAGE_SIZE - bytes.len()])
}

/// A top-level bucket being written: keys must come in strictly increasing order.
pub struct BucketWriter<'w, W: Write> {
    name: Vec<u8>,
    tree: Tree<'w, W>,
}

impl<W: Write> BucketWriter<'_, W> {
    /// Adds `key` with `value`.
    ///
    /// # Errors
    /// A key not above the previous one; a write failure.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.tree.add(key, value, 0)
    }

    /// Writes the bucket's last pages and records it in the root bucket.
    ///
    /// # Errors
    /// On a write failure.
    pub fn finish(self) -> io::Result<()> {
        let (writer, root) = self.tree.finish_keeping()?;
        writer.buckets.push((self.name, root));
        Ok(())
    }
}

/// One element of a page in the making.
struct Element {
    key: Vec<u8>,
    /// A leaf's value, or a branch's child page id (little-endian).
    value: Vec<u8>,
    flags: u32,
}

/// A page in the making: its elements and the bytes they will take.
#[derive(Default)]
struct Node {
    elements: Vec<Element>,
    bytes: usize,
}

/// One tree, written bottom-up: the leaf in the making and one branch in the making per level.
struct Tree<'w, W: Write> {
    writer: &'w mut Writer<W>,
    leaf: Node,
    /// `branches[0]` points at leaves, each level above at the one below.
    branches: Vec<Node>,
    last_key: Option<Vec<u8>>,
}

impl<'w, W: Write> Tree<'w, W> {
    fn new(writer: &'w mut Writer<W>) -> Self {
        Tree {
            writer,
            leaf: Node::default(),
            branches: Vec::new(),
            last_key: None,
        }
    }

    fn add(&mut self, key: &[u8], value: &[u8], flags: u32) -> io::Result<()> {
        if self.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(io::Error::other(
                "bbolt keys must be added in increasing order",
            ));
        }
        self.last_key = Some(key.to_vec());
        let size = LEAF_ELEMENT + key.len() + value.len();
        if !self.leaf.elements.is_empty() && PAGE_HEADER + self.leaf.bytes + size > PAGE_SIZE {
            self.flush_leaf()?;
        }
        self.leaf.bytes += size;
        // Measuring needs the sizes (counted above) and the keys (branches hold them), never
        // the values: not copied then.
        let value = if self.writer.promised.is_some() {
            value.to_vec()
        } else {
            Vec::new()
        };
        self.leaf.elements.push(Element {
            key: key.to_vec(),
            value,
            flags,
        });
        Ok(())
    }

    fn flush_leaf(&mut self) -> io::Result<()> {
        let node = std::mem::take(&mut self.leaf);
        self.write_and_link(&node, LEAF_PAGE, 0)
    }

    /// Writes `node` and adds it, under its first key, to the branch in the making at `level`.
    fn write_and_link(&mut self, node: &Node, flags: u16, level: usize) -> io::Result<()> {
        let first = node
            .elements
            .first()
            .map(|e| e.key.clone())
            .unwrap_or_default();
        let id = self.write_node(node, flags)?;
        self.add_branch(level, first, id)
    }

    /// Adds the child `id`, whose first key is `key`, to the branch in the making at `level`.
    fn add_branch(&mut self, level: usize, key: Vec<u8>, id: u64) -> io::Result<()> {
        if self.branches.len() == level {
            self.branches.push(Node::default());
        }
        let size = BRANCH_ELEMENT + key.len();
        let full = self
            .branches
            .get(level)
            .is_some_and(|n| !n.elements.is_empty() && PAGE_HEADER + n.bytes + size > PAGE_SIZE);
        if full {
            self.flush_branch(level)?;
        }
        if let Some(node) = self.branches.get_mut(level) {
            node.bytes += size;
            node.elements.push(Element {
                key,
                value: id.to_le_bytes().to_vec(),
                flags: 0,
            });
        }
        Ok(())
    }

    fn flush_branch(&mut self, level: usize) -> io::Result<()> {
        let node = self
            .branches
            .get_mut(level)
            .map(std::mem::take)
            .unwrap_or_default();
        self.write_and_link(&node, BRANCH_PAGE, level + 1)
    }

    /// Writes the last pages; returns the root page's id.
    fn finish(self) -> io::Result<u64> {
        self.finish_keeping().map(|(_, root)| root)
    }

    /// As [`Self::finish`], handing the writer back.
    fn finish_keeping(mut self) -> io::Result<(&'w mut Writer<W>, u64)> {
        // An empty tree is one empty leaf.
        self.flush_leaf()?;
        let mut level = 0;
        loop {
            let top = level + 1 == self.branches.len();
            if let Some(node) = self.branches.get(level) {
                if top && node.elements.len() == 1 {
                    let id = node
                        .elements
                        .first()
                        .and_then(|e| e.value.as_slice().try_into().ok())
                        .map(u64::from_le_bytes)
                        .unwrap_or_default();
                    return Ok((self.writer, id));
                }
            }
            self.flush_branch(level)?;
            level += 1;
        }
    }

    /// Writes `node` as the next page(s) and returns its id.
    fn write_node(&mut self, node: &Node, flags: u16) -> io::Result<u64> {
        let element_size = if flags == LEAF_PAGE {
            LEAF_ELEMENT
        } else {
            BRANCH_ELEMENT
        };
        let len = PAGE_HEADER + node.bytes;
        let pages = len.div_ceil(PAGE_SIZE).max(1);
        let id = self.writer.next;
        let count = u16::try_from(node.elements.len())
            .map_err(|_| io::Error::other("too many elements for one page"))?;
        let overflow = u32::try_from(pages - 1)
            .map_err(|_| io::Error::other("a value too large for bbolt"))?;
        if self.writer.promised.is_none() {
            // Measuring: only the page count matters.
            self.writer.next += pages as u64;
            return Ok(id);
        }
        let mut page = Vec::with_capacity(len);
        let header = PageHeader {
            id,
            flags,
            count,
            overflow,
        };
        page.extend_from_slice(&header.encode());
        let mut data = PAGE_HEADER + node.elements.len() * element_size;
        for (i, e) in node.elements.iter().enumerate() {
            let at = PAGE_HEADER + i * element_size;
            let pos = (data - at) as u32;
            let key_len = e.key.len() as u32;
            if flags == LEAF_PAGE {
                page.extend_from_slice(&e.flags.to_le_bytes());
                page.extend_from_slice(&pos.to_le_bytes());
                page.extend_from_slice(&key_len.to_le_bytes());
                page.extend_from_slice(&(e.value.len() as u32).to_le_bytes());
                data += e.key.len() + e.value.len();
            } else {
                page.extend_from_slice(&pos.to_le_bytes());
                page.extend_from_slice(&key_len.to_le_bytes());
                page.extend_from_slice(&e.value);
                data += e.key.len();
            }
        }
        for e in &node.elements {
            page.extend_from_slice(&e.key);
            if flags == LEAF_PAGE {
                page.extend_from_slice(&e.value);
            }
        }
        self.writer.append_pages(&page, pages)?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bbolt::read::Entry;
    use crate::bbolt::{Bucket, Db};
    use std::fs::File;

    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    fn read_all(db: &Db, bucket: &Bucket) -> io::Result<Pairs> {
        let mut out = Vec::new();
        db.for_each(bucket, &mut |k, e| {
            if let Entry::Value(v) = e {
                out.push((k.to_vec(), v.to_vec()));
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// One pass over `buckets` into `w`.
    fn pass<W: Write>(mut w: Writer<W>, buckets: &[(&[u8], &Pairs)]) -> io::Result<(W, Layout)> {
        for (name, pairs) in buckets {
            let mut b = w.bucket(name);
            for (k, v) in pairs.iter() {
                b.put(k, v)?;
            }
            b.finish()?;
        }
        w.finish()
    }

    /// Both passes, into the file at `path`; returns its size.
    fn write(path: &std::path::Path, buckets: &[(&[u8], &Pairs)]) -> io::Result<u64> {
        let (_, layout) = pass(Writer::planning(), buckets)?;
        let out = io::BufWriter::new(File::create(path)?);
        let (_, written) = pass(Writer::new(out, layout)?, buckets)?;
        assert_eq!(written, layout);
        Ok(layout.size())
    }

    fn open(path: &std::path::Path) -> io::Result<Db> {
        let f = File::open(path)?;
        let len = f.metadata()?.len();
        Db::open(f, len)
    }

    /// Three levels of branches (long keys, few per page), values on overflow pages, an empty
    /// bucket: everything written reads back in order.
    #[test]
    fn what_is_written_reads_back() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        let deep: Pairs = (0..7000u32)
            .map(|i| (format!("{i:0200}").into_bytes(), i.to_be_bytes().to_vec()))
            .collect();
        let big: Pairs = (0..20u8)
            .map(|i| (vec![i], vec![i; usize::from(i) * 1000]))
            .collect();
        let empty: Pairs = Vec::new();
        let size = write(&path, &[(b"zz", &deep), (b"big", &big), (b"empty", &empty)])?;
        assert_eq!(size, std::fs::metadata(&path)?.len());
        let db = open(&path)?;
        assert_eq!(db.size(), size);
        for (name, pairs) in [(&b"zz"[..], &deep), (b"big", &big), (b"empty", &empty)] {
            let bucket = db
                .bucket(name)?
                .ok_or_else(|| io::Error::other("missing"))?;
            assert_eq!(&read_all(&db, &bucket)?, pairs);
        }
        assert_eq!(db.bucket(b"other")?, None);
        Ok(())
    }

    #[test]
    fn keys_out_of_order_are_refused() -> io::Result<()> {
        let mut w = Writer::planning();
        let mut b = w.bucket(b"b");
        b.put(b"b", b"")?;
        assert!(b.put(b"a", b"").is_err());
        assert!(b.put(b"b", b"").is_err());
        Ok(())
    }

    /// A second pass over other data than the first's is an error, not a file whose metas
    /// point elsewhere; the same data gives the same bytes however it is written.
    #[test]
    fn a_second_pass_must_match_the_first() -> io::Result<()> {
        let pairs: Pairs = (0..500u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![1; 100]))
            .collect();
        let fewer: Pairs = pairs.get(..250).unwrap_or_default().to_vec();
        let (_, layout) = pass(Writer::planning(), &[(b"a", &pairs)])?;
        assert!(pass(Writer::new(Vec::new(), layout)?, &[(b"a", &fewer)]).is_err());
        let (bytes, written) = pass(Writer::new(Vec::new(), layout)?, &[(b"a", &pairs)])?;
        assert_eq!(written, layout);
        assert_eq!(bytes.len() as u64, layout.size());
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        write(&path, &[(b"a", &pairs)])?;
        assert_eq!(std::fs::read(&path)?, bytes);
        Ok(())
    }

    /// Damaged files (truncated, or any byte changed) are refused or read, never a panic, an
    /// endless loop or an allocation the file does not justify.
    #[test]
    fn damaged_files_never_panic() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        let pairs: Pairs = (0..300u32)
            .map(|i| {
                (
                    format!("key{i:05}").into_bytes(),
                    vec![7; (i as usize % 50) * 100],
                )
            })
            .collect();
        write(&path, &[(b"a", &pairs), (b"b", &pairs)])?;
        let good = std::fs::read(&path)?;
        let damaged = dir.path().join("damaged");
        let check = |bytes: &[u8]| -> io::Result<()> {
            std::fs::write(&damaged, bytes)?;
            if let Ok(db) = open(&damaged) {
                for name in [&b"a"[..], b"b"] {
                    if let Ok(Some(bucket)) = db.bucket(name) {
                        let _ = read_all(&db, &bucket);
                    }
                }
            }
            Ok(())
        };
        for cut in [0, 10, 100, 4096, 8192, good.len() / 2, good.len() - 1] {
            check(&good[..cut])?;
            assert!(open(&damaged)
                .and_then(|db| {
                    let b = db.bucket(b"b")?.ok_or_else(|| io::Error::other("gone"))?;
                    read_all(&db, &b)
                })
                .is_err());
        }
        // A deterministic spread of changes: most in a page's header and elements (where a
        // change redirects the reader), some anywhere, one to four bytes each.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..1000 {
            let mut bytes = good.clone();
            for _ in 0..=(next() % 4) {
                let r = next() as usize;
                let page = (r >> 8) % (good.len() / PAGE_SIZE);
                let within = if round % 4 == 0 { PAGE_SIZE } else { 160 };
                let at = page * PAGE_SIZE + (r >> 40) % within;
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= (r as u8) | 1;
                }
            }
            check(&bytes)?;
        }
        Ok(())
    }
}
