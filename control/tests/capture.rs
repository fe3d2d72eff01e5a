//! `POST /capture` on a real admin API, its client, and a pipeline standing in for a worker:
//! no privileges needed. The end-to-end tests on the testbed are `lab/tests/capture.rs`.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
use strait_control::capture::{run, Ask};
use strait_control::shared::Shared;
use strait_dataplane::pipeline::Verdict;

/// The admin API over the built-in example's table with one worker slot, on 127.0.0.1;
/// and the control loop's end of its requests (none here).
fn endpoint() -> (
    std::net::SocketAddr,
    Arc<Shared>,
    std::sync::mpsc::Receiver<strait_control::admin::Request>,
) {
    let cfg = strait_config::example();
    let ports: Vec<_> = cfg
        .gateway
        .interfaces
        .iter()
        .map(|_| {
            strait_dataplane::table::Port::new(
                strait_config::model::MacAddr([2, 0, 0, 0, 0, 1]),
                1500,
            )
        })
        .collect();
    let table = strait_dataplane::table::Builder::new()
        .build(&cfg, &ports, |_, _, _| false)
        .unwrap();
    let cores = vec![Arc::new(strait_control::cores::CoreStats::default())];
    let shared = Arc::new(Shared::new(cfg, Arc::new(table), Arc::default(), cores));
    let (tx, rx) = std::sync::mpsc::channel();
    let addr =
        strait_control::admin::start("127.0.0.1:0".parse().unwrap(), Arc::clone(&shared), tx)
            .unwrap();
    (addr, shared, rx)
}

/// `request` as it is, and the whole answer.
fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// A worker: runs SYNs from the client to the example's VIP through a pipeline tapped
/// into the hub, batch after batch, until `stop`.
fn worker(shared: Arc<Shared>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut pipe = strait_dataplane::pipeline::Pipeline::new(0, 1, 1024, Default::default(), 0)
            .with_capture(shared.capture.tap(0));
        let mut frame = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0xc1], [2, 0, 0, 0, 0, 1])
            .ipv4([192, 0, 2, 2], [203, 0, 113, 10], 64)
            .tcp(40000, 80, 1, 65535)
            .syn()
            .write(&mut frame, &[])
            .unwrap();
        let head = strait_dataplane::rewrite::HEADROOM;
        let mut buf = vec![0u8; head + 2048];
        let mut batches = 0;
        while !stop.load(Ordering::Relaxed) {
            buf[head..head + frame.len()].copy_from_slice(&frame);
            let mut f = [strait_dataplane::rewrite::Frame::new(
                &mut buf,
                head,
                frame.len(),
            )];
            let mut v = [Verdict::Pass];
            let table = shared.table.load();
            pipe.process_batch(&table, batches * 1_000_000, 0, &mut f, &mut v);
            batches += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        batches
    })
}

#[test]
fn the_admin_api_streams_a_capture_and_disarms_however_it_ends() {
    let (addr, shared, _requests) = endpoint();
    let stop = Arc::new(AtomicBool::new(false));
    let w = worker(Arc::clone(&shared), Arc::clone(&stop));
    // Refusals are whole answers naming the problem.
    let bad = raw(addr, "POST /capture?verdict=maybe HTTP/1.1\r\n\r\n");
    assert!(
        bad.starts_with("HTTP/1.1 400") && bad.contains("verdict=maybe"),
        "{bad}"
    );
    assert!(raw(addr, "GET /capture HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));

    // The client, for three frames, into a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.pcapng");
    let admin = strait_control::status::Admin::tcp(addr);
    let ask = Ask {
        port: Some(80),
        count: Some(3),
        ..Ask::default()
    };
    let never = AtomicBool::new(false);
    let frames = run(&admin, &ask, &file, &never).unwrap();
    assert_eq!(frames, 3);
    assert!(!shared.capture.is_armed(), "disarmed at its count");
    let bytes = std::fs::read(&file).unwrap();
    let mut r = pcap_file::pcapng::PcapNgReader::new(&bytes[..]).unwrap();
    let mut comments = Vec::new();
    while let Some(b) = r.next_block() {
        if let pcap_file::pcapng::Block::EnhancedPacket(p) = b.unwrap() {
            for o in &p.options {
                if let EnhancedPacketOption::Comment(c) = o {
                    comments.push(c.to_string());
                }
            }
        }
    }
    assert_eq!(comments.len(), 6, "{comments:#?}");
    assert!(
        comments[0].starts_with("in core=0 port=")
            && comments[0].contains("verdict=tx service=web"),
        "{comments:#?}"
    );
    assert!(
        comments[1].starts_with("out verdict=tx service=web backend="),
        "{comments:#?}"
    );

    // A client that goes away: the capture is disarmed, and a second one meanwhile refused.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"POST /capture HTTP/1.1\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert!(shared.capture.is_armed());
    assert!(raw(addr, "POST /capture HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 409"));
    drop(c);
    let gone = Instant::now();
    while shared.capture.is_armed() {
        assert!(
            gone.elapsed() < Duration::from_secs(2),
            "still armed after its client left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    assert!(w.join().unwrap() > 0);
    let m = raw(addr, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(m.contains("strait_capture_armed 0"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with("strait_capture_frames_total{")
                && l.contains("result=\"captured\"")
                && !l.ends_with(" 0")),
        "{m}"
    );
}
