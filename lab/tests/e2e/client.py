"""Test client for Strait's end-to-end tests, run inside the testbed's client namespace.

    client.py keepalive VIP N        open N keep-alive HTTP connections, GET once on each and
                                     print the answers; then, for every line on stdin, GET
                                     again on every connection and print the answers, then END
    client.py stream VIP N SECONDS   open N GET /stream connections for SECONDS; print, per
                                     connection, the backend, lines read, the longest gap
                                     between two lines and any error
    client.py udp VIP PORT FIRST N   send one datagram from each of N source ports starting at
                                     FIRST and wait for its echo; print sent/answered counts
    client.py raw IFACE HEX..        write each frame (hex) as is on IFACE (AF_PACKET); print
                                     how many were sent
    client.py udpmap VIP PORT FIRST N  as udp, printing per source port the answer (or -):
                                     "PORT backend=b1 client=IP:PORT"
    client.py churn VIP THREADS SECONDS  open new connections as fast as THREADS threads can for
                                     SECONDS, each one GET with Connection: close; print
                                     "ok=N refused=N failed=N", then per backend "backend=NAME N",
                                     then one "REFUSED T PORT" (connect refused) or "FAILED T
                                     ERROR" (any other error) line per failed connection, T
                                     the monotonic time its connect began, PORT its own
    client.py rate VIP PER_SECOND SECONDS  open a new connection PER_SECOND times a second
                                     for SECONDS, GET / on each and close it; print per
                                     connection the wall-clock time it was opened and the
                                     answer: "TIME backend=b1 client=IP:PORT" (or "TIME ERROR ..")
    client.py explain ADMIN PROTO    for every "SRC DST" line on stdin (ADDR:PORT each), GET
                                     /explain?client=SRC&vip=DST&proto=PROTO from the admin API
                                     at ADMIN and print its JSON on one line (or an error object)

Plain standard library: the peer is a real TCP/UDP stack, nothing of Strait's.
"""
import socket
import sys
import threading
import time


def http_get(s, path="/"):
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: vip\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the response head")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return body.decode().strip()


def raw(iface, frames):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    for h in frames:
        s.send(bytes.fromhex(h))
    print(f"sent {len(frames)}", flush=True)


def keepalive(vip, n):
    conns = [socket.create_connection((vip, 80), timeout=5) for _ in range(n)]
    for s in conns:
        print(http_get(s))
    print("END", flush=True)
    for _ in sys.stdin:
        for s in conns:
            try:
                print(http_get(s))
            except OSError as e:
                print(f"ERROR {e!r}")
        print("END", flush=True)


def stream(vip, n, seconds):
    results = [None] * n

    def one(i):
        backend, lines, gap, err = "?", 0, 0.0, ""
        try:
            s = socket.create_connection((vip, 80), timeout=5)
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: vip\r\n\r\n")
            s.settimeout(3)
            buf, last, end = b"", None, time.monotonic() + seconds
            while time.monotonic() < end:
                chunk = s.recv(4096)
                if not chunk:
                    err = "closed"
                    break
                now = time.monotonic()
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.startswith(b"backend="):
                        backend = line.split()[0].decode()
                        lines += 1
                        if last is not None:
                            gap = max(gap, now - last)
                        last = now
            s.close()
        except OSError as e:
            err = repr(e)
        results[i] = (backend, lines, gap, err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for backend, lines, gap, err in results:
        print(f"{backend} lines={lines} maxgap={gap:.3f} error={err or 'none'}")


def udp(vip, port, first, n):
    answered = 0
    for p in range(first, first + n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", p))
        s.settimeout(1.0)
        s.sendto(b"ping", (vip, port))
        try:
            data, _ = s.recvfrom(2048)
            if data.startswith(b"backend="):
                answered += 1
        except socket.timeout:
            pass
        s.close()
    print(f"sent={n} answered={answered}")


def udpmap(vip, port, first, n):
    for p in range(first, first + n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", p))
        s.settimeout(1.0)
        s.sendto(b"ping", (vip, port))
        try:
            data, _ = s.recvfrom(2048)
            print(p, data.decode().strip())
        except socket.timeout:
            print(p, "-")
        s.close()
    sys.stdout.flush()


def churn(vip, threads, seconds):
    lock = threading.Lock()
    ok, per, refused, failed = [0], {}, [], []
    end = time.monotonic() + seconds

    def one():
        while time.monotonic() < end:
            t = time.monotonic()
            s = socket.socket()
            s.settimeout(3)
            try:
                s.bind(("", 0))
                port = s.getsockname()[1]
                s.connect((vip, 80))
            except ConnectionRefusedError:
                s.close()
                with lock:
                    refused.append((t, port))
                continue
            except OSError as e:
                s.close()
                with lock:
                    failed.append((t, type(e).__name__))
                continue
            try:
                s.settimeout(3)
                s.sendall(b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = s.recv(4096)
                    if not chunk:
                        raise ConnectionError("closed before the response")
                    data += chunk
                backend = data.split(b"\r\n\r\n", 1)[1].split(b" ")[0].decode()
                with lock:
                    ok[0] += 1
                    per[backend] = per.get(backend, 0) + 1
            except OSError as e:
                with lock:
                    failed.append((t, type(e).__name__))
            finally:
                s.close()

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(f"ok={ok[0]} refused={len(refused)} failed={len(failed)}")
    for b, n in sorted(per.items()):
        print(f"{b} {n}")
    for t, port in sorted(refused):
        print(f"REFUSED {t:.6f} {port}")
    for t, e in sorted(failed):
        print(f"FAILED {t:.6f} {e}")
    sys.stdout.flush()


def rate(vip, per_second, seconds):
    start = time.monotonic()
    for i in range(int(per_second * seconds)):
        wait = start + i / per_second - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        opened = time.time()
        try:
            with socket.create_connection((vip, 80), timeout=2) as s:
                answer = http_get(s)
        except OSError as e:
            answer = f"ERROR {e!r}"
        print(f"{opened:.3f} {answer}", flush=True)


def explain(admin, proto):
    import http.client
    import json

    host, port = admin.rsplit(":", 1)
    for line in sys.stdin:
        if not line.strip():
            continue
        src, dst = line.split()
        c = http.client.HTTPConnection(host, int(port), timeout=5)
        c.request("GET", f"/explain?client={src}&vip={dst}&proto={proto}")
        r = c.getresponse()
        body = r.read().decode()
        c.close()
        if r.status == 200:
            print(body.strip(), flush=True)
        else:
            print(json.dumps({"status": r.status, "error": body}), flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "keepalive":
        keepalive(sys.argv[2], int(sys.argv[3]))
    elif cmd == "stream":
        stream(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "udp":
        udp(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "udpmap":
        udpmap(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "churn":
        churn(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "rate":
        rate(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "explain":
        explain(sys.argv[2], sys.argv[3])
    elif cmd == "raw":
        raw(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"unknown command {cmd}")
