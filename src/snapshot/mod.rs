//! Snapshot files, offline: `concord snapshot restore` builds the data dir of a member of a new
//! cluster from a file saved with `etcdctl snapshot save` (as `etcdutl snapshot restore` does),
//! and `concord snapshot status` describes a file. Two formats are read: etcd's (its bbolt
//! database, with or without the SHA-256 etcd appends: [`etcd_db`]), which `Maintenance.Snapshot`
//! streams from etcd and from Concord alike, so that data moves between them with every revision
//! kept; and Concord's own (a Raft snapshot of the state, padding, its SHA-256), which Concord
//! saved before it wrote etcd's format.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use sha2::{Digest, Sha256};

use crate::bbolt::Db;
use crate::config;
use crate::etcd_db;
use crate::mvcc::MvccStore;
use crate::raft::snapshots::Record;
use crate::storage::Storage;

/// A snapshot file's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// Concord's own.
    Concord,
    /// etcd's bbolt database.
    Etcd,
}

/// The format of the snapshot file `file`, from its first bytes.
fn format_of(file: &Path) -> anyhow::Result<Format> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(file)
        .with_context(|| format!("reading {}", file.display()))?
        .take(24)
        .read_to_end(&mut head)?;
    // bbolt's first page: a meta page (flag 0x04) whose fields start with its magic number.
    let bbolt = head.get(8..10) == Some(&[4, 0][..])
        && head.get(16..20) == Some(&crate::bbolt::layout::MAGIC.to_le_bytes()[..]);
    if bbolt {
        Ok(Format::Etcd)
    } else if head.starts_with(b"CSNAP") {
        Ok(Format::Concord)
    } else {
        bail!(
            "{} is not a snapshot: neither etcd's database (bbolt) nor a Concord snapshot",
            file.display()
        )
    }
}

/// An opened snapshot file, by format.
enum Source {
    /// etcd's database.
    Etcd(Db),
    /// Concord's own, from its start.
    Concord(std::fs::File),
}

/// Whether an etcd snapshot of `size` bytes ends with a SHA-256 (etcdutl's rule: the database
/// is a whole number of 512-byte sectors, the checksum 32 bytes more).
fn etcd_has_hash(size: u64) -> bool {
    size % 512 == 32
}

/// Opens etcd's database in `file`, with the check of the SHA-256 after it started beside
/// whatever reads it (none with `skip_check`).
fn open_etcd(file: &Path, skip_check: bool) -> anyhow::Result<(Db, Option<DigestCheck>)> {
    let f = std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?;
    let size = f.metadata()?.len();
    let has_hash = etcd_has_hash(size);
    if !has_hash && !skip_check {
        bail!("snapshot missing hash but --skip-hash-check=false");
    }
    let len = if has_hash { size - 32 } else { size };
    let check = if has_hash && !skip_check {
        Some(DigestCheck::start(&f, len)?)
    } else {
        None
    };
    match Db::open(f, len).with_context(|| format!("reading {}", file.display())) {
        Ok(db) => Ok((db, check)),
        Err(e) => checked(Format::Etcd, check, Err(e)),
    }
}

/// The SHA-256 of a file's first bytes against the 32 bytes after them, computed on a thread
/// of its own while the restore reads the same file (the hash was a third of a restore's CPU
/// when it came first). The restore waits for it before its data dir takes its place.
struct DigestCheck(std::thread::JoinHandle<std::io::Result<([u8; 32], [u8; 32])>>);

impl DigestCheck {
    /// Starts hashing the first `len` bytes of `file` (an open handle of the file the restore
    /// reads, so that both read the same file; read at offsets, leaving the handle's position
    /// to the restore).
    fn start(file: &std::fs::File, len: u64) -> anyhow::Result<Self> {
        let file = file.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("snapshot-sha256".into())
            .spawn(move || digest_and_trailer(&file, len))
            .context("starting the checksum thread")?;
        Ok(DigestCheck(thread))
    }

    /// The digest and the trailer.
    fn wait(self) -> anyhow::Result<([u8; 32], [u8; 32])> {
        Ok(self
            .0
            .join()
            .map_err(|_| anyhow!("the checksum thread panicked"))??)
    }
}

/// The SHA-256 of `f`'s first `len` bytes, and the 32 bytes after them, read at offsets.
fn digest_and_trailer(f: &std::fs::File, len: u64) -> std::io::Result<([u8; 32], [u8; 32])> {
    use std::os::unix::fs::FileExt;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let want = usize::try_from((len - at).min(buf.len() as u64)).unwrap_or(buf.len());
        let chunk = &mut buf[..want];
        f.read_exact_at(chunk, at)?;
        hasher.update(&*chunk);
        at += want as u64;
    }
    let mut trailer = [0u8; 32];
    f.read_exact_at(&mut trailer, len)?;
    Ok((hasher.finalize().into(), trailer))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `concord snapshot <command>`.
#[derive(clap::Parser, Debug)]
#[command(
    name = "concord snapshot",
    about = "Restores or inspects a snapshot file"
)]
pub struct SnapshotCli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Builds a new member's data dir from a snapshot file (like `etcdutl snapshot restore`).
    Restore(RestoreArgs),
    /// Prints a snapshot file's hash, revision, total keys and size.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
struct RestoreArgs {
    /// The snapshot file.
    file: PathBuf,
    /// The data dir to create (`<name>.concord` unless given); it must not exist.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// This member's name.
    #[arg(long, default_value = "default")]
    name: String,
    /// The new cluster's members, `name=peerURL,...`.
    #[arg(long, default_value = "default=http://localhost:2380")]
    initial_cluster: String,
    /// The new cluster's token.
    #[arg(long, default_value = "etcd-cluster")]
    initial_cluster_token: String,
    /// This member's peer URLs.
    #[arg(long, default_value = "http://localhost:2380")]
    initial_advertise_peer_urls: String,
    /// Restore even if the file's checksum is missing or wrong.
    #[arg(long)]
    skip_hash_check: bool,
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// The snapshot file.
    file: PathBuf,
    /// Output format: `simple`, `table` or `json`.
    #[arg(short = 'w', long, default_value = "simple")]
    write_out: String,
}

impl SnapshotCli {
    /// Runs the command.
    ///
    /// # Errors
    /// A missing or corrupt file, an existing data dir, bad flags.
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Restore(args) => restore(&args),
            Command::Status(args) => status(&args),
        }
    }
}

/// Opens a snapshot file in Concord's format, with the check of its SHA-256 trailer started
/// beside whatever reads it (none with `skip_check`). Returns the file and its size.
fn open_concord(
    file: &Path,
    skip_check: bool,
) -> anyhow::Result<(std::fs::File, u64, Option<DigestCheck>)> {
    let f = std::fs::File::open(file).with_context(|| format!("reading {}", file.display()))?;
    let size = f.metadata()?.len();
    if size < 32 {
        bail!("snapshot file {} is too short", file.display());
    }
    let check = if skip_check {
        None
    } else {
        Some(DigestCheck::start(&f, size - 32)?)
    };
    Ok((f, size, check))
}

/// Waits for `check`, if any: the file's checksum must match (else etcdutl's error for etcd's
/// format), whatever `read` (the file's reading, done meanwhile) returned; a mismatch explains
/// a failed read best.
fn checked<T>(
    format: Format,
    check: Option<DigestCheck>,
    read: anyhow::Result<T>,
) -> anyhow::Result<T> {
    if let Some(check) = check {
        let (got, trailer) = check.wait()?;
        if got != trailer {
            match format {
                Format::Etcd => bail!("expected sha256 {}, got {}", hex(&trailer), hex(&got)),
                Format::Concord => {
                    bail!("snapshot file integrity check failed: expected sha256 does not match")
                }
            }
        }
    }
    read
}

fn restore(args: &RestoreArgs) -> anyhow::Result<()> {
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.concord", args.name)));
    if data_dir.exists() {
        bail!("data-dir {:?} exists", data_dir.display().to_string());
    }
    let format = format_of(&args.file)?;
    let (source, check) = match format {
        Format::Etcd => {
            let (db, check) = open_etcd(&args.file, args.skip_hash_check)?;
            (Source::Etcd(db), check)
        }
        Format::Concord => {
            let (file, _, check) = open_concord(&args.file, args.skip_hash_check)?;
            (Source::Concord(file), check)
        }
    };
    let cfg = config::Config::for_restore(
        &args.name,
        &args.initial_cluster,
        &args.initial_cluster_token,
        &args.initial_advertise_peer_urls,
    );
    let members = cfg.initial_members().map_err(|e| anyhow!(e))?;
    let id = cfg.member_id();
    if !members.contains_key(&id) {
        bail!(
            "couldn't find local name {:?} in the initial cluster configuration",
            args.name
        );
    }
    // Built beside its final place and renamed there once whole: a failed or interrupted
    // restore leaves no data dir behind (a member started on half a state would serve it).
    let parent = data_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".concord-restore-")
        .tempdir_in(parent)
        .context("creating the data dir")?;
    let revision = {
        let storage = Storage::open(staging.path()).context("creating the data dir")?;
        let read = match source {
            Source::Etcd(db) => crate::raft::snapshots::restore_from(&storage, |push| {
                etcd_db::import(&db, &mut |space, key, value| {
                    push(Record { space, key, value })
                })
            }),
            Source::Concord(file) => crate::raft::snapshots::restore(&storage, file),
        }
        .with_context(|| format!("restoring {}", args.file.display()));
        let (revision, _) = checked(format, check, read)?;
        let founders = members
            .iter()
            .filter_map(|(id, m)| m.peer_urls.first().map(|u| (*id, u.clone())))
            .collect();
        crate::raft::snapshots::seal_restore(&storage, &founders)
            .context("sealing the restored state")?;
        storage.save_identity(id, config::cluster_id(members.keys()))?;
        revision
    };
    std::fs::rename(staging.path(), &data_dir)
        .with_context(|| format!("moving the restored state to {}", data_dir.display()))?;
    // The rename took the directory: nothing is left for the guard to remove.
    let _ = staging.keep();
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", parent.display()))?;
    tracing::info!(
        path = %args.file.display(),
        data_dir = %data_dir.display(),
        member_id = format!("{id:x}"),
        revision,
        "restored snapshot"
    );
    Ok(())
}

fn status(args: &StatusArgs) -> anyhow::Result<()> {
    if format_of(&args.file)? == Format::Etcd {
        let (db, check) = open_etcd(&args.file, true)?;
        let read = etcd_db::status(&db).with_context(|| format!("reading {}", args.file.display()));
        let s = checked(Format::Etcd, check, read)?;
        return print_status(
            &args.write_out,
            s.hash,
            s.revision,
            s.total_keys,
            s.total_size,
        );
    }
    let (file, size, check) = open_concord(&args.file, false)?;
    // Beside the file, not in /tmp (often memory): the state is written out to be hashed.
    let beside = args.file.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = tempfile::tempdir_in(beside.unwrap_or(Path::new(".")))?;
    let storage = Storage::open(dir.path())?;
    let read = crate::raft::snapshots::restore(&storage, file)
        .with_context(|| format!("reading {}", args.file.display()));
    let (_, keys) = checked(Format::Concord, check, read)?;
    let mvcc = MvccStore::open(storage.clone())?;
    let (hash, _, revision) = mvcc.hash_kv(0).map_err(|e| anyhow!(e))?;
    print_status(&args.write_out, hash, revision, keys, size)
}

/// Prints a status line or table as etcdutl does, in format `write_out`.
fn print_status(
    write_out: &str,
    hash: u32,
    revision: i64,
    keys: u64,
    size: u64,
) -> anyhow::Result<()> {
    let size = size as usize;
    match write_out {
        "json" => println!(
            r#"{{"hash":{hash},"revision":{revision},"totalKey":{keys},"totalSize":{size}}}"#
        ),
        "table" => {
            let line = "+----------+----------+------------+------------+";
            println!("{line}\n|   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |\n{line}");
            println!(
                "| {hash:08x} | {revision:>8} | {keys:>10} | {:>10} |\n{line}",
                human(size)
            );
        }
        _ => println!("{hash:x}, {revision}, {keys}, {}", human(size)),
    }
    Ok(())
}

/// Bytes as etcdctl prints sizes (go-humanize's rule: SI units, a tenth rounded half up, one
/// decimal below 10, none from 10: `20 kB`, `2.1 MB`).
fn human(bytes: usize) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let value = (value * 10.0 + 0.5).floor() / 10.0;
    let unit = units.get(unit).copied().unwrap_or("B");
    if value < 10.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_etcdutl_prints_them() {
        assert_eq!(human(5), "5 B");
        assert_eq!(human(999), "999 B");
        assert_eq!(human(20_480), "20 kB");
        assert_eq!(human(2_097_152), "2.1 MB");
        assert_eq!(human(25_165_824), "25 MB");
    }

    #[test]
    fn etcd_snapshots_carry_a_hash_when_their_size_says_so() {
        assert!(etcd_has_hash(20_512));
        assert!(!etcd_has_hash(20_480));
    }

    /// A file of `body` followed by `trailer`.
    fn file_of(dir: &Path, body: &[u8], trailer: [u8; 32]) -> anyhow::Result<PathBuf> {
        let path = dir.join("snap");
        std::fs::write(&path, [body, &trailer[..]].concat())?;
        Ok(path)
    }

    /// The check of the file at `path`, whose first bytes are `body`.
    fn check_of(path: &Path, body: &[u8]) -> anyhow::Result<DigestCheck> {
        DigestCheck::start(&std::fs::File::open(path)?, body.len() as u64)
    }

    #[test]
    fn the_checksum_checked_beside_the_read_decides_before_the_reads_result() -> anyhow::Result<()>
    {
        let dir = tempfile::tempdir()?;
        let body = vec![5u8; 100_000];
        let good: [u8; 32] = Sha256::digest(&body).into();
        let path = file_of(dir.path(), &body, good)?;
        let check = Some(check_of(&path, &body)?);
        assert_eq!(checked(Format::Concord, check, Ok(7))?, 7);
        // A good checksum leaves a failed read's error as it is.
        let check = Some(check_of(&path, &body)?);
        let err = checked::<()>(Format::Concord, check, Err(anyhow!("the read failed")));
        assert_eq!(
            err.err().map(|e| e.to_string()),
            Some("the read failed".into())
        );

        let mut bad = good;
        bad[31] ^= 1;
        let path = file_of(dir.path(), &body, bad)?;
        // A bad one is the error, whatever the read gave: etcdutl's words for etcd's format.
        for read in [Ok(()), Err(anyhow!("the read failed"))] {
            let check = Some(check_of(&path, &body)?);
            let err = checked(Format::Etcd, check, read)
                .err()
                .map(|e| e.to_string());
            assert_eq!(
                err,
                Some(format!("expected sha256 {}, got {}", hex(&bad), hex(&good)))
            );
        }
        let check = Some(check_of(&path, &body)?);
        let err = checked(Format::Concord, check, Ok(()))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("snapshot file integrity check failed: expected sha256 does not match")
        );
        // Skipped: no check, the read decides.
        assert_eq!(checked(Format::Etcd, None, Ok(3))?, 3);
        Ok(())
    }
}
