#define _GNU_SOURCE
// Strait's DPDK shim: DPDK's burst and mbuf calls are `static inline` in its headers, so Rust
// cannot link to them; these one-line wrappers give them symbols. Everything else Strait uses
// from DPDK is called through these too, so the Rust side declares one small, stable ABI
// (dpdk/src/ffi.rs) instead of binding DPDK's headers, whose structs change between
// releases. The exception interface (a Linux TAP) is opened here as well: its ioctls need the
// kernel's structs.

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/if_arp.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_version.h>

// EAL init without moving the calling thread: rte_eal_init pins its caller to the main lcore,
// and every thread the gateway starts later would inherit that. Returns the arguments parsed
// or -rte_errno.
int strait_eal_init(int argc, char **argv) {
    cpu_set_t saved;
    int have = sched_getaffinity(0, sizeof(saved), &saved) == 0;
    int ret = rte_eal_init(argc, argv);
    int err = rte_errno;
    if (have) {
        sched_setaffinity(0, sizeof(saved), &saved);
    }
    return ret < 0 ? -err : ret;
}

int strait_eal_cleanup(void) { return rte_eal_cleanup(); }

const char *strait_strerror(int err) { return rte_strerror(err); }

const char *strait_version(void) { return rte_version(); }

// A worker thread registers to get an lcore id, hence a mempool cache of its own.
int strait_thread_register(void) { return rte_thread_register(); }

void strait_thread_unregister(void) { rte_thread_unregister(); }

int strait_port_by_name(const char *name, uint16_t *port) {
    return rte_eth_dev_get_port_by_name(name, port);
}

struct rte_mempool *strait_pool_create(const char *name, unsigned n, unsigned cache,
                                       int socket) {
    return rte_pktmbuf_pool_create(name, n, cache, 0, RTE_MBUF_DEFAULT_BUF_SIZE, socket);
}

void strait_pool_free(struct rte_mempool *mp) { rte_mempool_free(mp); }

unsigned strait_pool_avail(const struct rte_mempool *mp) { return rte_mempool_avail_count(mp); }

int strait_port_socket(uint16_t port) { return rte_eth_dev_socket_id(port); }

// Configures `port` with `queues` RX and TX queues (no offloads: the pipeline completes
// checksums itself), its MTU, and starts nothing yet.
int strait_port_configure(uint16_t port, uint16_t queues, uint16_t mtu) {
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof(conf));
    int ret = rte_eth_dev_configure(port, queues, queues, &conf);
    if (ret < 0) {
        return ret;
    }
    // Not every PMD can set it (af_packet follows the kernel interface); not fatal.
    (void)rte_eth_dev_set_mtu(port, mtu);
    return 0;
}

int strait_port_queue(uint16_t port, uint16_t queue, uint16_t rx_desc, uint16_t tx_desc,
                      struct rte_mempool *mp) {
    uint16_t rxd = rx_desc, txd = tx_desc;
    int ret = rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    if (ret < 0) {
        return ret;
    }
    int socket = rte_eth_dev_socket_id(port);
    ret = rte_eth_rx_queue_setup(port, queue, rxd, socket, NULL, mp);
    if (ret < 0) {
        return ret;
    }
    return rte_eth_tx_queue_setup(port, queue, txd, socket, NULL);
}

int strait_port_start(uint16_t port) { return rte_eth_dev_start(port); }

void strait_port_close(uint16_t port) {
    rte_eth_dev_stop(port);
    rte_eth_dev_close(port);
}

int strait_port_mac(uint16_t port, uint8_t out[6]) {
    struct rte_ether_addr a;
    int ret = rte_eth_macaddr_get(port, &a);
    if (ret == 0) {
        memcpy(out, a.addr_bytes, 6);
    }
    return ret;
}

// Link state: 1 up, 0 down; speed in Mbit/s.
int strait_port_link(uint16_t port, uint32_t *speed) {
    struct rte_eth_link link;
    memset(&link, 0, sizeof(link));
    int ret = rte_eth_link_get_nowait(port, &link);
    if (ret < 0) {
        return ret;
    }
    *speed = link.link_speed;
    return link.link_status;
}

// The port's basic counters: ipackets, opackets, ibytes, obytes, imissed, ierrors, oerrors,
// rx_nombuf.
int strait_port_stats(uint16_t port, uint64_t out[8]) {
    struct rte_eth_stats s;
    int ret = rte_eth_stats_get(port, &s);
    if (ret < 0) {
        return ret;
    }
    out[0] = s.ipackets;
    out[1] = s.opackets;
    out[2] = s.ibytes;
    out[3] = s.obytes;
    out[4] = s.imissed;
    out[5] = s.ierrors;
    out[6] = s.oerrors;
    out[7] = s.rx_nombuf;
    return 0;
}

uint16_t strait_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t strait_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    return rte_eth_tx_burst(port, queue, pkts, n);
}

// The whole data buffer of a single-segment mbuf, and where its packet is in it. Returns the
// number of segments (the worker handles only 1).
uint16_t strait_mbuf_view(const struct rte_mbuf *m, uint8_t **buf, uint16_t *buf_len,
                          uint16_t *data_off, uint16_t *data_len) {
    *buf = (uint8_t *)m->buf_addr;
    *buf_len = m->buf_len;
    *data_off = m->data_off;
    *data_len = m->data_len;
    return m->nb_segs;
}

// Moves a single-segment mbuf's packet to `data_off`, `len` bytes (the pipeline may have
// moved its head for an encapsulation), and clears the RX offload flags (the packet changed).
void strait_mbuf_set(struct rte_mbuf *m, uint16_t data_off, uint16_t len) {
    m->data_off = data_off;
    m->data_len = len;
    m->pkt_len = len;
    m->ol_flags = 0;
}

uint16_t strait_mbuf_port(const struct rte_mbuf *m) { return m->port; }

struct rte_mbuf *strait_mbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

void strait_mbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

void strait_mbuf_free_bulk(struct rte_mbuf **m, unsigned n) { rte_pktmbuf_free_bulk(m, n); }

// Opens (or creates) the TAP interface `name`, non-blocking, sets its MAC to `mac` and its
// MTU to `mtu` where they differ, and brings it up. An existing persistent TAP (`ip tuntap add`) keeps its
// addresses; a new one goes away when the fd is closed. Returns the fd, or -errno with
// `*step` naming the call that failed.
int strait_tap_open(const char *name, const uint8_t mac[6], uint16_t mtu, const char **step) {
    struct ifreq ifr;
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *step = "open(/dev/net/tun)";
        return -errno;
    }
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        int err = errno;
        close(fd);
        *step = "ioctl(TUNSETIFF)";
        return -err;
    }
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        int err = errno;
        close(fd);
        *step = "socket(AF_INET)";
        return -err;
    }
    // What is already right is left alone: setting a device's MAC, even to the one it has,
    // makes the kernel flush the device's neighbour entries (NETDEV_CHANGEADDR; permanent
    // ones too), so every start of the gateway would drop a persistent TAP's static entries
    // and make the kernel resolve its next hops again.
    struct ifreq r;
    const char *failed = NULL;
    memset(&r, 0, sizeof(r));
    strncpy(r.ifr_name, name, IFNAMSIZ - 1);
    if (ioctl(sock, SIOCGIFHWADDR, &r) < 0) {
        failed = "ioctl(SIOCGIFHWADDR)";
    } else if (memcmp(r.ifr_hwaddr.sa_data, mac, 6) != 0) {
        memset(&r, 0, sizeof(r));
        strncpy(r.ifr_name, name, IFNAMSIZ - 1);
        r.ifr_hwaddr.sa_family = ARPHRD_ETHER;
        memcpy(r.ifr_hwaddr.sa_data, mac, 6);
        if (ioctl(sock, SIOCSIFHWADDR, &r) < 0) {
            failed = "ioctl(SIOCSIFHWADDR)";
        }
    }
    memset(&r, 0, sizeof(r));
    strncpy(r.ifr_name, name, IFNAMSIZ - 1);
    if (!failed && ioctl(sock, SIOCGIFMTU, &r) < 0) {
        failed = "ioctl(SIOCGIFMTU)";
    }
    if (!failed && r.ifr_mtu != mtu) {
        r.ifr_mtu = mtu;
        if (ioctl(sock, SIOCSIFMTU, &r) < 0) {
            failed = "ioctl(SIOCSIFMTU)";
        }
    }
    memset(&r, 0, sizeof(r));
    strncpy(r.ifr_name, name, IFNAMSIZ - 1);
    if (!failed && ioctl(sock, SIOCGIFFLAGS, &r) < 0) {
        failed = "ioctl(SIOCGIFFLAGS)";
    }
    if (!failed && !(r.ifr_flags & IFF_UP)) {
        r.ifr_flags |= IFF_UP;
        if (ioctl(sock, SIOCSIFFLAGS, &r) < 0) {
            failed = "ioctl(SIOCSIFFLAGS)";
        }
    }
    int err = errno;
    close(sock);
    if (failed) {
        close(fd);
        *step = failed;
        return -err;
    }
    return fd;
}
