/* balancer.bpf.c: the XDP load balancer: parse, match a VIP, pick a real (session or Maglev ring), encapsulate, count. */
#include "parse.h"
#include "maps.h"
#include "counters.h"
#include "session.h"
#include "katran_hash.h"
#include "encap.h"
#include "icmp.h"
#include "route.h"
#include "decap_inline.h"

char LICENSE[] SEC("license") = "GPL";

_Static_assert(LB_VIP_INDEX_SLOTS == 1 << 12, "find_vip takes the top 12 bits of the product");
_Static_assert(sizeof(struct lb_vip_slot) == 32 && __builtin_offsetof(struct lb_vip_slot, key) == 12,
	       "the controller writes lb_vip_index as 8 words: meta (3), then the key (5)");

/* The last word of a VIP key (port, proto, family), as one 32-bit value. */
union vip_key_tail {
	__u32 word;
	struct {
		__u16 port;
		__u8 proto;
		__u8 family;
	};
};

/* A VIP key as the datapath builds it: the last word (port, proto, family) stored as one 32-bit word,
 * so that find_vip's 32-bit loads of it are forwarded from that store (built from three stores of
 * other widths, the load would wait for them to reach the cache: a stall on every packet). */
union vip_key_words {
	struct lb_vip_key key;
	__u32 w[5];
};

/* lb_vips' entry for a key, through lb_vip_index (struct lb_vip_slot in abi.h). The slot's last key
 * word is read once, first, and behind a compiler barrier: x86 keeps loads in program order, and the
 * controller stores that word after the rest of the slot (and sets it SHARED before changing the rest),
 * so when it equals the key's, the address words and the meta read after it are the key's own. */
static __always_inline struct lb_vip_meta *find_vip(const union vip_key_words *want)
{
	__u32 i = ((want->w[0] ^ want->w[1] ^ want->w[2] ^ want->w[3] ^ want->w[4]) *
		   (__u32)LB_VIP_INDEX_HASH) >>
		  (32 - 12);
	struct lb_vip_slot *slot = bpf_map_lookup_elem(&lb_vip_index, &i);
	union vip_key_tail tail;

	if (!slot)
		return NULL; /* never: i < LB_VIP_INDEX_SLOTS */
	tail.word = *(volatile __u32 *)&((__u32 *)&slot->key)[4];
	asm volatile("" ::: "memory");
	if (tail.word == want->w[4])
		return slot->key.addr[0] == want->w[0] && slot->key.addr[1] == want->w[1] &&
		       slot->key.addr[2] == want->w[2] && slot->key.addr[3] == want->w[3] ? &slot->meta : NULL;
	if (tail.family == LB_VIP_SLOT_SHARED)
		return bpf_map_lookup_elem(&lb_vips, &want->key);
	return NULL; /* empty (no VIP has this key), or another key's */
}

/* An address as the VIP lookups read it: four 32-bit words, network order (an IPv4 address in w[0]). */
struct vip_addr {
	__u32 w[4];
};

/* The VIP that is a prefix holding addr (lb_vip_cidrs), for (port, proto) else every port: its meta
 * copied to *out, 1; 0 when none, or when no VIP is a prefix. A global function (it cannot hand back
 * the map's pointer): the exact VIPs' packets never reach it. */
__noinline int find_vip_cidr(const struct vip_addr *addr, __u32 tail_word, struct lb_vip_meta *out)
{
	struct lb_settings *s = bpf_map_lookup_elem(&lb_settings, &lb_zero_key);
	union vip_key_tail tail = { .word = tail_word };
	struct lb_vip_cidr_key key = {};
	struct lb_vip_meta *vip;

	if (!addr || !out || !s || !s->cidr_vips)
		return 0;
	key.prefixlen = 32 + 128;
	key.port = tail.port;
	key.proto = tail.proto;
	key.family = tail.family;
	__builtin_memcpy(key.addr, addr->w, sizeof(key.addr));
	vip = bpf_map_lookup_elem(&lb_vip_cidrs, &key);
	if (!vip && key.port != LB_MATCH_ANY_PORT) {
		key.port = LB_MATCH_ANY_PORT;
		vip = bpf_map_lookup_elem(&lb_vip_cidrs, &key);
	}
	if (!vip)
		return 0;
	*out = *vip;
	return 1;
}

/* Whether any VIP is a prefix (settings.cidr_vips): an array lookup the verifier inlines. */
static __always_inline int cidr_vips_counted(void)
{
	struct lb_settings *s = bpf_map_lookup_elem(&lb_settings, &lb_zero_key);

	return s && s->cidr_vips;
}

/* The VIP serving (addr, port, proto): the exact entry, else the port-0 wildcard, else a VIP that is
 * a prefix holding the address (its meta copied into *cidr). */
static __always_inline const struct lb_vip_meta *lookup_vip(const __u32 *addr, __u16 port, __u8 proto,
							    __u8 family, struct lb_vip_meta *cidr)
{
	union vip_key_tail tail = { .port = port, .proto = proto, .family = family };
	union vip_key_words want;
	struct lb_vip_meta *vip;

	__builtin_memcpy(want.w, addr, sizeof(want.key.addr));
	want.w[4] = tail.word;
	vip = find_vip(&want);
	if (vip)
		return vip;
	if (port != LB_MATCH_ANY_PORT) {
		tail.port = LB_MATCH_ANY_PORT;
		want.w[4] = tail.word;
		vip = find_vip(&want);
		if (vip)
			return vip;
		tail.port = port;
	}
	if (!cidr_vips_counted()) /* spares non-VIP packets the call (architecture.md, decisions) */
		return NULL;
	return find_vip_cidr((const struct vip_addr *)addr, tail.word, cidr) ? cidr : NULL;
}

/* Whether some VIP uses this address (the controller's address-only entry). A global function: the
 * verifier checks it once for its three callers, which reach it on paths it would otherwise walk apart. */
__noinline int is_vip_addr(const struct vip_addr *addr, __u8 family)
{
	struct lb_vip_meta cidr;

	return addr && lookup_vip(addr->w, LB_MATCH_ANY_PORT, LB_MATCH_ADDR_ONLY, family, &cidr) != NULL;
}

/* The flow key that hashing and sessions use, after the VIP's hashing flags: a copy on this stack
 * frame (its pad is zero: struct packet starts zeroed, quoted flows too), normalised if a flag says
 * so. Always a copy: `flow` is a global function's argument (PTR_TO_MEM to the verifier), which
 * kernel 6.1 refuses as a map helper's key ("R2 type=mem expected=fp, pkt, pkt_meta, map_key,
 * map_value": Debian 12's kernel on the Vagrant LB); 6.18 takes it. */
static __always_inline const struct lb_flow *flow_key(struct lb_flow *copy, const struct lb_flow *flow,
						      __u32 vip_flags)
{
	*copy = *flow;
	if (!(vip_flags & (LB_VIP_HASH_DPORT_ONLY | LB_VIP_HASH_NO_SPORT)))
		return copy;
	copy->pad = 0;
	copy->sport = 0;
	if (vip_flags & LB_VIP_HASH_DPORT_ONLY)
		__builtin_memset(copy->src, 0, sizeof(copy->src));
	return copy;
}

/* The ring slot of a flow hash: hash x size / 2^32, each slot taking 2^32 / size hashes (rounded down
 * or up) as hash % size does; a multiply, as the division waited on the live path (architecture.md). */
static __always_inline __u32 ring_index(__u32 hash, __u32 size)
{
	return ((__u64)hash * size) >> 32;
}

/* Sends a packet of `flow` (client -> VIP) to its real: session or ring, size check, encap, counters.
 * `steering` (a constant at each call site) is set for an ICMP error about the flow: it follows the
 * flow but creates no session and never gets a too-big answer. Inlined into process(), where a TCP
 * or UDP packet comes, and into forward_steered() for ICMP errors. */
static __always_inline int forward(struct xdp_md *ctx, const struct packet *pkt, const struct lb_flow *flow,
				   const struct lb_vip_meta *vip, struct lb_tally *t, const int steering)
{
	__u32 vip_flags, vip_num;
	struct lb_settings *s = bpf_map_lookup_elem(&lb_settings, &lb_zero_key);
	struct session_ctx sc = { .slot.way = SESS4_NO_WAY };
	struct lb_real *real = NULL;
	struct lb_flow copy;
	const struct lb_flow *key;
	__u32 hash, real_id = 0, overhead, ring_size, slot, ring_real;
	__u32 *ring_entry;
	int reason;
	__u8 mode;

	if (!pkt || !flow || !vip || !t)
		return LB_DROP_ENCAP_FAILED; /* never: the callers pass their own stack and map values */
	vip_flags = vip->flags;
	vip_num = vip->vip_num;
	mode = vip->encap;
	if (unlikely(!s || !s->configured))
		return LB_DROP_NO_SETTINGS;
	key = flow_key(&copy, flow, vip_flags);

	/* The ring's choice is read before the session lookup, for every packet: its loads then wait
	 * alongside the lookup's (a new flow's bucket is a cold line of a table of megabytes) instead of
	 * after it, where the branch on the lookup's answer holds them back. */
	ring_size = cfg_ring_size;
	if (unlikely(!ring_size))
		return LB_DROP_NO_REAL;
	if (unlikely(vip_flags & LB_VIP_HASH_KATRAN)) { /* a ring shared with Katran nodes: Katran's hash and slot */
		hash = hash_flow_katran(key, vip_flags);
		slot = hash % ring_size;
	} else {
		hash = hash_flow(key);
		slot = ring_index(hash, ring_size);
	}
	slot += vip_num * ring_size;
	ring_entry = bpf_map_lookup_elem(&lb_ring, &slot);
	ring_real = ring_entry ? *ring_entry : 0;

	if (!(vip_flags & LB_VIP_NO_LRU)) {
		real_id = session_lookup(&sc, key, hash, pkt, steering, t);
		if (real_id) {
			real = bpf_map_lookup_elem(&lb_reals, &real_id);
			if (!real || !real->family) { /* the real left since: choose again */
				real_id = 0;
				sc.insert = sc.may_insert;
			} else if (sc.hash) {
				hash = sc.hash; /* a session hit: the hash it was made with */
			}
		}
	}
	/* Server ids, pinned sources, UDP migration (route.h); an ICMP error follows the flow's session
	 * or the ring instead: the stack of forward_steered()'s call chain has no room for route_extra(). */
	if (unlikely(!steering && (vip_flags & LB_VIP_ROUTE_EXTRA))) {
		struct route_choice rc = { .vip_num = vip_num, .vip_flags = vip_flags, .real_id = real_id,
					   .insert = sc.insert, .may_insert = sc.may_insert };

		route_extra(ctx, pkt, flow, &rc);
		sc.insert = rc.insert;
		if (rc.real_id != real_id) {
			real_id = rc.real_id;
			real = real_id ? bpf_map_lookup_elem(&lb_reals, &real_id) : NULL;
		}
	}
	if (!real_id) {
		real_id = ring_real;
		if (!real_id)
			return LB_DROP_NO_REAL;
		real = bpf_map_lookup_elem(&lb_reals, &real_id);
		if (!real || !real->family)
			return LB_DROP_REAL_MISSING;
	}
	if (!real)
		return LB_DROP_REAL_MISSING;
	if (unlikely(pkt->flow.family == LB_AF_INET6 && real->family != LB_AF_INET6))
		return LB_DROP_FAMILY_MISMATCH;

	counter_touch(&lb_vip_stats, vip_num);
	counter_touch(&lb_real_stats, real_id);
	overhead = encap_overhead(mode, real->family);
	if (unlikely(s->mtu && pkt->ip_len + overhead > s->mtu)) {
		/* Never an ICMP error about an ICMP error; never a fragment from us. */
		if (steering || (pkt->flow.family == LB_AF_INET && !pkt->df))
			return LB_DROP_TOO_BIG_NO_DF;
		return icmp_send_too_big(ctx, pkt, s->mtu - overhead);
	}
	if (!steering && sc.insert) /* never for an ICMP error: said so, the compiler drops the insert's code */
		session_insert(&sc, key, real_id, hash);

	reason = encap_packet(ctx, pkt, real, mode, hash, s, vip_flags);
	if (reason == LB_TX_ENCAP) {
		count_into(&lb_vip_stats, vip_num, pkt->frame_len);
		count_into(&lb_real_stats, real_id, pkt->frame_len);
	}
	return reason;
}

/* forward() for an ICMP error steered along the flow it quotes. A global function: the verifier checks
 * it once, apart from the TCP / UDP path, where forward() is inlined, as a call there costs every frame
 * (architecture.md, decisions: "forward() inlined"). The two frames (balancer_xdp's, with the
 * inlined copy, and this one's) and its callees' share the verifier's 512 bytes of stack: hence the
 * headers written in place (encap.h), the .rodata keys (maps.h) and the rolled IPv6 hash (hash.h). */
__noinline int forward_steered(struct xdp_md *ctx, const struct packet *pkt, const struct lb_flow *flow,
			       const struct lb_vip_meta *vip, struct lb_tally *t)
{
	int reason = forward(ctx, pkt, flow, vip, t, 1);

	if (reason == LB_TX_ENCAP)
		tally_event(t, LB_EV_ICMP_STEERED);
	return reason;
}

/* Two-arm (cfg_egress_ifindex set): an encapsulated frame leaves by the egress interface, from its MAC,
 * through the program's devmap: LB_TX_ENCAP, its redirect set up, or LB_DROP_NO_EGRESS when the devmap
 * has no entry (the interface is gone); any other reason as it is. Called where forward() returns, not
 * in balance(): there the frags program's frame grew past the verifier's 512 bytes. The ICMP answers
 * the LB makes itself (echo, too big) go back to their sender by the interface they came in on, whose
 * neighbour routes to the client. */
static __always_inline int egress_of(struct xdp_md *ctx, int reason, const int frags)
{
	void *data, *data_end;

	if (reason != LB_TX_ENCAP || !cfg_egress_ifindex) /* the reason first: others read no .rodata */
		return reason;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + PARSE_ETH_LEN > data_end)
		return LB_DROP_ENCAP_FAILED; /* never: the encap wrote the header */
	*(__u32 *)(data + 6) = (__u32)cfg_egress_mac;
	*(__u16 *)(data + 10) = (__u16)(cfg_egress_mac >> 32);
	return bpf_redirect_map(frags ? (void *)&lb_egress_frags : (void *)&lb_egress, 0, 0) == XDP_REDIRECT
		       ? LB_TX_ENCAP
		       : LB_DROP_NO_EGRESS;
}

/* ICMP and ICMPv6: echo for VIPs, errors about VIP flows steered to their real, the rest passed. */
static __always_inline int handle_icmp(struct xdp_md *ctx, const struct packet *pkt, struct lb_tally *t,
					const int frags)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	int v4 = pkt->flow.family == LB_AF_INET;
	int to_vip = is_vip_addr((const struct vip_addr *)pkt->flow.dst, pkt->flow.family);
	__u8 *icmp = l4_header(data, data_end, pkt, sizeof(struct icmp4_hdr));
	struct lb_flow quoted = {};
	struct lb_vip_meta cidr;
	const struct lb_vip_meta *vip;
	__u8 type;

	if (!icmp)
		return to_vip ? LB_DROP_MALFORMED_L4 : LB_PASS_ICMP_NOT_VIP;
	type = icmp[0];
	if (!v4 && type > ICMP6_ECHO_REPLY) /* neighbour discovery, MLD, router advertisements */
		return LB_PASS_ICMP_NOT_VIP;
	if (type == (v4 ? ICMP4_ECHO_REQUEST : ICMP6_ECHO_REQUEST)) {
		if (!to_vip)
			return LB_PASS_ICMP_NOT_VIP;
		return icmp_checksum_ok(ctx, pkt) ? icmp_echo_reply(ctx, pkt) : LB_DROP_ICMP_CHECKSUM;
	}
	if ((v4 ? icmp4_is_error(type) : icmp6_is_error(type)) &&
	    icmp_quoted_flow(data, data_end, pkt, &quoted) == 0) {
		vip = lookup_vip(quoted.dst, quoted.dport, quoted.proto, quoted.family, &cidr);
		if (vip)
			return egress_of(ctx, forward_steered(ctx, pkt, &quoted, vip, t), frags);
	}
	return to_vip ? LB_DROP_ICMP_UNSUPPORTED : LB_PASS_ICMP_NOT_VIP;
}

/* IPv6 and its extension-header chain, checked by the verifier once (a global function) rather than
 * on every path of the program that follows it. */
__noinline int parse_ipv6_hdrs(struct xdp_md *ctx, struct packet *pkt)
{
	if (!pkt)
		return LB_DROP_MALFORMED_IP;
	return parse_ipv6((void *)(long)ctx->data, (void *)(long)ctx->data_end, pkt);
}

/* The flow's last 8 bytes (both ports, proto, family, pad) as one 64-bit value, for one store: the
 * flow key's later word loads are forwarded from it (built from stores of other widths, they would
 * wait for each to reach the cache). */
static __always_inline __u64 l4_word(const struct packet *pkt, __u32 ports)
{
	return ports | (__u64)pkt->flow.proto << 32 | (__u64)pkt->flow.family << 40;
}

/* A packet that is no VIP's: passed, unless it is a tunnel to one of our decap addresses
 * (decap_inline.h); one whose inner packet is to be balanced runs the program again from the start, by
 * a tail call into the array holding this very program (`frags`: a constant, each program has its own). */
static __always_inline int not_vip(struct xdp_md *ctx, const struct packet *pkt, const int frags)
{
	struct lb_settings *s = bpf_map_lookup_elem(&lb_settings, &lb_zero_key);
	int r;

	if (!s || !s->decaps) /* no call for other packets while no address is a decap address */
		return LB_PASS_NOT_VIP;
	r = decap_inline(ctx, pkt);

	if (r != DECAP_RECIRCULATE)
		return r;
	count_event_now(LB_EV_DECAP_INLINE);
	if (frags)
		bpf_tail_call(ctx, &lb_progs_frags, 0);
	else
		bpf_tail_call(ctx, &lb_progs, 0);
	return LB_DROP_DECAP_FAILED; /* the array is empty (the loader fills it), or tunnels nest too deep */
}

static __always_inline int process(struct xdp_md *ctx, struct packet *pkt, struct lb_tally *t, const int frags)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct lb_vip_meta cidr;
	const struct lb_vip_meta *vip;
	int r;

	r = parse_eth(data, data_end, pkt);
	if (r != PARSE_OK)
		return r;
	r = pkt->flow.family == LB_AF_INET ? parse_ipv4(data, data_end, pkt) : parse_ipv6_hdrs(ctx, pkt);
	if (r != PARSE_OK)
		return r;
	if (unlikely(pkt->fragment || pkt->options)) {
		if (!is_vip_addr((const struct vip_addr *)pkt->flow.dst, pkt->flow.family))
			return LB_PASS_FRAG_NOT_VIP;
		return pkt->fragment ? LB_DROP_FRAGMENT : LB_DROP_IP_OPTIONS;
	}

	if (likely(pkt->flow.proto == IPPROTO_TCP)) {
		struct tcphdr *th = l4_header(data, data_end, pkt, sizeof(*th));

		if (unlikely(!th))
			goto truncated;
		*(__u64 *)&pkt->flow.sport = l4_word(pkt, *(const __u32 *)th);
		pkt->tcp_flags = ((__u8 *)th)[13];
	} else if (likely(pkt->flow.proto == IPPROTO_UDP)) {
		struct udphdr *uh = l4_header(data, data_end, pkt, sizeof(*uh));

		if (unlikely(!uh))
			goto truncated;
		*(__u64 *)&pkt->flow.sport = l4_word(pkt, *(const __u32 *)uh);
		pkt->udp_csum_zero = !uh->check;
	} else if (pkt->flow.proto == (pkt->flow.family == LB_AF_INET ? IPPROTO_ICMP : IPPROTO_ICMPV6)) {
		return handle_icmp(ctx, pkt, t, frags);
	} else if (pkt->flow.proto == IPPROTO_IPIP || pkt->flow.proto == IPPROTO_IPV6) {
		return not_vip(ctx, pkt, frags);
	} else {
		return LB_PASS_NOT_VIP;
	}

	vip = lookup_vip(pkt->flow.dst, pkt->flow.dport, pkt->flow.proto, pkt->flow.family, &cidr);
	if (unlikely(!vip))
		return pkt->flow.proto == IPPROTO_UDP ? not_vip(ctx, pkt, frags) : LB_PASS_NOT_VIP;
	return egress_of(ctx, forward(ctx, pkt, &pkt->flow, vip, t, 0), frags);

truncated:
	return is_vip_addr((const struct vip_addr *)pkt->flow.dst, pkt->flow.family) ? LB_DROP_MALFORMED_L4
										      : LB_PASS_NOT_VIP;
}

static __always_inline int action_of(int reason)
{
	switch (reason) {
	case LB_TX_ENCAP: /* two-arm: egress_of() set the redirect up */
		return cfg_egress_ifindex ? XDP_REDIRECT : XDP_TX;
	case LB_TX_ICMP_ECHO:
	case LB_TX_ICMP_TOO_BIG:
	case LB_TX_DECAP_EGRESS:
		return XDP_TX;
	case LB_PASS_NOT_IP:
	case LB_PASS_NOT_VIP:
	case LB_PASS_ICMP_NOT_VIP:
	case LB_PASS_FRAG_NOT_VIP:
	case LB_PASS_DECAP_LOCAL:
		return XDP_PASS;
	default:
		return XDP_DROP;
	}
}

/* `frags`: the frame may span several buffers, whose total length only the helper knows. */
static __always_inline int balance(struct xdp_md *ctx, int frags)
{
	struct packet pkt = {};
	struct lb_tally tally = {};
	int reason;

	pkt.frame_len = frags ? bpf_xdp_get_buff_len(ctx) : ctx->data_end - ctx->data;
	reason = process(ctx, &pkt, &tally, frags);
	count_packet(reason, pkt.frame_len, &tally);
	return action_of(reason);
}

SEC("xdp")
int balancer_xdp(struct xdp_md *ctx)
{
	return balance(ctx, 0);
}

/* The same program for multi-buffer frames (MTU 9000 labs); headers must sit in the first buffer. */
SEC("xdp.frags")
int balancer_xdp_frags(struct xdp_md *ctx)
{
	return balance(ctx, 1);
}
