/* maglev_fill.c: the sequential part of a Maglev ring build, for balancer/maglev.py through ctypes.
 *
 * On each turn (turns[t] names a real), that real takes the next still-free slot of its own
 * permutation (offset + j * skip mod size, j counting up from where it stopped). The result is the
 * same as maglev._fill_python's, slot for slot: the tests compare the two on random inputs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int l4lab_maglev_fill(uint64_t size, uint64_t nreals, const uint64_t *offsets, const uint64_t *skips,
		      const int64_t *turns, int64_t *owner)
{
	uint8_t *taken = calloc(size, 1);
	uint64_t *pos = malloc(nreals * sizeof(*pos));

	if (!taken || !pos) {
		free(taken);
		free(pos);
		return -1;
	}
	memcpy(pos, offsets, nreals * sizeof(*pos));
	for (uint64_t t = 0; t < size; t++) {
		int64_t b = turns[t];
		uint64_t s = pos[b], skip = skips[b];

		while (taken[s]) {
			s += skip;
			if (s >= size)
				s -= size;
		}
		taken[s] = 1;
		owner[s] = b;
		s += skip;
		if (s >= size)
			s -= size;
		pos[b] = s;
	}
	free(taken);
	free(pos);
	return 0;
}
