// SPDX-License-Identifier: Apache-2.0
//
// The `limit` forwarder's XDP program (`strait-lab l2fwd`, lab/src/l2fwd/forwarder.rs): every
// IPv4 TCP or UDP packet goes to the AF_XDP socket of the queue it arrived on; everything else
// (ARP above all, ICMP, IPv6) passes to the kernel, so the interface keeps answering ARP.
//
// Nothing else is looked at: the forwarder is the yardstick the gateway is measured against,
// so this program does the least a forwarder's steering can do. Ethernet II with at most one
// 802.1Q tag.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_QUEUES 256
#define ETH_P_8021Q_ 0x8100

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

SEC("xdp")
int strait_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u16 ethertype;
	void *l3;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	ethertype = eth->h_proto;
	l3 = eth + 1;
	if (ethertype == bpf_htons(ETH_P_8021Q_)) {
		struct vlan_hdr *v = l3;

		if ((void *)(v + 1) > end)
			return XDP_PASS;
		ethertype = v->proto;
		l3 = v + 1;
	}
	if (ethertype != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = l3;
	if ((void *)(ip + 1) > end)
		return XDP_PASS;
	if (ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_TCP)
		return XDP_PASS;
	// XDP_PASS when no socket is bound to this queue.
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Apache-2.0";
