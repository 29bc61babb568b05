/* session.h: the session tables (one LRU hash per CPU in lb_sessions, the shared lb_fallback) and their rules. */
#ifndef L4LAB_SESSION_H
#define L4LAB_SESSION_H

#include "parse.h"
#include "maps.h"
#include "counters.h"

enum tcp_flag_byte {
	TCPF_BYTE_FIN = 0x01,
	TCPF_BYTE_SYN = 0x02,
	TCPF_BYTE_RST = 0x04,
	TCPF_BYTE_ACK = 0x10,
};

/* Where a flow's session lives and what the packet may do with it. */
struct session_ctx {
	void *table;   /* this CPU's LRU, or lb_fallback when the controller left the slot empty */
	__u8 percpu;   /* table is a per-CPU LRU (so lb_fallback is worth a second look) */
	__u8 insert;   /* the ring's choice must be remembered */
	__u8 may_insert; /* not an RST, not an ICMP error about the flow */
	__u8 pad;
};

/* Looks the flow up and applies the rules: a SYN (without ACK) re-hashes, a UDP session idle longer
 * than cfg_udp_timeout_ns is replaced, an RST never creates a session. Returns the real id or 0.
 * UDP idle time is read from the coarse monotonic clock (one tick resolution, against timeouts of
 * a second or more): about 25 ns a packet cheaper than bpf_ktime_get_coarse_ns() on the live path here. */
static __always_inline __u32 session_lookup(struct session_ctx *sc, const struct lb_flow *key,
					    const struct packet *pkt, int steering)
{
	__u32 cpu = bpf_get_smp_processor_id();
	int tcp = pkt->flow.proto == IPPROTO_TCP;
	int syn = tcp && (pkt->tcp_flags & (TCPF_BYTE_SYN | TCPF_BYTE_ACK)) == TCPF_BYTE_SYN;
	int rst = tcp && (pkt->tcp_flags & TCPF_BYTE_RST);
	struct lb_session *sess = NULL;
	int fallback_hit = 0;

	sc->table = bpf_map_lookup_elem(&lb_sessions, &cpu);
	sc->percpu = sc->table != NULL;
	if (!sc->table)
		sc->table = &lb_fallback;
	sc->may_insert = !rst && !steering;
	sc->insert = 0;

	sess = bpf_map_lookup_elem(sc->table, key);
	if (!sess && sc->percpu) {
		sess = bpf_map_lookup_elem(&lb_fallback, key);
		fallback_hit = sess != NULL;
	}
	if (!sess) {
		count_event(LB_EV_LRU_MISS);
		if (rst)
			count_event(LB_EV_RST_NO_ENTRY);
		sc->insert = sc->may_insert;
		return 0;
	}
	if (syn) {
		count_event(LB_EV_SYN_REHASH);
		sc->insert = sc->may_insert;
		return 0;
	}
	if (key->proto == IPPROTO_UDP) {
		__u64 now = bpf_ktime_get_coarse_ns();

		if (now - sess->atime_ns > cfg_udp_timeout_ns) {
			count_event(LB_EV_UDP_EXPIRED);
			sc->insert = sc->may_insert;
			return 0;
		}
		if (!steering)
			sess->atime_ns = now;
	}
	count_event(fallback_hit ? LB_EV_FALLBACK_HIT : LB_EV_LRU_HIT);
	return sess->real_id;
}

static __always_inline void session_insert(const struct session_ctx *sc, const struct lb_flow *key, __u32 real_id)
{
	struct lb_session sess = {
		.real_id = real_id,
		.atime_ns = bpf_ktime_get_coarse_ns(),
	};

	bpf_map_update_elem(sc->table, key, &sess, BPF_ANY);
}

#endif
