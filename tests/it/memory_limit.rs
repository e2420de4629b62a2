//! A kernel-enforced bound on how much more memory a running process may take: a memory cgroup
//! (v2 `memory.max`, or v1 `memory.limit_in_bytes`) that the process is moved into. Only where
//! the machine lets the tests make one (root, a writable memory controller); elsewhere
//! [`MemoryLimit::on`] answers `None` and a test falls back to sampling the process's memory.

use std::path::PathBuf;

/// A memory cgroup holding one process; the process is moved back out and the cgroup removed
/// when this is dropped.
pub struct MemoryLimit {
    dir: PathBuf,
    parent_procs: PathBuf,
    pid: u32,
}

impl MemoryLimit {
    /// Moves `pid` into a new memory cgroup in which it may take `extra_bytes` more than it
    /// holds now (anonymous memory and the page cache it touches alike), or `None` where no
    /// cgroup can be made.
    pub fn on(pid: u32, extra_bytes: u64) -> Option<MemoryLimit> {
        Self::v2(pid, extra_bytes).or_else(|| Self::v1(pid, extra_bytes))
    }

    /// cgroup v2. Charges made before the move stay behind (in v1 too: moving them went away
    /// with the kernel's 6.x series), so the limit is the growth alone.
    fn v2(pid: u32, extra_bytes: u64) -> Option<MemoryLimit> {
        let root = PathBuf::from("/sys/fs/cgroup").join(own_cgroup(pid, "")?);
        let controllers = std::fs::read_to_string(root.join("cgroup.subtree_control")).ok()?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return None;
        }
        let limit = Self::make(root, pid)?;
        std::fs::write(limit.dir.join("memory.swap.max"), "0").ok();
        std::fs::write(limit.dir.join("memory.max"), extra_bytes.to_string()).ok()?;
        limit.enter()
    }

    /// cgroup v1, as v2.
    fn v1(pid: u32, extra_bytes: u64) -> Option<MemoryLimit> {
        let root = PathBuf::from("/sys/fs/cgroup/memory").join(own_cgroup(pid, "memory")?);
        let limit = Self::make(root, pid)?;
        std::fs::write(
            limit.dir.join("memory.limit_in_bytes"),
            extra_bytes.to_string(),
        )
        .ok()?;
        limit.enter()
    }

    /// A child of the cgroup `pid` is in (`root`), so that the limits above it still hold.
    fn make(root: PathBuf, pid: u32) -> Option<MemoryLimit> {
        let dir = root.join(format!("concord-test-{pid}"));
        std::fs::create_dir(&dir).ok()?;
        Some(MemoryLimit {
            dir,
            parent_procs: root.join("cgroup.procs"),
            pid,
        })
    }

    fn enter(self) -> Option<MemoryLimit> {
        std::fs::write(self.dir.join("cgroup.procs"), self.pid.to_string())
            .ok()
            .map(|()| self)
    }

    /// Whether the kernel killed a process of this cgroup for exceeding the limit.
    pub fn oom_killed(&self) -> bool {
        let events = std::fs::read_to_string(self.dir.join("memory.events"))
            .or_else(|_| std::fs::read_to_string(self.dir.join("memory.oom_control")))
            .unwrap_or_default();
        events.lines().any(|l| {
            l.strip_prefix("oom_kill ")
                .is_some_and(|n| n.trim().parse::<u64>().is_ok_and(|n| n > 0))
        })
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.parent_procs, self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The cgroup of `pid` under `controller` (`""`: the v2 hierarchy), relative to its mount.
fn own_cgroup(pid: u32, controller: &str) -> Option<String> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if controller.is_empty() {
            names.is_empty()
        } else {
            names.split(',').any(|n| n == controller)
        };
        matches.then(|| path.trim_start_matches('/').to_string())
    })
}
