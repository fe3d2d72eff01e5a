// SPDX-License-Identifier: Apache-2.0
//
// Strait's XDP steering program: decides, per packet, whether the gateway's workers handle it
// (redirect to the AF_XDP socket of the receiving queue) or the kernel does (XDP_PASS).
//
// An AF_XDP socket cannot give a frame back to the kernel, so this program must only redirect
// what the pipeline will forward; everything else (ARP, ND, ICMP echo to the box, SSH, BGP,
// traffic to the box's own addresses) passes untouched. Only a frame the port accepts is
// looked at (`port`): unicast to the interface's own MAC, untagged or tagged with a VLAN the
// interface serves. A frame to another host's MAC (a switch flooding an unknown destination,
// the interface in promiscuous mode) or of another VLAN passes, counted, and the kernel drops
// it or gives it to its VLAN device; broadcast and multicast (ARP, ND) are the kernel's.
// Of the accepted frames, redirected are:
//
//   1. TCP/UDP/SCTP to a service frontend            (frontends: {vip, port, proto})
//   2. TCP/UDP/SCTP from a nat backend (nat replies) (nat_backends: {addr, port, proto}),
//      unless addressed to the gateway itself (locals: its health checks' replies)
//   3. ICMP/ICMPv6 errors whose outer destination is a VIP: they quote a packet the VIP sent,
//      and the pipeline forwards them to the backend that owns that flow  (vips: {addr})
//   4. Non-first IP fragments of TCP/UDP/SCTP to a VIP (they carry no ports) (vips)
//
// Userspace (dataplane/src/xsk/prog.rs) writes `port` before attaching, keeps the lookup maps
// equal to the current service table and puts each AF_XDP socket into `xsks` at its queue
// index. Keys hold addresses in the pipeline's key form: 16 bytes, IPv4 as IPv4-mapped IPv6
// (::ffff:a.b.c.d); ports in network byte order, as on the wire.
//
// The hash maps `frontends` and `nat_backends` are the authority; `fast` holds a copy of both
// in an open-addressed array, which every frame to a service asks first. A hash map's lookup
// is a call into the kernel (hashing, then a memcmp call on a hit); an array's is inlined by
// the verifier into a bounds check and an add, so a probe of `fast` is a few loads and
// compares. A key found in the copy is in its map (or was, until the swap that takes it out
// returns); a key not found (an empty slot first, FAST_PROBES slots read, or no array in
// `fast`) is asked of the map. So the copy only speeds up what the maps answer: a key not yet
// copied, or one that did not fit, costs the map's lookup. Userspace
// (dataplane/src/xsk/fast.rs) keeps two such arrays and changes only the one not in `fast`,
// then swaps it in, so a frame sees one whole array.
//
// Parsing mirrors dataplane/src/wire/parse.rs: Ethernet II with at most one 802.1Q tag,
// IPv4 (options allowed), IPv6 with at most MAX_EXT extension headers. Every loop is bounded
// and every read is checked against data_end before it happens, for the verifier.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// Largest queue index served; the xsks map has one slot per queue.
#define MAX_QUEUES 256
// Frontends (services) the map holds. The config allows any number; 64 Ki is far above the
// service count of one gateway and costs about 3 MiB of kernel memory.
#define MAX_FRONTENDS 65536
// Nat backends: one entry per (backend address, port, protocol) of every nat service.
#define MAX_NAT_BACKENDS 262144
// IPv6 extension headers walked before giving up (wire::ipv6::MAX_EXTENSIONS).
#define MAX_EXT 8

#define ETH_P_8021Q_ 0x8100

// IPv6 extension header numbers the pipeline walks.
#define NH_HOP 0
#define NH_ROUTING 43
#define NH_FRAGMENT 44
#define NH_AUTH 51
#define NH_DEST 60

// ICMP error types (wire::icmp::is_error_v4 / is_error_v6).
#define ICMP_DEST_UNREACH_ 3
#define ICMP_TIME_EXCEEDED_ 11
#define ICMP_PARAMETERPROB_ 12
#define ICMPV6_DEST_UNREACH_ 1
#define ICMPV6_PKT_TOOBIG_ 2
#define ICMPV6_TIME_EXCEED_ 3
#define ICMPV6_PARAMPROB_ 4

// Key of `frontends` and `nat_backends`: 20 bytes, no implicit padding
// (xsk::prog::endpoint_key builds the same bytes). `kind` is 0 in the hash maps and the
// key's FAST_ kind in `fast`, where an all-zero slot is empty. 4-aligned, as `fast` reads it
// as five 32-bit words (the verifier refuses a misaligned stack read).
struct endpoint_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 kind;
} __attribute__((aligned(4)));

// Kinds of key in `fast` (xsk::fast::Kind).
#define FAST_FRONTEND 1
#define FAST_NAT_BACKEND 2
// Slots of a `fast` array, a power of two (xsk::fast::SLOTS): 2^18.
#define FAST_SLOTS_LOG2 18
#define FAST_SLOTS (1 << FAST_SLOTS_LOG2)
// Slots a probe of `fast` reads before asking the hash map (xsk::fast::PROBES).
#define FAST_PROBES 8

// Key of `vips`.
struct vip_key {
	__u8 addr[16];
};

// Counter slots of `stats` (xsk::prog::SteerCounters reads them in this order). Every frame
// is counted in exactly one: the slots add up to the frames the program saw.
enum stat {
	// Passed: not service traffic (or not IP), the kernel's.
	STAT_PASS,
	// Redirected, by what matched.
	STAT_FRONTEND,
	STAT_NAT_REPLY,
	STAT_ICMP_ERROR,
	STAT_FRAGMENT,
	// Passed: unicast to another MAC.
	STAT_OTHER_HOST,
	// Passed: tagged with a VLAN the interface does not serve.
	STAT_VLAN,
	// Passed: an Ethernet, 802.1Q, IP or transport header cut short or invalid.
	STAT_MALFORMED,
	// Passed: would be redirected, but no socket is registered for the queue.
	STAT_NO_SOCKET,
	STAT_MAX,
};

// VLAN ids: 12 bits.
#define VLAN_IDS 4096

// What the port accepts, written by userspace before the program is attached
// (xsk::prog::port_conf builds the same bytes): 520 bytes, no implicit padding.
struct port_conf {
	// The interface's own MAC.
	__u8 mac[6];
	__u8 pad[2];
	// Bit v of word v / 64: tagged frames of VLAN v are served.
	__u64 vlans[VLAN_IDS / 64];
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FRONTENDS);
	__type(key, struct endpoint_key);
	__type(value, __u32);
} frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NAT_BACKENDS);
	__type(key, struct endpoint_key);
	__type(value, __u32);
} nat_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FRONTENDS);
	__type(key, struct vip_key);
	__type(value, __u32);
} vips SEC(".maps");

// One copy of `frontends` and `nat_backends`, open-addressed (see the top of the file).
struct fast_array {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FAST_SLOTS);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct endpoint_key));
};

// The copy in use, at index 0; none until userspace puts one in.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct fast_array);
} fast SEC(".maps");

// The gateway's own addresses. A packet from a nat backend's service port to one of them is
// the gateway's own traffic (a health check's reply), not a nat reply: the kernel's.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct vip_key);
	__type(value, __u32);
} locals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct port_conf);
} port SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

// What the parse found: addresses in key form, protocol, and whether ports follow.
struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u8 proto;
	// Non-first fragment: no transport header in this packet.
	__u8 later_fragment;
	__u8 v6;
};

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&stats, &slot);

	if (c)
		*c += 1;
}

static __always_inline int pass_as(__u32 slot)
{
	count(slot);
	return XDP_PASS;
}

static __always_inline int pass(void)
{
	return pass_as(STAT_PASS);
}

static __always_inline int malformed(void)
{
	return pass_as(STAT_MALFORMED);
}

static __always_inline int redirect(struct xdp_md *ctx, __u32 slot)
{
	// XDP_PASS when no socket is bound to this queue, so the kernel keeps the traffic.
	int act = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);

	count(act == XDP_REDIRECT ? slot : STAT_NO_SOCKET);
	return act;
}

// Whether the port takes the frame: the STAT_ slot to pass it under, or STAT_MAX to go on.
// `tci` is the 802.1Q tag in network order, 0 when untagged.
static __always_inline __u32 refused(const struct ethhdr *eth, __be16 tci)
{
	__u32 zero = 0;
	struct port_conf *c = bpf_map_lookup_elem(&port, &zero);
	__u16 vid;

	if (!c)
		return STAT_PASS;
	// Broadcast and multicast (the I/G bit): ARP, ND, routing protocols; the kernel's.
	if (eth->h_dest[0] & 1)
		return STAT_PASS;
	if ((eth->h_dest[0] ^ c->mac[0]) | (eth->h_dest[1] ^ c->mac[1]) |
	    (eth->h_dest[2] ^ c->mac[2]) | (eth->h_dest[3] ^ c->mac[3]) |
	    (eth->h_dest[4] ^ c->mac[4]) | (eth->h_dest[5] ^ c->mac[5]))
		return STAT_OTHER_HOST;
	// VLAN 0 is a priority tag on an untagged frame (802.1Q), served as untagged.
	vid = bpf_ntohs(tci) & (VLAN_IDS - 1);
	if (vid && !((c->vlans[vid / 64] >> (vid % 64)) & 1))
		return STAT_VLAN;
	return STAT_MAX;
}

static __always_inline void v4_mapped(__u8 *out, __be32 a)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &a, 4);
}

static __always_inline int is_vip(const __u8 *addr)
{
	struct vip_key k;

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&vips, &k) != NULL;
}

// Home slot of `k` in a `fast` array (xsk::fast::home computes the same): the key's
// five native-endian 32-bit words folded with a multiply each, the top bits taken.
static __always_inline __u32 fast_home(const struct endpoint_key *k)
{
	const __u32 *w = (const __u32 *)k;
	const __u64 m = 0x9e3779b97f4a7c15ULL;
	__u64 h = w[0];

	h = h * m ^ w[1];
	h = h * m ^ w[2];
	h = h * m ^ w[3];
	h = h * m ^ w[4];
	h *= m;
	return h >> (64 - FAST_SLOTS_LOG2);
}

// Whether `k` (its `kind` set) is in the array `arr` of `fast` (NULL for none): found before
// an empty slot, within FAST_PROBES slots of its home.
static __always_inline int fast_has(void *arr, const struct endpoint_key *k)
{
	const __u32 *w = (const __u32 *)k;
	__u32 home;
	int i;

	if (!arr)
		return 0;
	home = fast_home(k);
	for (i = 0; i < FAST_PROBES; i++) {
		__u32 idx = (home + i) & (FAST_SLOTS - 1);
		const __u32 *s = bpf_map_lookup_elem(arr, &idx);

		if (!s)
			return 0;
		if (!((s[0] ^ w[0]) | (s[1] ^ w[1]) | (s[2] ^ w[2]) | (s[3] ^ w[3]) |
		      (s[4] ^ w[4])))
			return 1;
		// Only an empty slot has a zero kind.
		if (!((const struct endpoint_key *)s)->kind)
			return 0;
	}
	return 0;
}

// Whether `k` is in `fast` under `kind`, or else in `map` (where `kind` is 0). Leaves
// `k->kind` 0.
static __always_inline int has_endpoint(void *arr, void *map, struct endpoint_key *k, __u8 kind)
{
	int found;

	k->kind = kind;
	found = fast_has(arr, k);
	k->kind = 0;
	return found || bpf_map_lookup_elem(map, k) != NULL;
}

// Parses IPv4 at `l3`; on success sets `f` and returns the transport header, else NULL.
static __always_inline void *parse_v4(void *l3, void *end, struct flow *f)
{
	struct iphdr *ip = l3;
	__u32 ihl;

	if ((void *)(ip + 1) > end)
		return NULL;
	ihl = ip->ihl * 4;
	if (ip->version != 4 || ihl < sizeof(*ip))
		return NULL;
	v4_mapped(f->src, ip->saddr);
	v4_mapped(f->dst, ip->daddr);
	f->proto = ip->protocol;
	f->later_fragment = (ip->frag_off & bpf_htons(0x1fff)) != 0;
	return l3 + ihl;
}

// Parses IPv6 at `l3`, walking up to MAX_EXT extension headers.
static __always_inline void *parse_v6(void *l3, void *end, struct flow *f)
{
	struct ipv6hdr *ip = l3;
	void *cur;
	__u8 nh;
	int i;

	if ((void *)(ip + 1) > end)
		return NULL;
	__builtin_memcpy(f->src, &ip->saddr, 16);
	__builtin_memcpy(f->dst, &ip->daddr, 16);
	f->v6 = 1;
	nh = ip->nexthdr;
	cur = ip + 1;
#pragma unroll
	for (i = 0; i < MAX_EXT; i++) {
		__u8 *h = cur;

		if (nh != NH_HOP && nh != NH_ROUTING && nh != NH_FRAGMENT && nh != NH_AUTH &&
		    nh != NH_DEST)
			break;
		if ((void *)(h + 8) > end)
			return NULL;
		if (nh == NH_FRAGMENT) {
			// Offset in the top 13 bits of bytes 2..4.
			if (((h[2] << 8) | h[3]) & 0xfff8)
				f->later_fragment = 1;
			nh = h[0];
			cur = h + 8;
		} else if (nh == NH_AUTH) {
			nh = h[0];
			cur = h + ((__u32)h[1] + 2) * 4;
		} else {
			nh = h[0];
			cur = h + ((__u32)h[1] + 1) * 8;
		}
	}
	f->proto = nh;
	return cur;
}

SEC("xdp")
int strait_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct flow f = {};
	struct endpoint_key k = {};
	void *l3, *l4;
	__u16 ethertype;
	__be16 tci = 0;
	__u32 slot, zero = 0;
	__u8 *ports;
	void *arr;

	if ((void *)(eth + 1) > end)
		return malformed();
	ethertype = eth->h_proto;
	l3 = eth + 1;
	if (ethertype == bpf_htons(ETH_P_8021Q_)) {
		struct vlan_hdr *v = l3;

		if ((void *)(v + 1) > end)
			return malformed();
		tci = v->tci;
		ethertype = v->proto;
		l3 = v + 1;
	}
	slot = refused(eth, tci);
	if (slot != STAT_MAX)
		return pass_as(slot);
	if (ethertype == bpf_htons(ETH_P_IP))
		l4 = parse_v4(l3, end, &f);
	else if (ethertype == bpf_htons(ETH_P_IPV6))
		l4 = parse_v6(l3, end, &f);
	else
		return pass();
	if (!l4)
		return malformed();

	// SCTP's ports sit where TCP's and UDP's do (RFC 9260 section 3.1).
	if (f.proto == IPPROTO_TCP || f.proto == IPPROTO_UDP || f.proto == IPPROTO_SCTP) {
		if (f.later_fragment)
			return is_vip(f.dst) ? redirect(ctx, STAT_FRAGMENT) : pass();
		ports = l4;
		if ((void *)(ports + 4) > end)
			return malformed();
		arr = bpf_map_lookup_elem(&fast, &zero);
		__builtin_memcpy(k.addr, f.dst, 16);
		__builtin_memcpy(&k.port, ports + 2, 2);
		k.proto = f.proto;
		if (has_endpoint(arr, &frontends, &k, FAST_FRONTEND))
			return redirect(ctx, STAT_FRONTEND);
		__builtin_memcpy(k.addr, f.src, 16);
		__builtin_memcpy(&k.port, ports, 2);
		if (has_endpoint(arr, &nat_backends, &k, FAST_NAT_BACKEND)) {
			struct vip_key d;

			__builtin_memcpy(d.addr, f.dst, 16);
			if (bpf_map_lookup_elem(&locals, &d))
				return pass();
			return redirect(ctx, STAT_NAT_REPLY);
		}
		return pass();
	}
	if ((f.proto == IPPROTO_ICMP && !f.v6) || (f.proto == IPPROTO_ICMPV6 && f.v6)) {
		__u8 *icmp = l4;
		__u8 t;
		int err;

		if (f.later_fragment)
			return pass();
		if ((void *)(icmp + 1) > end)
			return malformed();
		t = icmp[0];
		if (!f.v6)
			err = t == ICMP_DEST_UNREACH_ || t == ICMP_TIME_EXCEEDED_ ||
			      t == ICMP_PARAMETERPROB_;
		else
			err = t == ICMPV6_DEST_UNREACH_ || t == ICMPV6_PKT_TOOBIG_ ||
			      t == ICMPV6_TIME_EXCEED_ || t == ICMPV6_PARAMPROB_;
		if (err && is_vip(f.dst))
			return redirect(ctx, STAT_ICMP_ERROR);
	}
	return pass();
}

char LICENSE[] SEC("license") = "Apache-2.0";
