//! Reading a bbolt file: [`Db::open`] picks the valid meta page, [`Db::for_each`] visits a
//! bucket's keys in order, reading one page at a time (memory: the pages on the path from the
//! bucket's root to the current leaf).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::layout::{
    corrupt, u32_at, u64_at, Meta, PageHeader, BRANCH_ELEMENT, BRANCH_PAGE, BUCKET_HEADER,
    BUCKET_LEAF, LEAF_ELEMENT, LEAF_PAGE, META_LEN, META_PAGE, PAGE_HEADER,
};

/// The deepest tree accepted (bbolt's trees of any real size are a handful of levels deep).
const MAX_DEPTH: usize = 64;

/// The page sizes tried for the second meta page when the first is unreadable.
const PAGE_SIZES: [u32; 6] = [4096, 8192, 16384, 32768, 65536, 1024];

/// A bucket: its root page, or its whole tree inline (one leaf page inside its parent's value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bucket {
    /// The root page's id.
    Paged(u64),
    /// The inline page's bytes.
    Inline(Vec<u8>),
}

impl Bucket {
    /// The bucket a bucket-flagged leaf value describes.
    ///
    /// # Errors
    /// A value shorter than a bucket header.
    pub fn from_value(value: &[u8]) -> io::Result<Bucket> {
        let root =
            u64_at(value, 0).map_err(|_| corrupt("a bucket value shorter than its header"))?;
        Ok(if root == 0 {
            Bucket::Inline(value.get(BUCKET_HEADER..).unwrap_or_default().to_vec())
        } else {
            Bucket::Paged(root)
        })
    }
}

/// What a key holds: a value, or a nested bucket.
#[derive(Debug)]
pub enum Entry<'a> {
    /// A plain value.
    Value(&'a [u8]),
    /// A nested bucket.
    Bucket(Bucket),
}

/// An open bbolt file.
pub struct Db {
    file: File,
    meta: Meta,
    page_size: u64,
}

impl Db {
    /// Opens the database in the first `len` bytes of `file` (an etcd snapshot may carry a
    /// checksum after them).
    ///
    /// # Errors
    /// No valid meta page, or a meta page that points outside the file.
    pub fn open(file: File, len: u64) -> io::Result<Db> {
        let read_meta = |at: u64| -> io::Result<Meta> {
            let mut b = [0u8; PAGE_HEADER + META_LEN];
            if at + b.len() as u64 > len {
                return Err(corrupt("the file is shorter than a meta page"));
            }
            file.read_exact_at(&mut b, at)?;
            let header = PageHeader::parse(&b)?;
            if header.flags != META_PAGE {
                return Err(corrupt("page 0 or 1 is not a meta page"));
            }
            Meta::parse(&b[PAGE_HEADER..])
        };
        let first = read_meta(0);
        let sizes: Vec<u32> = match &first {
            Ok(m) => vec![m.page_size],
            Err(_) => PAGE_SIZES.to_vec(),
        };
        let second = sizes
            .iter()
            .map(|size| read_meta(u64::from(*size)))
            .find(|m| m.as_ref().is_ok_and(|m| sizes.contains(&m.page_size)));
        let meta = match (first, second) {
            (Ok(a), Some(Ok(b))) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Ok(a), _) => a,
            (Err(_), Some(Ok(b))) => b,
            (Err(e), _) => return Err(e),
        };
        let page_size = u64::from(meta.page_size);
        if !(512..=1 << 20).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(corrupt(format!("page size {page_size}")));
        }
        let needed = meta.pgid.saturating_mul(page_size);
        if needed > len {
            return Err(corrupt(format!(
                "truncated: the database spans {needed} bytes, the file holds {len}"
            )));
        }
        if meta.root < 2 || meta.root >= meta.pgid {
            return Err(corrupt(format!("root page {} out of range", meta.root)));
        }
        Ok(Db {
            file,
            meta,
            page_size,
        })
    }

    /// The meta page in use.
    pub fn meta(&self) -> Meta {
        self.meta
    }

    /// The database's size in bytes (bbolt's `Tx.Size`): pages in use times the page size.
    pub fn size(&self) -> u64 {
        self.meta.pgid * self.page_size
    }

    /// The root bucket, whose keys name the top-level buckets.
    pub fn root(&self) -> Bucket {
        Bucket::Paged(self.meta.root)
    }

    /// The top-level bucket `name`, if there is one.
    ///
    /// # Errors
    /// A corrupt page, or `name` holding a value instead of a bucket.
    pub fn bucket(&self, name: &[u8]) -> io::Result<Option<Bucket>> {
        let mut found = None;
        self.for_each(&self.root(), &mut |k, entry| {
            if k == name {
                match entry {
                    Entry::Bucket(b) => found = Some(b),
                    Entry::Value(_) => return Err(corrupt("a top-level key that is not a bucket")),
                }
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Visits `bucket`'s keys in order, with what each holds.
    ///
    /// # Errors
    /// A read failure, a corrupt page, keys out of order, or what `visit` returns.
    pub fn for_each(
        &self,
        bucket: &Bucket,
        visit: &mut dyn FnMut(&[u8], Entry) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut walk = Walk {
            db: self,
            pages_left: self.meta.pgid,
            last_key: None,
            visit,
        };
        match bucket {
            Bucket::Paged(id) => {
                let page = self.page(*id)?;
                walk.page(&page, 0)
            }
            Bucket::Inline(page) => {
                let header = PageHeader::parse(page)?;
                if header.flags != LEAF_PAGE {
                    return Err(corrupt("an inline bucket that is not a leaf page"));
                }
                walk.leaf(page, header.count)
            }
        }
    }

    /// Page `id`, whole (with its overflow pages).
    fn page(&self, id: u64) -> io::Result<Vec<u8>> {
        if id < 2 || id >= self.meta.pgid {
            return Err(corrupt(format!("page {id} out of range")));
        }
        let at = id * self.page_size;
        let mut head = [0u8; PAGE_HEADER];
        self.file.read_exact_at(&mut head, at)?;
        let header = PageHeader::parse(&head)?;
        if header.id != id {
            return Err(corrupt(format!(
                "page {id} calls itself page {}",
                header.id
            )));
        }
        let pages = u64::from(header.overflow) + 1;
        if id + pages > self.meta.pgid {
            return Err(corrupt(format!("page {id} overflows past the end")));
        }
        let len = usize::try_from(pages * self.page_size)
            .map_err(|_| corrupt(format!("page {id} too large")))?;
        let mut page = vec![0u8; len];
        self.file.read_exact_at(&mut page, at)?;
        Ok(page)
    }
}

/// One in-order visit of a bucket's tree.
struct Walk<'a, 'v> {
    db: &'a Db,
    /// Pages that may still be read: a tree with a cycle ends here instead of looping.
    pages_left: u64,
    last_key: Option<Vec<u8>>,
    visit: &'v mut dyn FnMut(&[u8], Entry) -> io::Result<()>,
}

impl Walk<'_, '_> {
    fn page(&mut self, page: &[u8], depth: usize) -> io::Result<()> {
        if depth > MAX_DEPTH {
            return Err(corrupt("a tree deeper than any bbolt writes"));
        }
        self.pages_left = self
            .pages_left
            .checked_sub(1)
            .ok_or_else(|| corrupt("a tree that visits more pages than the file has"))?;
        let header = PageHeader::parse(page)?;
        match header.flags {
            LEAF_PAGE => self.leaf(page, header.count),
            BRANCH_PAGE => {
                for i in 0..usize::from(header.count) {
                    let child = u64_at(page, PAGE_HEADER + i * BRANCH_ELEMENT + 8)?;
                    let child = self.db.page(child)?;
                    self.page(&child, depth + 1)?;
                }
                Ok(())
            }
            other => Err(corrupt(format!(
                "page {} has type {other:#x} inside a tree",
                header.id
            ))),
        }
    }

    fn leaf(&mut self, page: &[u8], count: u16) -> io::Result<()> {
        for i in 0..usize::from(count) {
            let element = PAGE_HEADER + i * LEAF_ELEMENT;
            let flags = u32_at(page, element)?;
            let pos = u32_at(page, element + 4)? as usize;
            let key_len = u32_at(page, element + 8)? as usize;
            let value_len = u32_at(page, element + 12)? as usize;
            let key_at = element.saturating_add(pos);
            let value_at = key_at.saturating_add(key_len);
            let (key, value) = page
                .get(key_at..value_at)
                .zip(page.get(value_at..value_at.saturating_add(value_len)))
                .ok_or_else(|| corrupt("a leaf element past the end of its page"))?;
            if self.last_key.as_deref().is_some_and(|last| last >= key) {
                return Err(corrupt("keys out of order"));
            }
            self.last_key = Some(key.to_vec());
            let entry = if flags & BUCKET_LEAF != 0 {
                Entry::Bucket(Bucket::from_value(value)?)
            } else {
                Entry::Value(value)
            };
            (self.visit)(key, entry)?;
        }
        Ok(())
    }
}
