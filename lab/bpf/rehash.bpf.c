// SPDX-License-Identifier: Apache-2.0
//
// The testbed router's hash reset (`strait-lab testbed up --gateways N`, lab/src/testbed.rs):
// a tc ingress program on the router's client-facing veth that forgets the packet's flow hash.
//
// Why: every namespace of the testbed shares one kernel, and a TCP segment keeps its socket's
// skb->hash (sk_txhash, marked as an L4 hash) across veths. The router's multipath lookup
// (fib_multipath_hash, policy 1) takes that hash instead of hashing the headers whenever it
// is an L4 hash, and TCP picks a new sk_txhash on every retransmission timeout, so a flow
// would hop from gateway to gateway exactly when it is already in trouble. A real router sees
// a wire and hashes the headers; clearing the hash here makes the router do the same.

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

SEC("tc")
int strait_rehash(struct __sk_buff *skb)
{
	bpf_set_hash_invalid(skb);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Apache-2.0";
