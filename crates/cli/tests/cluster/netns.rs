//! A network namespace for one replica, joined to the test's own namespace by a veth pair with
//! addresses in a private /30 (10.200.0.0/16, used only on this machine), so a test can cut that
//! replica off (every packet to and from it is lost) and heal the cut.
//!
//! Needs root and iproute2's `ip`; [`Netns::create`] returns `None` (after saying why, loudly)
//! where namespaces cannot be made, and the caller skips, unless `UPRIGHT_REQUIRE_NETNS` is set
//! (`.ci/run` sets it), which turns the skip into a failure. Everything made is removed on drop, also
//! when the test fails.

use std::process::Command;

/// One namespace and the veth pair into it.
pub struct Netns {
    /// Namespace name (for `ip netns exec`).
    pub name: String,
    /// Host end of the veth pair (its link state is the cut).
    host_if: String,
    /// Address of the host end: the other replicas listen here.
    pub host_addr: String,
    /// Address of the namespace end: the replica inside listens here.
    pub ns_addr: String,
}

/// Runs `ip args...`; the error names the command and what it printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// With this environment variable set (CI sets it), a skip is a failure instead.
pub const REQUIRE_ENV: &str = "UPRIGHT_REQUIRE_NETNS";

fn skip(reason: &str) -> Option<Netns> {
    if std::env::var_os(REQUIRE_ENV).is_some() {
        panic!("{REQUIRE_ENV} is set but the network-namespace partition test cannot run: {reason}");
    }
    eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! SKIPPED: network-namespace partition test cannot run here: {reason}");
    eprintln!("!!! (it needs root and iproute2's `ip`; CI runs as root and installs iproute2)");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
    None
}

impl Netns {
    /// Makes the namespace (loopback up), the veth pair and their addresses. Names and the /30 are
    /// derived from the test process's pid, so concurrent test runs on one machine do not collide.
    pub fn create() -> Option<Netns> {
        if unsafe { libc::geteuid() } != 0 {
            return skip("not running as root");
        }
        let pid = std::process::id();
        let subnet = pid % 16_384; // 16,384 /30s in 10.200.0.0/16
        let (a, b) = (subnet / 64, (subnet % 64) * 4);
        let net = Netns {
            name: format!("upright-{pid}"),
            host_if: format!("uprh{pid}"),
            host_addr: format!("10.200.{a}.{}", b + 1),
            ns_addr: format!("10.200.{a}.{}", b + 2),
        };
        let ns_if = format!("uprn{pid}");
        // Leftovers of an earlier run that had this pid and was killed before its drop ran.
        let _ = ip(&["link", "del", &net.host_if]);
        let _ = ip(&["netns", "del", &net.name]);
        if let Err(e) = ip(&["netns", "add", &net.name]) {
            return skip(&e);
        }
        // From here on, drop removes whatever was made.
        let (host_cidr, ns_cidr) = (format!("{}/30", net.host_addr), format!("{}/30", net.ns_addr));
        let setup = [
            vec!["link", "add", &net.host_if, "type", "veth", "peer", "name", &ns_if],
            vec!["link", "set", &ns_if, "netns", &net.name],
            vec!["addr", "add", &host_cidr, "dev", &net.host_if],
            vec!["link", "set", &net.host_if, "up"],
        ];
        let inside = [
            vec!["addr", "add", &ns_cidr, "dev", &ns_if],
            vec!["link", "set", &ns_if, "up"],
            vec!["link", "set", "lo", "up"],
        ];
        let prefix = ["-n", net.name.as_str()];
        for args in &setup {
            if let Err(e) = ip(args) {
                return skip(&e);
            }
        }
        for args in &inside {
            let args: Vec<&str> = prefix.iter().copied().chain(args.iter().copied()).collect();
            if let Err(e) = ip(&args) {
                return skip(&e);
            }
        }
        Some(net)
    }

    /// Cuts the namespace off: the host end goes down, the namespace end loses its carrier, and
    /// every packet either way is lost (TCP keeps its connections and retransmits after the heal).
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_if, "down"]).unwrap();
    }

    /// Heals the cut.
    pub fn heal(&self) {
        ip(&["link", "set", &self.host_if, "up"]).unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting one end deletes the pair; a namespace still used by a process lives on
        // (nameless) until that process exits, which the cluster's own drop sees to.
        let _ = ip(&["link", "del", &self.host_if]);
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}
