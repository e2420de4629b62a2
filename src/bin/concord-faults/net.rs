//! The suite's network: one Linux network namespace per member, joined by veth pairs to a
//! bridge in the root namespace, where the suite's clients live.
//!
//! Why namespaces: on loopback every peer connection comes from 127.0.0.1 with a random port,
//! so a firewall rule cannot tell members apart. With a namespace each member has its own
//! address and its own iptables, and a partition is a set of `DROP` rules in the receiving
//! member's INPUT chain: `cut(a, b)` drops what `a` sends to `b` (a one-way cut), both
//! directions make a partition. The clients' address (`.254`) is never cut, so the suite can
//! always reach a partitioned member, which is how it checks that a minority serves no writes.
//! Needs root, `ip` (iproute2) and `iptables`.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// The bridge, namespaces and veth links of one run; removed on drop.
pub struct Net {
    id: u32,
    members: usize,
}

impl Net {
    /// Creates the bridge and `members` namespaces; `id` (1..=250) keeps concurrent runs apart.
    pub fn create(id: u32, members: usize) -> Result<Net> {
        let net = Net { id, members };
        net.remove();
        let bridge = net.bridge();
        sh(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", net.client_ip()),
            "dev",
            &bridge,
        ])?;
        sh(&["ip", "link", "set", &bridge, "up"])?;
        for m in 0..members {
            let (ns, host, inner) = (net.ns(m), format!("cf{id}h{m}"), format!("cf{id}n{m}"));
            sh(&["ip", "netns", "add", &ns])?;
            sh(&[
                "ip", "link", "add", &host, "type", "veth", "peer", "name", &inner,
            ])?;
            sh(&["ip", "link", "set", &inner, "netns", &ns])?;
            sh(&["ip", "link", "set", &host, "master", &bridge])?;
            sh(&["ip", "link", "set", &host, "up"])?;
            let addr = format!("{}/24", net.ip(m));
            sh(&["ip", "-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            sh(&["ip", "-n", &ns, "link", "set", &inner, "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("cfbr{}", self.id)
    }

    /// The namespace member `m` runs in.
    pub fn ns(&self, m: usize) -> String {
        format!("cf{}m{m}", self.id)
    }

    /// Member `m`'s address.
    pub fn ip(&self, m: usize) -> String {
        format!("10.213.{}.{}", self.id, m + 1)
    }

    /// The clients' address on the bridge.
    pub fn client_ip(&self) -> String {
        format!("10.213.{}.254", self.id)
    }

    /// Drops every packet `from` sends to `to`.
    pub fn cut(&self, from: usize, to: usize) -> Result<()> {
        self.cut_many(&[from], to)
    }

    /// Drops every packet any of `from` sends to `to`: one `iptables` call, so a partition
    /// takes effect in a few milliseconds, not one process per link.
    fn cut_many(&self, from: &[usize], to: usize) -> Result<()> {
        let ns = self.ns(to);
        let src = from
            .iter()
            .map(|m| self.ip(*m))
            .collect::<Vec<_>>()
            .join(",");
        sh(&[
            "ip", "netns", "exec", &ns, "iptables", "-A", "INPUT", "-s", &src, "-j", "DROP",
        ])
    }

    /// Cuts every link between the groups, both ways.
    pub fn partition(&self, groups: &[Vec<usize>]) -> Result<()> {
        for (i, group) in groups.iter().enumerate() {
            let others: Vec<usize> = groups
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, g)| g.iter().copied())
                .collect();
            if others.is_empty() {
                continue;
            }
            for to in group {
                self.cut_many(&others, *to)?;
            }
        }
        Ok(())
    }

    /// Removes every cut.
    pub fn heal(&self) -> Result<()> {
        for m in 0..self.members {
            sh(&[
                "ip",
                "netns",
                "exec",
                &self.ns(m),
                "iptables",
                "-F",
                "INPUT",
            ])?;
        }
        Ok(())
    }

    fn remove(&self) {
        for m in 0..self.members.max(5) {
            let _ = sh(&["ip", "netns", "del", &self.ns(m)]);
            let _ = sh(&["ip", "link", "del", &format!("cf{}h{m}", self.id)]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge()]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Whether this machine can build the network (root, `ip`, `iptables`).
pub fn available() -> Result<()> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .context("running id")?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        bail!("the fault suite needs root (network namespaces and iptables)");
    }
    for tool in ["ip", "iptables"] {
        sh(&[tool, "-V"]).with_context(|| format!("`{tool}` is missing"))?;
    }
    Ok(())
}

fn sh(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
