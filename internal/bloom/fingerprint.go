package bloom

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
)

// The fingerprint kind's positions: an element's shard is reduce(h2,
// shards), as the Bloom kind's; its position u in [0, 1) is the top 53
// bits of h1 (home slot floor(u * slots) in every stage, computed the same
// way in Go and in the script); its fingerprint is splitmix64 of h2, whose
// first b bytes (big-endian) a stage of b-byte fingerprints stores, or
// 0...01 when those are all zero (zero marks an empty slot). h1 and h2 are
// the two halves of MurmurHash3 x64 128 of the ID, so the position and the
// fingerprint are independent. Golden tests pin the mapping.

// locateFingerprint sets loc's shard, position and fingerprint for id of
// hash halves h1, h2.
func locateFingerprint(h1, h2 uint64, shards int, loc *location) {
	loc.shard = int(reduce(h2, uint64(shards)))
	loc.u = [MaxWords]float64{float64(h1>>11) * 0x1p-53}
	s := h2
	loc.fp = splitmix64(&s)
}

// fingerprint is the b bytes a stage of b-byte fingerprints stores for
// an element of fingerprint fp.
func fingerprint(fp uint64, b int) []byte {
	var full [8]byte
	binary.BigEndian.PutUint64(full[:], fp)
	out := append([]byte(nil), full[:b]...)
	for _, c := range out {
		if c != 0 {
			return out
		}
	}
	out[b-1] = 1
	return out
}

// homeSlot is the part and the byte offset in it of the home of an element
// at position u in stage st: slot floor(u * slots), in parts of PartSlots.
// The script computes the same with the same double arithmetic.
func homeSlot(u float64, st Stage) (part int, off uint64) {
	slot := uint64(u * float64(st.slots()))
	return int(slot / st.PartSlots), slot % st.PartSlots * uint64(st.Bytes)
}

// probeFingerprint is probe for the fingerprint kind: the part holding the
// ID's home, read from the home as the script reads it, up to the first
// empty slot.
func (f *Filter) probeFingerprint(ctx context.Context, wp *windowPlan, p *Probe, loc *location) error {
	st := wp.plan.Stages[p.Stage]
	part, off := homeSlot(loc.u[0], st)
	p.Key = wp.partKey(loc.shard, p.Bucket, p.Stage, part)
	ttl, err := f.client.PTTL(ctx, p.Key).Result()
	if err != nil {
		return fmt.Errorf("%w: reading the TTL of %s: %w", ErrRedis, p.Key, err)
	}
	if ttl == -2 {
		p.Exists, p.Holds, p.TTL = false, false, 0
		return nil
	}
	p.Exists, p.TTL = true, max(ttl, 0)
	run, err := f.client.GetRange(ctx, p.Key, int64(off), int64(off)+fpProbeLimit*int64(st.Bytes)-1).Bytes()
	if err != nil {
		return fmt.Errorf("%w: reading %s: %w", ErrRedis, p.Key, err)
	}
	p.Holds = runHolds(run, fingerprint(loc.fp, st.Bytes))
	return nil
}

// runHolds reports whether the run of slots from a home (slots of
// len(fp) bytes) holds fp before its first empty slot, as the script
// decides it.
func runHolds(run, fp []byte) bool {
	w := len(fp)
	empty := make([]byte, w)
	for i := 0; i+w <= len(run); i += w {
		slot := run[i : i+w]
		if bytes.Equal(slot, empty) {
			return false
		}
		if bytes.Equal(slot, fp) {
			return true
		}
	}
	return false
}
