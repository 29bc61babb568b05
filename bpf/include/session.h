/* session.h: the session tables (lb_sess4_sets for IPv4 flows, session4.h; the LRU lb_sessions for IPv6) and their rules. */
#ifndef L4LAB_SESSION_H
#define L4LAB_SESSION_H

#include "parse.h"
#include "maps.h"
#include "counters.h"
#include "session4.h"

enum tcp_flag_byte {
	TCPF_BYTE_FIN = 0x01,
	TCPF_BYTE_SYN = 0x02,
	TCPF_BYTE_RST = 0x04,
	TCPF_BYTE_ACK = 0x10,
};

/* Now on the coarse monotonic clock, in nanoseconds to a tick: (jiffies since boot) x (ns per jiffy).
 * The verifier inlines bpf_jiffies64() as one load of jiffies; bpf_ktime_get_coarse_ns() is a helper
 * call (architecture.md, decisions: "UDP idle times from jiffies"). The two clocks agree within a tick
 * or so, and with 1-second timeouts at the least, sessions written by either read alike. */
static __always_inline __u64 session_now_ns(void)
{
	if (!cfg_jiffy_ns) /* a load-time constant: the verifier drops the branch not taken */
		return bpf_ktime_get_coarse_ns();
	return (bpf_jiffies64() - cfg_jiffies_at_boot) * cfg_jiffy_ns;
}

/* Each CPU's SYNs in its current window of the coarse clock (2^30 nanoseconds, about a second). */
LB_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, 1, __u32, struct lb_syn_window) lb_syn_window SEC(".maps");

/* SYNs a CPU looks up per window; past them the window is a flood and its SYNs skip the lookup (Katran's
 * guard is 125,000 new connections a second per CPU). */
const volatile __u64 cfg_syn_lookups = 131072;

/* Whether this CPU is past cfg_syn_lookups SYNs in the current window (counting this one). A window set
 * ahead of the clock holds until the clock reaches it. */
static __always_inline int syn_flood(void)
{
	struct lb_syn_window *w = bpf_map_lookup_elem(&lb_syn_window, &lb_zero_key);
	__u64 window = session_now_ns() >> 30;

	if (!w)
		return 0;
	if (window > w->window) {
		w->window = window;
		w->syns = 0;
	}
	return ++w->syns > cfg_syn_lookups;
}

/* What the packet may do with its flow's session. */
struct session_ctx {
	struct sess4_slot slot; /* an IPv4 flow's way: found, or chosen for the insert */
	__u32 hash;      /* the flow hash the session holds (0: not known) */
	__u8 insert;     /* the ring's choice must be remembered */
	__u8 may_insert; /* not an RST, not an ICMP error about the flow */
	__u8 pad[2];
};

/* The flow's session: its real, hash and time copied to *found (an IPv4 one's checked against its tag),
 * and a pointer to it for a UDP touch; or NULL. `hash`: the flow hash (an IPv4 flow's two sets);
 * `choose`: an IPv4 miss picks the way the insert will take; `record` (a constant: not for ICMP errors,
 * which insert nothing): the lookup keeps the way for the insert. */
static __always_inline struct lb_session *session_find(struct session_ctx *sc, const struct lb_flow *key,
						       __u32 hash, int choose, const int record, struct lb_session *found)
{
	struct lb_session *sess;

	if (key->family == LB_AF_INET)
		return sess4_find(&sc->slot, key, hash, choose, record, found);
	sess = bpf_map_lookup_elem(&lb_sessions, key);
	if (sess) {
		found->real_id = sess->real_id;
		found->hash = sess->hash;
		found->atime_ns = sess->atime_ns;
	}
	return sess;
}

/* A UDP session's time is written back only once it is this old (a sixteenth of the timeout), so it
 * lags its last packet by less than that, and a session expires after the timeout plus this: between
 * 1 and 1 1/16 timeouts idle. A write per tick had every CPU serving the flow re-read its line each
 * tick (docs/architecture.md, decisions). */
static __always_inline __u64 udp_touch_ns(void)
{
	return cfg_udp_timeout_ns >> 4;
}

/* Looks the flow up and applies the rules: a SYN (without ACK) goes to the ring and creates no session,
 * a UDP session idle longer than cfg_udp_timeout_ns (and up to udp_touch_ns() more) is replaced, an RST
 * never creates a session. Returns the real id or 0. UDP idle time is read from the coarse monotonic
 * clock (one tick resolution, against timeouts of a second or more: session_now_ns). */
static __always_inline __u32 session_lookup(struct session_ctx *sc, const struct lb_flow *key, __u32 hash,
					    const struct packet *pkt, int steering, struct lb_tally *t)
{
	int tcp = pkt->flow.proto == IPPROTO_TCP;
	int rst = tcp && (pkt->tcp_flags & TCPF_BYTE_RST);
	struct lb_session *sess, found = {};

	sc->may_insert = !rst && !steering;
	sc->insert = sc->may_insert;
	if (tcp && !steering && (pkt->tcp_flags & (TCPF_BYTE_SYN | TCPF_BYTE_ACK)) == TCPF_BYTE_SYN) {
		/* The handshake's first non-SYN packet creates the session, to the real the ring (or a pin)
		 * gave the SYN: spoofed SYNs insert nothing and evict no one (docs/architecture.md,
		 * decisions). A SYN writes only over a session its tuple still has (a client reusing its
		 * port), with its final choice, so the ACK follows it; in a flood it skips even that lookup,
		 * most of a SYN's cost. */
		tally_event(t, LB_EV_SYN_REHASH);
		sc->insert = sc->may_insert = 0;
		if (syn_flood())
			return 0;
		if (session_find(sc, key, hash, 0, 1, &found))
			sc->insert = sc->may_insert = 1;
		return 0;
	}
	sess = session_find(sc, key, hash, sc->insert, !steering, &found);
	if (!sess) {
		tally_event(t, LB_EV_LRU_MISS);
		if (rst)
			tally_event(t, LB_EV_RST_NO_ENTRY);
		return 0;
	}
	if (key->proto == IPPROTO_UDP) {
		__u64 now = session_now_ns();

		if (now - found.atime_ns > cfg_udp_timeout_ns + udp_touch_ns()) {
			tally_event(t, LB_EV_UDP_EXPIRED);
			return 0;
		}
		if (!steering && now - found.atime_ns >= udp_touch_ns())
			sess->atime_ns = now;
	}
	sc->insert = 0;
	sc->hash = found.hash;
	tally_event(t, LB_EV_LRU_HIT);
	return found.real_id;
}

/* Writes the flow's session: an IPv4 flow's into the way its lookup chose (a TCP way keeps its insert
 * time, by which it ages), an IPv6 flow's into the LRU (only UDP sessions expire by idle time: a TCP
 * session's atime_ns stays 0 there, one clock read less). */
static __always_inline void session_insert(const struct session_ctx *sc, const struct lb_flow *key, __u32 real_id,
					   __u32 hash)
{
	struct lb_session sess = {
		.real_id = real_id,
		.hash = hash,
	};

	if (key->family == LB_AF_INET) {
		sess4_write(&sc->slot, key, real_id, hash, session_now_ns());
		return;
	}
	sess.atime_ns = key->proto == IPPROTO_UDP ? session_now_ns() : 0;
	bpf_map_update_elem(&lb_sessions, key, &sess, BPF_ANY);
}

#endif
