/* trafficgen.bpf.c: the software traffic generator's XDP program, run in the kernel's live-frames test mode.
 *
 * BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES runs this program once per frame and sends
 * what it returns (XDP_TX: out of the ctx's ingress interface; XDP_REDIRECT: through tg_egress).
 * The kernel recycles the frames' pages without restoring their contents, and whatever the device
 * under test did to a frame (an encap header written over the Ethernet header, swapped MACs) is
 * still there next time, so every frame gets the template's first TG_TEMPLATE_LEN bytes written
 * back before anything else. Then, like TRex's field engine, a per-CPU sequence number picks the
 * flow: flow f uses source address base + f % cfg_src_addrs and source port base + f / cfg_src_addrs.
 * The IPv4 header and UDP or TCP checksums are updated incrementally from the template's (valid) ones;
 * the payload beyond the template is never written by the generator or the path it feeds.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "csum.h"

char LICENSE[] SEC("license") = "GPL";

enum tg_limits {
	TG_TEMPLATE_WORDS = 8,
	TG_TEMPLATE_LEN = TG_TEMPLATE_WORDS * 8, /* covers Ethernet + IPv6 + UDP (62 bytes) */
	TG_CPU_SPREAD = 0x9e3779b1,              /* each CPU starts its flow sequence elsewhere */
};

enum tg_family {
	TG_AF_INET = 4,
	TG_AF_INET6 = 6,
};

/* Load-time settings (written into .rodata by lab/gen/xdplive.py before load). */
const volatile __u64 cfg_template[TG_TEMPLATE_WORDS]; /* the frame's first 64 bytes, for flow 0 */
const volatile __u32 cfg_family = TG_AF_INET;         /* enum tg_family: IPv4 or IPv6 over Ethernet */
const volatile __u32 cfg_flows = 1;                   /* number of distinct flows, >= 1 */
const volatile __u32 cfg_src_addrs = 1;               /* how many consecutive source addresses, >= 1 */
const volatile __u32 cfg_redirect = 0;                /* 0: XDP_TX; 1: redirect through tg_egress[0] */
const volatile __u32 cfg_l4_check = 6;                /* the L4 checksum's offset: 6 (UDP) or 16 (TCP) */

/* Frames generated on each CPU: the field engine's sequence number. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} tg_seq SEC(".maps");

/* The egress device when cfg_redirect is set (slot 0). */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} tg_egress SEC(".maps");

/* Keep the enum in BTF for readers of the object. */
const volatile enum tg_family tg_abi_family __attribute__((used)) = TG_AF_INET;

/* The checksum field `check` after source word and port changes (all in packet byte order). */
static __always_inline __u16 update_check(__u16 check, __u32 old_addr, __u32 new_addr,
					  __u16 old_port, __u16 new_port)
{
	__u64 sum = (__u16)~check;

	sum = csum_change32(sum, old_addr, new_addr);
	sum = csum_change16(sum, old_port, new_port);
	return csum_fold(sum);
}

static __always_inline __u32 next_flow(void)
{
	__u32 zero = 0;
	__u64 *seq = bpf_map_lookup_elem(&tg_seq, &zero);
	__u64 n = 0;

	if (seq) {
		n = *seq;
		*seq = n + 1;
	}
	n += (__u64)bpf_get_smp_processor_id() * TG_CPU_SPREAD;
	return (__u32)(n % (cfg_flows ? cfg_flows : 1));
}

static __always_inline void write_template(void *data)
{
	__u64 *dst = data;

#pragma unroll
	for (int i = 0; i < TG_TEMPLATE_WORDS; i++)
		dst[i] = cfg_template[i];
}

/* Set the source word and port of one flow; saddr is the address's last 32-bit word, l4 the UDP or
 * TCP header (both start with the source port), l4_check its checksum (UDP: 0 means none). */
static __always_inline void set_flow(__u32 *saddr, __u16 *l4, __u16 *l4_check, __u16 *ip_check, __u32 flow)
{
	__u32 addrs = cfg_src_addrs ? cfg_src_addrs : 1;
	__u32 old_addr = *saddr;
	__u16 old_port = *l4;
	__u32 new_addr = bpf_htonl(bpf_ntohl(old_addr) + flow % addrs);
	__u16 new_port = bpf_htons((__u16)(bpf_ntohs(old_port) + flow / addrs));
	int udp = cfg_l4_check == 6;

	*saddr = new_addr;
	*l4 = new_port;
	if (ip_check)
		*ip_check = update_check(*ip_check, old_addr, new_addr, 0, 0);
	if (*l4_check || !udp) {
		*l4_check = update_check(*l4_check, old_addr, new_addr, old_port, new_port);
		if (!*l4_check && udp)
			*l4_check = 0xffff;
	}
}

SEC("xdp")
int trafficgen_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 flow;

	if (data + TG_TEMPLATE_LEN > data_end)
		return XDP_DROP;
	write_template(data);
	flow = next_flow();
	if (cfg_family == TG_AF_INET6) {
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		__u16 *l4 = (void *)(ip6 + 1);
		__u16 *check = (void *)l4 + cfg_l4_check;

		if ((void *)(check + 1) > data + TG_TEMPLATE_LEN) /* rewritten from the template only */
			return XDP_DROP;
		set_flow(&ip6->saddr.in6_u.u6_addr32[3], l4, check, 0, flow);
	} else {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		__u16 *l4 = (void *)(ip + 1);
		__u16 *check = (void *)l4 + cfg_l4_check;

		if ((void *)(check + 1) > data + TG_TEMPLATE_LEN) /* rewritten from the template only */
			return XDP_DROP;
		set_flow(&ip->saddr, l4, check, &ip->check, flow);
	}
	if (cfg_redirect)
		return bpf_redirect_map(&tg_egress, 0, 0);
	return XDP_TX;
}
