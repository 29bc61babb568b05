/* decap.bpf.c: real-server decapsulation of IPIP (4in4, 6in6, 4in6) and GUE (variants 0 and 1), in XDP and in tc.
 *
 * Choices, for the reals and anyone reading their counters:
 * - Outer IPv6 extension headers are walked (tunnel.h): hop-by-hop and destination options are
 *   removed with the outer header; fragments, AH and unfinished routing headers go to the stack.
 * - GUE variant-0 control messages (C bit) are not data: they are counted as
 *   LB_DECAP_PASS_GUE_CONTROL and passed untouched, so the stack delivers them to whatever owns
 *   the GUE port: the kernel's fou (which consumes them itself), a user-space GUE daemon, or, when
 *   nothing listens, the stack's own ICMP port unreachable; we never decapsulate them as data.
 * - 802.1Q: XDP sees the tag in the frame and keeps it there, in front of the inner packet. tc
 *   ingress normally never sees a tag in the frame: the receive path (skb_vlan_untag, before the tc
 *   hook) moves it into the skb's metadata, where decapsulation leaves it. A tag still in the
 *   frame at tc (the inner tag of an 802.1ad + 802.1Q frame, or a test run, which does not untag)
 *   is handled the kernel's way: it is moved to the metadata around the decapsulation, and an
 *   outer tag that was in the metadata is put back outside it, so both tags keep their order.
 */
#include <linux/pkt_cls.h>

#include "parse.h"
#include "tunnel.h"

char LICENSE[] SEC("license") = "GPL";

/* The program's state: tunnel.h reads headers only; what is ours and what happened live here. */

/* Load-time setting: the GUE UDP port, host order. */
const volatile __u16 cfg_gue_port = LB_DEFAULT_GUE_PORT;

/* Addresses of this real server: decapsulation happens only for these outer destinations. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct lb_addr_key);
	__type(value, __u32);
} dc_local SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_DECAP_REASON_COUNT);
	__type(key, __u32);
	__type(value, struct lb_counter);
} dc_reasons SEC(".maps");

/* bpf_skb_adjust_room flags that Debian's 6.1 UAPI headers lack (the 6.18 kernel has them). */
enum decap_adj_room_flags {
	DECAP_ADJ_ROOM_L3_IPV4 = 1 << 7,
	DECAP_ADJ_ROOM_L3_IPV6 = 1 << 8,
};

static __always_inline void count_decap(enum lb_decap_reason reason, __u32 bytes)
{
	__u32 index = reason;
	struct lb_counter *c = bpf_map_lookup_elem(&dc_reasons, &index);

	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

static __always_inline int is_local(const __u32 *addr, __u8 family)
{
	struct lb_addr_key key = {};
	__u32 *ours;

	__builtin_memcpy(key.addr, addr, sizeof(key.addr));
	key.family = family;
	ours = bpf_map_lookup_elem(&dc_local, &key);
	return ours && *ours;
}

/* Fills t for an IPIP / GUE packet to one of our addresses; returns PARSE_OK or the enum
 * lb_decap_reason that ends the packet. */
static __always_inline int find_tunnel(void *data, void *data_end, __u32 frame_len, struct tunnel *t)
{
	int r = tunnel_outer(data, data_end, frame_len, cfg_gue_port, t);

	if (r != PARSE_OK)
		return r;
	if (!is_local(t->dst, t->outer_family))
		return LB_DECAP_PASS_NOT_LOCAL;
	return tunnel_inner(data, data_end, t);
}

static __always_inline __be16 family_ethertype(__u8 family)
{
	return family == LB_AF_INET ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
}

static __always_inline int decap_xdp_frame(struct xdp_md *ctx, __u32 frame_len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct tunnel t = {};
	__u8 l2[PARSE_L2_MAX];
	int r;

	r = find_tunnel(data, data_end, frame_len, &t);
	if (r != PARSE_OK)
		return r;
	if (data + PARSE_L2_MAX > data_end)
		return LB_DECAP_DROP_MALFORMED;
	__builtin_memcpy(l2, data, PARSE_L2_MAX);
	if (bpf_xdp_adjust_head(ctx, t.outer_len))
		return LB_DECAP_DROP_FAILED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + PARSE_L2_MAX > data_end)
		return LB_DECAP_DROP_FAILED;
	if (t.l2_len == PARSE_ETH_LEN) {
		__builtin_memcpy(data, l2, PARSE_ETH_LEN - 2);
		*(__be16 *)(data + PARSE_ETH_LEN - 2) = family_ethertype(t.inner_family);
	} else {
		__builtin_memcpy(data, l2, PARSE_L2_MAX - 2);
		*(__be16 *)(data + PARSE_L2_MAX - 2) = family_ethertype(t.inner_family);
	}
	return t.kind;
}

SEC("xdp")
int decap_xdp(struct xdp_md *ctx)
{
	__u32 frame_len = ctx->data_end - ctx->data;
	int reason = decap_xdp_frame(ctx, frame_len);

	count_decap(reason, frame_len);
	return reason == LB_DECAP_DROP_MALFORMED || reason == LB_DECAP_DROP_FAILED ? XDP_DROP : XDP_PASS;
}

/* A VLAN tag as the skb's metadata holds it. */
struct skb_vlan {
	__be16 proto;
	__u16 tci;
	__u8 present;
};

/* Moves the 802.1Q tag that is still in the frame into the skb's metadata (where the receive path
 * keeps tags), so that the frame starts with a plain Ethernet header that bpf_skb_adjust_room
 * accepts. A tag already in the metadata (the outer one of two) is returned in *outer: the caller
 * pushes it back after decapsulating, which moves the frame's tag back into the frame beneath it. */
static __always_inline int vlan_tag_to_metadata(struct __sk_buff *skb, void *data, void *data_end,
						struct skb_vlan *outer)
{
	struct ethhdr *eth = data;
	struct vlan_hdr *tag = (void *)(eth + 1);
	__be16 proto;
	__u16 tci;

	if ((void *)(tag + 1) > data_end)
		return LB_DECAP_DROP_MALFORMED;
	proto = eth->h_proto;
	tci = bpf_ntohs(tag->tci);
	outer->present = skb->vlan_present;
	outer->proto = skb->vlan_proto;
	outer->tci = skb->vlan_tci;
	/* With a tag in the metadata, pop drops it and moves the frame's tag there; without, it drops
	 * the frame's tag, which push then puts into the metadata. */
	if (bpf_skb_vlan_pop(skb))
		return LB_DECAP_DROP_FAILED;
	if (!outer->present && bpf_skb_vlan_push(skb, proto, tci))
		return LB_DECAP_DROP_FAILED;
	return PARSE_OK;
}

static __always_inline int decap_skb(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct tunnel t = {};
	struct skb_vlan outer_tag = {};
	__be16 ethertype;
	__u64 flags;
	int r;

	if (data + TUNNEL_MAX_HDRS > data_end && skb->len > data_end - data) {
		if (bpf_skb_pull_data(skb, skb->len < TUNNEL_MAX_HDRS ? skb->len : TUNNEL_MAX_HDRS))
			return LB_DECAP_DROP_FAILED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	r = find_tunnel(data, data_end, skb->len, &t);
	if (r != PARSE_OK)
		return r;
	if (t.l2_len != PARSE_ETH_LEN) {
		r = vlan_tag_to_metadata(skb, data, data_end, &outer_tag);
		if (r != PARSE_OK)
			return r;
	}
	flags = t.inner_family == LB_AF_INET ? DECAP_ADJ_ROOM_L3_IPV4 : DECAP_ADJ_ROOM_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -(__s32)t.outer_len, BPF_ADJ_ROOM_MAC, flags))
		return LB_DECAP_DROP_FAILED;
	ethertype = family_ethertype(t.inner_family);
	if (bpf_skb_store_bytes(skb, PARSE_ETH_LEN - 2, &ethertype, sizeof(ethertype), 0))
		return LB_DECAP_DROP_FAILED;
	/* The frame's own tag goes back into the frame, under the outer one, into the metadata. */
	if (outer_tag.present && bpf_skb_vlan_push(skb, outer_tag.proto, outer_tag.tci))
		return LB_DECAP_DROP_FAILED;
	return t.kind;
}

SEC("tc")
int decap_tc(struct __sk_buff *skb)
{
	__u32 frame_len = skb->len;
	int reason = decap_skb(skb);

	count_decap(reason, frame_len);
	return reason == LB_DECAP_DROP_MALFORMED || reason == LB_DECAP_DROP_FAILED ? TC_ACT_SHOT : TC_ACT_OK;
}
