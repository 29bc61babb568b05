/* floor.bpf.c: the throughput floors a balancer is compared against (XDP_DROP, MAC-swap XDP_TX), each counting what it saw.
 *
 * The same object also serves as the generator side's counter: xdp_drop attached to the veth the
 * frames come back on counts them and frees them. Each loaded instance has its own fl_count.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

/* Packets seen by this instance, per CPU (one slot: Python sums the CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} fl_count SEC(".maps");

static __always_inline void count_packet(void)
{
	__u32 zero = 0;
	__u64 *packets = bpf_map_lookup_elem(&fl_count, &zero);

	if (packets)
		*packets += 1;
}

SEC("xdp")
int xdp_drop(struct xdp_md *ctx)
{
	count_packet();
	return XDP_DROP;
}

/* Swap destination and source MAC and send the frame back out of the interface it came in on. */
SEC("xdp")
int xdp_tx_swap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	unsigned char mac[ETH_ALEN];

	count_packet();
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	return XDP_TX;
}
