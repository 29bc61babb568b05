/* sess4_writer.c: a writer that rewrites one way of lb_sess4_sets in a tight loop, for test_sessions4.py.
 *
 * It alternates two whole images of the way, each written as session4.h's sess4_write writes one: a tag
 * whose check is "being written" (LB_SESS4_CHECK; its protocol bits the caller's) first, then the key and
 * the session, the final tag last.
 * Called through ctypes (which lets go of the GIL for the call) on a thread of its own, it runs until
 * *stop is set and returns how many images it wrote. It computes no checksum: the images come whole
 * from the test. Plain stores of the tag: not for way 0, whose tag holds its set's overflow bit.
 */
#include <stdint.h>

#include "abi.h"

/* One way's image: its key (the final tag in it) and its session. */
struct sess4_image {
	struct lb_sess4_key key;
	struct lb_session sess;
};

static void store32(__u32 *p, __u32 v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static void write_way(struct lb_sess4_key *k, struct lb_session *s, const struct sess4_image *img, __u32 writing)
{
	store32(&k->tag, writing);
	__atomic_thread_fence(__ATOMIC_RELEASE); /* "being written" before any word of the new image */
	store32(&k->src, img->key.src);
	store32(&k->dst, img->key.dst);
	store32(&k->ports, img->key.ports);
	store32(&s->real_id, img->sess.real_id);
	store32(&s->hash, img->sess.hash);
	__atomic_store_n(&s->atime_ns, img->sess.atime_ns, __ATOMIC_RELAXED);
	__atomic_store_n(&k->tag, img->key.tag, __ATOMIC_RELEASE); /* the final tag after the rest */
}

/* Rewrites way `way` of `set` (in the map's memory) with images[0], images[1], images[0], ..., each
 * behind the tag `writing` ("being written"). */
uint64_t l4lab_sess4_rewrite(struct lb_sess4_set *set, uint32_t way, const struct sess4_image images[2],
			     uint32_t writing, const int *stop)
{
	uint64_t written = 0;

	if (way >= LB_SESS4_WAYS)
		return 0;
	while (!__atomic_load_n(stop, __ATOMIC_RELAXED)) {
		write_way(&set->keys[way], &set->sess[way], &images[written & 1], writing);
		written++;
	}
	return written;
}
