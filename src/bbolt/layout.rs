//! bbolt's on-disk structures, all little-endian: the page header, the meta page (two copies,
//! pages 0 and 1, the valid one with the higher transaction id wins), branch and leaf elements,
//! the bucket header, and the meta checksum (64-bit FNV-1a of the meta fields before it).

use std::io;

/// The magic number at the start of a meta page's fields.
pub const MAGIC: u32 = 0xED0C_DAED;
/// The file format version bbolt writes.
pub const VERSION: u32 = 2;
/// Bytes of a page header: id u64, flags u16, count u16, overflow u32.
pub const PAGE_HEADER: usize = 16;
/// Bytes of a branch element: pos u32, key size u32, child page id u64.
pub const BRANCH_ELEMENT: usize = 16;
/// Bytes of a leaf element: flags u32, pos u32, key size u32, value size u32.
pub const LEAF_ELEMENT: usize = 16;
/// Bytes of a bucket header: root page id u64, sequence u64 (an inline bucket's page follows).
pub const BUCKET_HEADER: usize = 16;
/// Bytes of the meta fields covered by the checksum.
pub const META_SUMMED: usize = 56;
/// Bytes of the meta fields, checksum included.
pub const META_LEN: usize = META_SUMMED + 8;
/// The freelist page id bbolt records when it does not keep a freelist on disk.
pub const NO_FREELIST: u64 = u64::MAX;

/// Page flag: a branch page.
pub const BRANCH_PAGE: u16 = 0x01;
/// Page flag: a leaf page.
pub const LEAF_PAGE: u16 = 0x02;
/// Page flag: a meta page.
pub const META_PAGE: u16 = 0x04;
/// Page flag: the freelist.
pub const FREELIST_PAGE: u16 = 0x10;
/// Leaf element flag: the value is a nested bucket.
pub const BUCKET_LEAF: u32 = 0x01;

/// A corrupt-file error.
pub fn corrupt(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("invalid bbolt database: {what}"),
    )
}

/// Little-endian u16 at `at` of `b`.
pub fn u16_at(b: &[u8], at: usize) -> io::Result<u16> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_le_bytes)
        .ok_or_else(|| corrupt(format!("a field at byte {at} past the end of its page")))
}

/// Little-endian u32 at `at` of `b`.
pub fn u32_at(b: &[u8], at: usize) -> io::Result<u32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| corrupt(format!("a field at byte {at} past the end of its page")))
}

/// Little-endian u64 at `at` of `b`.
pub fn u64_at(b: &[u8], at: usize) -> io::Result<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| corrupt(format!("a field at byte {at} past the end of its page")))
}

/// 64-bit FNV-1a, bbolt's meta checksum.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A meta page's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Bytes per page.
    pub page_size: u32,
    /// Meta flags (unused by bbolt today).
    pub flags: u32,
    /// The root bucket's root page.
    pub root: u64,
    /// The root bucket's sequence.
    pub sequence: u64,
    /// The freelist's page, or [`NO_FREELIST`].
    pub freelist: u64,
    /// The high-water mark: the number of pages the database uses.
    pub pgid: u64,
    /// The transaction that wrote this meta.
    pub txid: u64,
}

impl Meta {
    /// Parses and checks the meta fields in `b` (the bytes after a meta page's header).
    ///
    /// # Errors
    /// A wrong magic number, version or checksum.
    pub fn parse(b: &[u8]) -> io::Result<Meta> {
        let fields = b
            .get(..META_LEN)
            .ok_or_else(|| corrupt("a meta page shorter than its fields"))?;
        if u32_at(fields, 0)? != MAGIC {
            return Err(corrupt("no bbolt magic number in the meta page"));
        }
        let version = u32_at(fields, 4)?;
        if version != VERSION {
            return Err(corrupt(format!(
                "file format version {version}, not {VERSION}"
            )));
        }
        if u64_at(fields, META_SUMMED)? != fnv1a64(&fields[..META_SUMMED]) {
            return Err(corrupt("the meta page's checksum does not match"));
        }
        Ok(Meta {
            page_size: u32_at(fields, 8)?,
            flags: u32_at(fields, 12)?,
            root: u64_at(fields, 16)?,
            sequence: u64_at(fields, 24)?,
            freelist: u64_at(fields, 32)?,
            pgid: u64_at(fields, 40)?,
            txid: u64_at(fields, 48)?,
        })
    }

    /// The meta fields as bbolt lays them out, checksum included.
    pub fn encode(&self) -> [u8; META_LEN] {
        let mut out = [0u8; META_LEN];
        let fields: [&[u8]; 9] = [
            &MAGIC.to_le_bytes(),
            &VERSION.to_le_bytes(),
            &self.page_size.to_le_bytes(),
            &self.flags.to_le_bytes(),
            &self.root.to_le_bytes(),
            &self.sequence.to_le_bytes(),
            &self.freelist.to_le_bytes(),
            &self.pgid.to_le_bytes(),
            &self.txid.to_le_bytes(),
        ];
        let mut at = 0;
        for f in fields {
            out[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        let sum = fnv1a64(&out[..META_SUMMED]);
        out[META_SUMMED..].copy_from_slice(&sum.to_le_bytes());
        out
    }
}

/// A page header's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    /// The page's id.
    pub id: u64,
    /// Its type flag.
    pub flags: u16,
    /// Elements on it.
    pub count: u16,
    /// Pages after it that it also spans.
    pub overflow: u32,
}

impl PageHeader {
    /// Parses the header at the start of `b`.
    ///
    /// # Errors
    /// `b` shorter than a header.
    pub fn parse(b: &[u8]) -> io::Result<PageHeader> {
        Ok(PageHeader {
            id: u64_at(b, 0)?,
            flags: u16_at(b, 8)?,
            count: u16_at(b, 10)?,
            overflow: u32_at(b, 12)?,
        })
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; PAGE_HEADER] {
        let mut out = [0u8; PAGE_HEADER];
        out[..8].copy_from_slice(&self.id.to_le_bytes());
        out[8..10].copy_from_slice(&self.flags.to_le_bytes());
        out[10..12].copy_from_slice(&self.count.to_le_bytes());
        out[12..].copy_from_slice(&self.overflow.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_meta_round_trips_and_a_flipped_bit_is_refused() -> io::Result<()> {
        let meta = Meta {
            page_size: 4096,
            flags: 0,
            root: 3,
            sequence: 0,
            freelist: 2,
            pgid: 4,
            txid: 1,
        };
        let mut bytes = meta.encode();
        assert_eq!(Meta::parse(&bytes)?, meta);
        bytes[20] ^= 1;
        assert!(Meta::parse(&bytes).is_err());
        assert!(Meta::parse(&bytes[..10]).is_err());
        Ok(())
    }
}
