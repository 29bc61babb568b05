// katran_ring.cc: a C entry point to Katran's own ring builder (katran::Vip and its Maglev), for
// lab/dut/katran_ring.py. Compiled at test time together with the Katran checkout's Vip.cpp,
// CHHelpers.cpp, MaglevBase.cpp, MaglevHash.cpp, MaglevHashV2.cpp and MurmurHash3.cpp: the ring
// comes from Katran's code, not from a model of it. Katran's control plane gives each real the
// hash of its address (folly's IPAddress::hash, not part of a Katran checkout): the caller passes it.
#include <cstdint>
#include <vector>

#include "katran/lib/Vip.h"

extern "C" int l4lab_katran_ring(int v2, uint32_t n, const uint32_t* nums, const uint32_t* weights,
                                 const uint64_t* hashes, uint32_t size, int32_t* out) {
  katran::Vip vip(0, 0, size, v2 ? katran::HashFunction::MaglevV2 : katran::HashFunction::Maglev);
  std::vector<katran::UpdateReal> update(n);
  for (uint32_t i = 0; i < n; i++) {
    update[i].action = katran::ModifyAction::ADD;
    update[i].updatedReal.num = nums[i];
    update[i].updatedReal.weight = weights[i];
    update[i].updatedReal.hash = hashes[i];
  }
  // A new Vip's ring is all -1, so the delta it answers is every slot the new ring fills.
  for (uint32_t i = 0; i < size; i++)
    out[i] = -1;
  for (const auto& pos : vip.batchRealsUpdate(update)) {
    if (pos.pos >= size)
      return -1;
    out[pos.pos] = static_cast<int32_t>(pos.real);
  }
  return 0;
}
