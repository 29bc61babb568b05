/* pass.bpf.c: XDP_PASS for the peer of every veth the balancer XDP_TXes out of (without it veth loses those frames). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
