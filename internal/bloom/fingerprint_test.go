package bloom

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The fingerprint kind's positions and fingerprints were computed once and
// must never change: tables in Redis outlive deploys, and replicas of
// different versions share them.
func TestFingerprintLocateGolden(t *testing.T) {
	f := &Filter{own: &windowPlan{plan: Plan{Kind: KindFingerprint, Shards: 7}}}
	golden := map[string]string{
		"":                                     "shard 0, u 0, fp e220a8397b1dcdaf",
		"click-1":                              "shard 1, u 3fe949b59fe25378, fp ecb05e57dc9bebe3",
		"click-2":                              "shard 6, u 3fe4158054e5ada6, fp d376be45f465dd4c",
		"3f2b9c1e-7d4a-4e8b-9a1c-2b3d4e5f6a7b": "shard 5, u 3fe8ac121dae684c, fp c7669e60ee5f3b55",
		"\x00\x01\xfe\xff":                     "shard 5, u 3fc6206c73710034, fp b2900d137ac91432",
	}
	var loc location
	for id, want := range golden {
		f.own.locate([]byte(id), &loc)
		got := fmt.Sprintf("shard %d, u %x, fp %016x", loc.shard, math.Float64bits(loc.u[0]), loc.fp)
		if got != want {
			t.Errorf("locate(%q) = %s, want %s: the element-to-slot mapping changed, every live table would be read wrong", id, got, want)
		}
	}
	// A stage takes the fingerprint's first bytes; all zero becomes one.
	if got := fmt.Sprintf("%x %x %x", fingerprint(0x0102030405060708, 3), fingerprint(0x0000_0011_0000_0000, 3), fingerprint(0, 8)); got != "010203 000001 0000000000000001" {
		t.Errorf("fingerprint widths: %s", got)
	}
}

// The rate formula against a simulated table: fresh IDs looked up in a
// table of 2-byte fingerprints (a rate large enough to count) filled by
// linear probing to several loads, over millions of lookups. The count
// is Poisson: within 5 standard deviations of the formula.
func TestFingerprintFPRMatchesSimulation(t *testing.T) {
	const (
		slots   = 1 << 18
		w       = 2
		lookups = 2_000_000
	)
	r := rand.New(rand.NewPCG(7, 11))
	for _, load := range []float64{0.3, 0.5, 0.65, 0.75, 0.85} {
		table := make([]uint16, slots+fpProbeLimit)
		for i := 0; i < int(load*slots); i++ {
			h := r.IntN(slots)
			fp := uint16(r.IntN(1<<16-1) + 1)
			for table[h] != 0 {
				h++
			}
			table[h] = fp
		}
		fp := 0
		for range lookups {
			h := r.IntN(slots)
			want := uint16(r.IntN(1<<16-1) + 1)
			for ; table[h] != 0; h++ {
				if table[h] == want {
					fp++
					break
				}
			}
		}
		mu := lookups * FingerprintFPR(w, load)
		t.Logf("load %.2f: %d false positives in %d lookups, formula %.1f", load, fp, lookups, mu)
		if math.Abs(float64(fp)-mu) > 5*math.Sqrt(mu)+1 {
			t.Errorf("load %.2f: %d false positives in %d lookups, formula says %.1f ± %.1f", load, fp, lookups, mu, 5*math.Sqrt(mu))
		}
	}
}
