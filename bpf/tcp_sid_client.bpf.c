/* tcp_sid_client.bpf.c: sock_ops on a lab client's cgroup that writes Katran's server-id TCP option (kind 183) on its flows.
 *
 * What a client-side proxy behind a Katran-style balancer does once it knows which server holds a
 * connection (Katran's servers send the id in the option, their peers echo it): every segment of a
 * connection whose local port is in sid_ports carries option 183, length 6, the id's 4 bytes
 * little-endian (as the balancer reads them, route.h). The kernel writes the option itself
 * (BPF_SOCK_OPS_WRITE_HDR_OPT_CB, kernel >= 5.10), so the client stays a real TCP stack.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "abi.h"

char LICENSE[] SEC("license") = "GPL";

enum sid_option {
	SID_OPT_KIND = 183,
	SID_OPT_LEN = 6,
};

/* local port (host order) -> the server id its segments carry; the lab client fills it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} sid_ports SEC(".maps");

SEC("sockops")
int tcp_sid_client(struct bpf_sock_ops *skops)
{
	__u32 port = skops->local_port;
	__u32 *sid;
	__u8 opt[SID_OPT_LEN];

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		return 1;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		if (bpf_map_lookup_elem(&sid_ports, &port))
			bpf_reserve_hdr_opt(skops, SID_OPT_LEN, 0);
		return 1;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		sid = bpf_map_lookup_elem(&sid_ports, &port);
		if (!sid)
			return 1;
		opt[0] = SID_OPT_KIND;
		opt[1] = SID_OPT_LEN;
		opt[2] = *sid;
		opt[3] = *sid >> 8;
		opt[4] = *sid >> 16;
		opt[5] = *sid >> 24;
		bpf_store_hdr_opt(skops, opt, sizeof(opt), 0);
		return 1;
	default:
		return 1;
	}
}
