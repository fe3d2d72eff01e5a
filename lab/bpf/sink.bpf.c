// SPDX-License-Identifier: Apache-2.0
//
// The benchmark's sink (`strait-lab sink`, lab/src/sink/program.rs): counts every frame that
// arrives on the interface and drops it, except latency probes, which it reflects.
//
// A probe is an IPv4 UDP packet (not a fragment) whose UDP *source* port is the configured
// reflect port and whose payload starts with the magic "STRAITPR" (the generator's
// probe). It goes back out of the interface it came in on with the Ethernet addresses, the
// IPv4 addresses and the UDP ports swapped, payload untouched, so it returns through the
// forwarder to the generator's probe socket.
//
// Back out by bpf_redirect() to the ingress interface rather than XDP_TX: the same thing on a
// NIC, but on a veth an XDP_TX frame is only picked up by the peer when the peer has an XDP
// program of its own (the kernel's veth_xdp_flush() wakes the peer's NAPI only then; with
// just GRO on, the frame waits in the peer's ring until unrelated traffic arrives). A redirect
// goes through ndo_xdp_xmit, which flushes the peer whenever it has NAPI, i.e. an XDP program
// or GRO on (`ethtool -K PEER gro on`). Without either the kernel drops the reflection and
// counts it in this interface's `ethtool -S` as rx_queue_N_drops.
//
// No checksum needs fixing: the IPv4 header checksum is the ones' complement of the sum of the
// header's 16-bit words, and swapping saddr and daddr permutes those words; the UDP checksum
// covers the pseudo-header (both addresses) and the header (both ports), again the same words
// in another order. Ones' complement addition commutes, so both sums, and the checksums, stay
// what they were (a UDP checksum of 0, "none", stays 0).
//
// Counters (per CPU, summed by user space): received (every frame, probes included) and
// reflected (probes sent back; the kernel may still drop one, see above). Config: one u32,
// the reflect port (host order), 0 = off.
//
// Parsing: Ethernet II with at most one 802.1Q tag, IPv4 with options. Every read is checked
// against data_end first, for the verifier.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ETH_P_8021Q_ 0x8100
// IPv4 "more fragments" flag and fragment offset bits of frag_off.
#define IP_MF_OFFSET 0x3fff

// Counter slots of `counters` (xsk::sink::SinkCounters reads them in this order).
enum stat {
	STAT_RECEIVED,
	STAT_REFLECTED,
	STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// Slot 0: the reflect port in host byte order; 0 turns reflection off.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} config SEC(".maps");

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &slot);

	if (c)
		*c += 1;
}

// Whether the packet is a probe to reflect: IPv4, UDP, first and only fragment, source port
// `port`, payload starting with "STRAITPR". Sets *ip_out and *udp_out.
static __always_inline int is_probe(void *data, void *end, __u32 port, struct iphdr **ip_out,
				    struct udphdr **udp_out)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	__u8 *payload;
	__u16 ethertype;
	__u32 ihl;
	void *l3;

	if ((void *)(eth + 1) > end)
		return 0;
	ethertype = eth->h_proto;
	l3 = eth + 1;
	if (ethertype == bpf_htons(ETH_P_8021Q_)) {
		struct vlan_hdr *v = l3;

		if ((void *)(v + 1) > end)
			return 0;
		ethertype = v->proto;
		l3 = v + 1;
	}
	if (ethertype != bpf_htons(ETH_P_IP))
		return 0;
	ip = l3;
	if ((void *)(ip + 1) > end)
		return 0;
	ihl = ip->ihl * 4;
	if (ip->version != 4 || ihl < sizeof(*ip) || ip->protocol != IPPROTO_UDP ||
	    (ip->frag_off & bpf_htons(IP_MF_OFFSET)) != 0)
		return 0;
	udp = l3 + ihl;
	if ((void *)(udp + 1) > end)
		return 0;
	if (udp->source != bpf_htons((__u16)port))
		return 0;
	payload = (__u8 *)(udp + 1);
	if ((void *)(payload + 8) > end)
		return 0;
	if (payload[0] != 'S' || payload[1] != 'T' || payload[2] != 'R' || payload[3] != 'A' ||
	    payload[4] != 'I' || payload[5] != 'T' || payload[6] != 'P' || payload[7] != 'R')
		return 0;
	*ip_out = ip;
	*udp_out = udp;
	return 1;
}

SEC("xdp")
int strait_sink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = NULL;
	struct udphdr *udp = NULL;
	__u8 mac[ETH_ALEN];
	__u32 zero = 0;
	__u32 *port;
	__be32 addr;
	__be16 p;

	count(STAT_RECEIVED);
	port = bpf_map_lookup_elem(&config, &zero);
	if (!port || *port == 0 || *port > 0xffff)
		return XDP_DROP;
	if (!is_probe(data, end, *port, &ip, &udp))
		return XDP_DROP;
	// is_probe checked the Ethernet header is inside the packet; the verifier wants to see it.
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	addr = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = addr;
	p = udp->source;
	udp->source = udp->dest;
	udp->dest = p;
	count(STAT_REFLECTED);
	return bpf_redirect(ctx->ingress_ifindex, 0);
}

char LICENSE[] SEC("license") = "Apache-2.0";
