package bloom

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Recorded is what a partition's decision record says about one source.
type Recorded uint8

const (
	// NotDecided: at or above the record's watermark, or no record.
	NotDecided Recorded = iota
	// Forgotten: older than the replay horizon, or than the record (one
	// lost and made again); a replay would be forwarded as ReplayUnknown.
	Forgotten
	// RecordedForward: decided first seen (or not filtered: late, future).
	RecordedForward
	// RecordedDrop: decided duplicate.
	RecordedDrop
)

func (r Recorded) String() string {
	switch r {
	case NotDecided:
		return "not_decided"
	case Forgotten:
		return "forgotten"
	case RecordedForward:
		return "forward"
	case RecordedDrop:
		return "drop"
	}
	return fmt.Sprintf("Recorded(%d)", uint8(r))
}

// Recorded reads, without writing anything, what the decision records say
// of each element's source: the lookup a replay of it would make, in the
// record of its window's plan and its shard there. It reads each record
// once. It is for verification and
// tooling, not the hot path.
func (f *Filter) Recorded(ctx context.Context, elems []Element) ([]Recorded, error) {
	records := map[shardPartition][]byte{}
	out := make([]Recorded, len(elems))
	var loc location
	for i := range elems {
		e := &elems[i]
		wp, err := f.planOf(ctx, f.cfg.Window.Bucket(e.Time), false)
		if err != nil {
			return nil, err
		}
		wp.locate(e.ID, &loc)
		k := shardPartition{wp, loc.shard, e.Source.Topic, e.Source.Partition}
		rec, ok := records[k]
		if !ok {
			cctx, cancel := f.callCtx(ctx)
			b, err := f.client.Get(cctx, wp.recordKey(k.shard, k.topic, k.partition)).Bytes()
			cancel()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, fmt.Errorf("%w: reading a decision record: %w", ErrRedis, err)
			}
			rec = b
			records[k] = rec
		}
		out[i] = decodeRecorded(rec, e.Source.Offset, f.cfg.ReplayHorizon)
	}
	return out, nil
}

// watermark is one past the highest offset a record decided: its bits 0
// to 62; 0 for no record.
func watermark(rec []byte) int64 {
	if len(rec) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(rec[:8]) >> 1)
}

// floor is the lowest offset decided since a record was made: the 63 bits
// from bit 64 + horizon (a multiple of 8); 0 for no record, or one written
// only by versions that did not keep it.
func floor(rec []byte, horizon int64) int64 {
	at := (64 + horizon) / 8
	if int64(len(rec)) < at+8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(rec[at:at+8]) >> 1)
}

// deliveredMark is a record's delivered mark: the 63 bits from
// deliveredBit(horizon) (a multiple of 8); 0 for no record, or one never
// marked.
func deliveredMark(rec []byte, horizon int64) int64 {
	at := deliveredBit(horizon) / 8
	if int64(len(rec)) < at+8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(rec[at:at+8]) >> 1)
}

// decodeRecorded reads offset off from a record as the script writes it:
// bits 0 to 62 hold the watermark (highest decided offset + 1), bit
// 64 + off mod horizon the decision, 1 forward and 0 drop, the 63 bits
// from 64 + horizon the floor, bits counted from the most significant bit
// of the first byte as BITFIELD counts. An offset below the floor was not
// decided under this record (it was lost and made again): Forgotten.
func decodeRecorded(rec []byte, off, horizon int64) Recorded {
	mark := watermark(rec)
	switch {
	case off >= mark:
		return NotDecided
	case off < mark-horizon || off < floor(rec, horizon):
		return Forgotten
	}
	pos := 64 + off%horizon
	if int(pos/8) < len(rec) && rec[pos/8]>>(7-pos%8)&1 == 1 {
		return RecordedForward
	}
	return RecordedDrop
}
