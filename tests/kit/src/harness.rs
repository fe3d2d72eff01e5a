//! What the privileged tests do the same way: run commands with errors that name them,
//! make network namespaces and veths that are removed on drop, start processes that are
//! killed (by pid) on drop, poll with a deadline, take the test binary's serial lock,
//! capture with tcpdump and read captures with tshark, checksums verified.
//!
//! Every guard here exists as soon as the thing it removes does, so a test that fails
//! half-way still cleans up.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::{Mutex, MutexGuard};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// A binary of this workspace, `target/<profile>/NAME`, beside the running test binary
/// (`target/<profile>/deps/TEST-hash`). A test of one package cannot name another
/// package's binary with `CARGO_BIN_EXE_*`; `cargo test --workspace` builds every binary
/// before it runs a test, and `cargo build --bins` does for a narrower run.
///
/// # Panics
///
/// When the binary is not there, saying how to build it.
pub fn workspace_binary(name: &str) -> &'static str {
    static FOUND: Mutex<Vec<(String, &'static str)>> = Mutex::new(Vec::new());
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = found.iter().find(|(n, _)| n == name) {
        return path;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace --bins` (or `cargo test --workspace`) first",
        path.display()
    );
    let path: &'static str = Box::leak(path.display().to_string().into_boxed_str());
    found.push((name.to_owned(), path));
    path
}

/// The gateway binary, `strait`.
pub fn strait() -> &'static str {
    workspace_binary("strait")
}

/// The lab binary, `strait-lab` (testbed, generator, sink, benches).
pub fn lab() -> &'static str {
    workspace_binary("strait-lab")
}
/// Debian's Python, the one with scapy (see `privileged::PYTHON`).
pub const PYTHON: &str = "/usr/bin/python3";

static SERIAL: Mutex<()> = Mutex::new(());

/// The serial lock of this test binary, if `gate` (asked with the lock held) lets the test
/// run. Traffic tests run one at a time: their forwarders busy-poll and they count exact
/// packets and rates, so two on a two-core machine would measure each other. A test that
/// failed while holding the lock does not stop the others.
pub fn serial_if(gate: impl FnOnce() -> bool) -> Option<MutexGuard<'static, ()>> {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    gate().then_some(serial)
}

/// Bytes as text, invalid UTF-8 replaced.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `ip` with `args`, for tests that report set-up failures rather than panic; the
/// error carries the command and its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip {}`: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Runs `cmd` to its end; panics naming it when it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs `cmd` and returns its stdout; panics naming it, with its stdout and stderr, unless
/// it exits 0.
pub fn must(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// [`must`] of `program args..`.
pub fn sh(args: &[&str]) -> String {
    must(Command::new(args[0]).args(&args[1..]))
}

/// `args` run in network namespace `ns`. `ip netns exec` execs the program, so a child
/// spawned from it has the program's pid.
pub fn in_ns<S: AsRef<OsStr>>(ns: &str, args: impl IntoIterator<Item = S>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// Polls `f` every 100 ms until it gives a value; panics naming `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        sleep(Duration::from_millis(100));
    }
}

/// Waits until no socket of the calling thread's network namespace has local port `port`
/// (`/proc/thread-self/net/{udp,udp6,tcp,tcp6}`), in any state: a TCP connection in
/// TIME_WAIT on it counts as bound too. A socket its test has closed lives on while
/// a child that another test forked, and that has not yet exec'd, holds a copy of its
/// descriptor: a datagram to its port then reaches it instead of drawing the kernel's port
/// unreachable, and a connection is accepted instead of refused. Run it before a test that
/// counts on a closed port.
///
/// # Panics
/// When the port is still bound after 10 s.
pub fn wait_port_closed(port: u16) {
    let suffix = format!(":{port:04X}");
    wait_for(
        &format!("port {port} closed"),
        Duration::from_secs(10),
        || {
            let bound = ["udp", "udp6", "tcp", "tcp6"].iter().any(|table| {
                std::fs::read_to_string(format!("/proc/thread-self/net/{table}"))
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_whitespace().nth(1))
                    .any(|local| local.ends_with(&suffix))
            });
            (!bound).then_some(())
        },
    );
}

/// The transport a free port is picked for ([`free_addr`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A TCP port.
    Tcp,
    /// A UDP port.
    Udp,
}

/// An address of the calling thread's loopback (127.0.0.1) whose port no socket holds: for
/// a server a test is about to start, or for a connection that must be refused. The kernel
/// picks the port for a socket bound to port 0, which is then closed, and
/// [`wait_port_closed`] waits until no forked child still holds that socket. Another process
/// may still take the port before the server binds it; ports picked this way come from the
/// ephemeral range, which tests do not bind on purpose.
///
/// # Panics
/// When binding fails, or the port is still bound after 10 s.
pub fn free_addr(transport: Transport) -> std::net::SocketAddr {
    let any = "127.0.0.1:0";
    let addr = match transport {
        Transport::Tcp => std::net::TcpListener::bind(any).and_then(|l| l.local_addr()),
        Transport::Udp => std::net::UdpSocket::bind(any).and_then(|s| s.local_addr()),
    }
    .expect("a free loopback port");
    wait_port_closed(addr.port());
    addr
}

/// The network namespaces named `{prefix}-...` that exist now.
pub fn namespaces(prefix: &str) -> BTreeSet<String> {
    let start = format!("{prefix}-");
    sh(&["ip", "netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&start))
        .map(str::to_owned)
        .collect()
}

// ---- processes -------------------------------------------------------------------------

/// A process the test started; killed (by its pid) and reaped on drop unless it was
/// waited for.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    what: String,
}

impl Proc {
    /// Spawns `cmd`; panics naming it when it cannot be started.
    pub fn spawn(cmd: &mut Command) -> Proc {
        let what = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Proc {
            child: Some(child),
            what,
        }
    }

    /// The command line, for messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// The running child (its pipes, `try_wait`).
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the process was waited for")
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("the process was waited for")
            .id()
    }

    /// Sends signal `sig` (`TERM`, `INT`, ...) to it, by pid.
    pub fn signal(&self, sig: &str) {
        sh(&["kill", &format!("-{sig}"), &self.pid().to_string()]);
    }

    /// Waits for it to end, collecting the pipes it still has.
    pub fn wait(mut self) -> Output {
        let child = self.child.take().expect("the process was waited for");
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.what))
    }

    /// SIGTERM, then up to `grace` for it to exit, then SIGKILL; the exit status.
    pub fn stop(&mut self, grace: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("the process was waited for");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        child
            .wait()
            .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.what))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---- files -----------------------------------------------------------------------------

/// A fresh directory under the temporary directory, removed with its contents on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// `$TMPDIR/{name}`, emptied first.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Scratch(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `file` in it.
    pub fn join(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- namespaces and links ----------------------------------------------------------------

/// A network namespace this test made; deleted on drop, and its veths with it.
#[derive(Debug)]
pub struct Netns(String);

impl Netns {
    /// Runs `f` on a thread of its own that entered this namespace (`setns`), and returns
    /// what it returns: the one way tests enter a namespace in-process. Sockets, netlink
    /// reads and AF_XDP rings opened by `f` belong to the namespace; the calling thread
    /// stays where it was.
    ///
    /// # Panics
    ///
    /// When the namespace cannot be entered, or when `f` panics.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        enter_and_run(&self.0, f)
    }

    /// `ip netns add name`, nothing more. The guard exists only once the namespace does,
    /// so a name that someone else holds is never deleted.
    pub fn add(name: &str) -> Netns {
        Netns::try_add(name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Netns::add`] for tests that report a set-up failure (not root) rather than panic.
    ///
    /// # Errors
    /// The command and its stderr.
    pub fn try_add(name: &str) -> Result<Netns, String> {
        ip(&["netns", "add", name])?;
        Ok(Netns(name.to_owned()))
    }

    /// A namespace the kernel keeps quiet in: lo up, IPv6 off (no DAD, MLD or router
    /// solicitations of its own on the wire) and reverse-path filtering off.
    pub fn quiet(name: &str) -> Netns {
        let ns = Netns::add(name);
        for setting in [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ] {
            must(&mut in_ns(name, ["sysctl", "-qw", setting]));
        }
        sh(&["ip", "-n", name, "link", "set", "lo", "up"]);
        ns
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// One end of a veth pair.
#[derive(Debug, Clone, Copy)]
pub struct End<'a> {
    /// The namespace it is in.
    pub ns: &'a str,
    /// The interface name (at most 15 bytes).
    pub name: &'a str,
    /// Its MAC.
    pub mac: &'a str,
    /// Its address with prefix length, `192.0.2.1/24`.
    pub addr: &'a str,
}

/// A veth pair from `a` to `b`, both ends with their MAC and address, and up. It goes
/// with either namespace.
pub fn veth(a: End<'_>, b: End<'_>) {
    for e in [a, b] {
        assert!(e.name.len() <= 15, "interface name {} too long", e.name);
    }
    sh(&[
        "ip", "link", "add", a.name, "netns", a.ns, "address", a.mac, "type", "veth", "peer",
        "name", b.name, "netns", b.ns, "address", b.mac,
    ]);
    for e in [a, b] {
        sh(&["ip", "-n", e.ns, "addr", "add", e.addr, "dev", e.name]);
        sh(&["ip", "-n", e.ns, "link", "set", e.name, "up"]);
    }
}

// ---- captures ----------------------------------------------------------------------------

/// Returns once the tcpdump whose `stderr` this is says it is listening (10 s at most).
/// Its stderr is read to the end by a thread of its own, so tcpdump never blocks on it.
///
/// # Panics
///
/// When tcpdump exits or does not listen within 10 s, with `what` and what it said.
pub fn tcpdump_listening(stderr: std::process::ChildStderr, what: &str) {
    use std::io::{BufRead, BufReader};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut said = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("listening on") => return,
            Ok(line) => said.push(line),
            Err(_) => panic!("{what} is not listening: {}", said.join("\n")),
        }
    }
}

/// tcpdump writing what one interface receives to a file; the file is removed on drop.
#[derive(Debug)]
pub struct Capture {
    pcap: PathBuf,
    tcpdump: Option<Proc>,
}

impl Capture {
    /// The tcpdump of [`Capture::start`], its output file removed first. In immediate mode:
    /// libpcap hands every frame over at once rather than by blocks with a timeout (up to a
    /// second later), so a frame is in the file as soon as tcpdump is scheduled, which
    /// [`while_capturing`] relies on, and no block still open when tcpdump is stopped is
    /// lost.
    fn command(ns: &str, iface: &str, pcap: &Path, opts: &[&str], filter: &[&str]) -> Command {
        let _ = std::fs::remove_file(pcap);
        let mut cmd = in_ns(ns, ["tcpdump", "-U", "-n", "--immediate-mode"]);
        cmd.args(opts)
            .args(["-i", iface, "-w"])
            .arg(pcap)
            .args(filter)
            .stdout(std::process::Stdio::null());
        cmd
    }

    /// `tcpdump -U -n --immediate-mode OPTS.. -i IFACE -w PCAP FILTER..` in namespace `ns`,
    /// returning once it listens ([`tcpdump_listening`]), so that no frame sent afterwards is
    /// missed for a late start on a busy machine.
    ///
    /// # Panics
    ///
    /// As [`tcpdump_listening`].
    pub fn start(ns: &str, iface: &str, pcap: PathBuf, opts: &[&str], filter: &[&str]) -> Capture {
        let mut cmd = Capture::command(ns, iface, &pcap, opts, filter);
        let mut tcpdump = Proc::spawn(cmd.stderr(std::process::Stdio::piped()));
        let stderr = tcpdump.child().stderr.take().expect("piped stderr");
        tcpdump_listening(stderr, &format!("tcpdump on {iface} in {ns}"));
        Capture {
            pcap,
            tcpdump: Some(tcpdump),
        }
    }

    /// Stops tcpdump with SIGINT (it flushes the file) and waits for it.
    pub fn stop(&mut self) {
        if let Some(t) = self.tcpdump.take() {
            let _ = Command::new("kill")
                .args(["-INT", &t.pid().to_string()])
                .status();
            let _ = t.wait();
        }
    }

    /// The capture read by [`tshark_fields`].
    pub fn fields(&self, fields: &[&str], decode_as: Option<&str>) -> Vec<Vec<String>> {
        tshark_fields(&self.pcap, fields, decode_as)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        drop(self.tcpdump.take());
        let _ = std::fs::remove_file(&self.pcap);
    }
}

/// Runs `traffic` while `captures` run (they listen from [`Capture::start`] on), then
/// stops them once their files have stopped growing: a tcpdump that a busy machine
/// schedules late still writes the last packets before it is stopped.
pub fn while_capturing<T>(captures: &mut [Capture], traffic: impl FnOnce() -> T) -> T {
    let out = traffic();
    let sizes = |cs: &[Capture]| -> Vec<u64> {
        cs.iter()
            .map(|c| std::fs::metadata(&c.pcap).map_or(0, |m| m.len()))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = sizes(captures);
    loop {
        sleep(Duration::from_millis(500));
        let now = sizes(captures);
        if now == last || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    for c in captures {
        c.stop();
    }
    out
}

/// tshark's reading of `pcap`: per packet a row of `fields`, with the IPv4, TCP and UDP
/// checksums and SCTP's CRC32c verified (`*.checksum.status`: 1 good, 0 bad, 2
/// unverified) and `decode_as` (`-d`) if given. Panics with tshark's stderr when it fails.
pub fn tshark_fields(pcap: &Path, fields: &[&str], decode_as: Option<&str>) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(pcap);
    for check in ["ip", "tcp", "udp"] {
        c.args(["-o", &format!("{check}.check_checksum:TRUE")]);
    }
    c.args(["-o", "sctp.checksum:CRC 32c"]);
    c.args(["-T", "fields", "-E", "separator=/t"]);
    if let Some(d) = decode_as {
        c.args(["-d", d]);
    }
    for f in fields {
        c.args(["-e", f]);
    }
    must(&mut c)
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// Moves the calling thread into network namespace `name` (`/run/netns/NAME`, or a path);
/// only this thread moves.
///
/// # Panics
///
/// When the namespace cannot be opened or entered (not root).
pub fn enter_netns(name: &str) {
    let path = if name.contains('/') {
        name.to_owned()
    } else {
        format!("/run/netns/{name}")
    };
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns({path}): {e}"));
}

/// Pins the calling thread to CPU `cpu`.
///
/// # Panics
///
/// When the CPU does not exist or is not allowed.
pub fn pin_thread(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap_or_else(|e| panic!("CPU {cpu}: {e}"));
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .unwrap_or_else(|e| panic!("sched_setaffinity(CPU {cpu}): {e}"));
}

/// Runs `f` on a scoped thread that entered network namespace `name` (`/run/netns/NAME`).
///
/// # Panics
///
/// When the namespace cannot be opened or entered, or when `f` panics.
pub fn enter_and_run<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(name);
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}
