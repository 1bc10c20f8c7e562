package bloom

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// Moving a shard's slot to another master while batches run: calls that
// meet MOVED are redirected by the client, calls that meet a half-moved
// slot (ASK, TRYAGAIN) fail whole and are retried, and every ID is still
// first seen exactly once. The migration waits, after marking the slot and
// after each key it moves, until a batch has run wholly in that state, so
// that batches meet every state of the half-moved slot.
func TestClusterSlotMigration(t *testing.T) {
	t0 := testenv.Now()
	cl := sharedCluster(t)
	cc := testenv.ClusterClient(t, cl)
	ctx := context.Background()
	// The stream is longer than the test needs: batches go on until the
	// migration is done and a batch has run wholly after it (on the slot's
	// new master, which the client finds through MOVED), and at least
	// minElements have been decided.
	const n, size, minElements = 80_000, 250, 20_000
	f := newFilter(t, cc, t0, n, 1e-6, func(cfg *Config) {
		cfg.Pipeline = "migrate"
		p, _ := NewPlan(n, 1e-6, PlanOptions{MinShards: 2, Kind: testKind})
		cfg.Plan = p
	})
	slot, err := cc.ClusterKeySlot(ctx, f.own.filterKey(0, 0)).Result()
	if err != nil {
		t.Fatal(err)
	}
	src, dst := slotOwner(t, cc, int(slot))
	es := stream(n, 4, 4, t0)

	// step is the migration's state as batches see it: 0 before it starts,
	// k+1 while the slot is half-moved with k keys moved, -1 once the slot
	// is assigned to dst. ran counts the attempts that began and ended in
	// each state.
	var step atomic.Int64
	var mu sync.Mutex
	ran := map[int64]int{}
	ranIn := func(s int64) int {
		mu.Lock()
		defer mu.Unlock()
		return ran[s]
	}
	halfMoved := func(moved int) error {
		s := int64(moved) + 1
		step.Store(s)
		if !testenv.Until(10*time.Second, func() bool { return ranIn(s) > 0 }) {
			return fmt.Errorf("no batch ran within 10s while slot %d was half-moved with %d keys moved", slot, moved)
		}
		return nil
	}
	type migration struct {
		moved int
		err   error
	}
	done := make(chan migration, 1)
	var migrated *migration

	firsts := map[string]int{}
	retries := 0
	seen := map[string]bool{}
	i := 0
	for ; i < minElements || migrated == nil || ranIn(-1) == 0; i += size {
		// The slot must hold keys to move: the migration starts once a few
		// batches have written them.
		if i == 8*size {
			go func() {
				moved, err := migrateSlot(ctx, cc, int(slot), src, dst, halfMoved)
				step.Store(-1)
				done <- migration{moved, err}
			}()
		}
		if migrated == nil {
			select {
			case m := <-done:
				if m.err != nil {
					t.Fatal(m.err)
				}
				migrated = &m
			default:
			}
		}
		if i+size > len(es) {
			t.Fatalf("the stream of %d elements ended before the migration did", len(es))
		}
		batch := es[i : i+size]
		v := retryBatch(t, time.Now().Add(10*time.Second), fmt.Sprintf("batch %d", i/size), func() ([]Verdict, error) {
			s := step.Load()
			v, err := f.TestAndSet(ctx, batch)
			if step.Load() == s {
				mu.Lock()
				ran[s]++
				mu.Unlock()
			}
			return v, err
		}, func(err error) {
			retries++
			if msg := err.Error(); !seen[msg] {
				seen[msg] = true
				t.Logf("retrying: %v", err)
			}
		})
		for k, x := range v {
			if x == FirstSeen || x == ReplayedFirstSeen {
				firsts[string(batch[k].ID)]++
			}
		}
	}
	if owner, _ := slotOwner(t, cc, int(slot)); owner.id != dst.id {
		t.Fatalf("slot %d still on %s", slot, owner.addr)
	}
	// With two keys or more, some states had the slot's keys on both nodes.
	if migrated.moved < 2 {
		t.Fatalf("the migration moved %d keys of slot %d, want 2 or more", migrated.moved, slot)
	}
	var during []int
	for s := int64(1); s <= int64(migrated.moved)+1; s++ {
		if ranIn(s) == 0 {
			t.Fatalf("no batch ran while slot %d was half-moved with %d keys moved", slot, s-1)
		}
		during = append(during, ranIn(s))
	}
	for _, e := range es[:i] {
		if n := firsts[string(e.ID)]; n != 1 {
			t.Fatalf("%s first seen %d times", e.ID, n)
		}
	}
	t.Logf("slot %d moved from %s to %s, %d keys; %d batches; attempts while half-moved, by keys moved: %v, after: %d; %d calls retried",
		slot, src.addr, dst.addr, migrated.moved, i/size, during, ranIn(-1), retries)
	assertAllKeysExpire(t, cc)
}

type node struct{ id, addr string }

// slotOwner returns the master serving slot and another master.
func slotOwner(t *testing.T, cc *redis.ClusterClient, slot int) (owner, other node) {
	t.Helper()
	slots, err := cc.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		n := node{s.Nodes[0].ID, s.Nodes[0].Addr}
		if slot >= s.Start && slot <= s.End {
			owner = n
		} else if other.id == "" || other.id == owner.id {
			other = n
		}
	}
	if other.id == owner.id {
		for _, s := range slots {
			if s.Nodes[0].ID != owner.id {
				other = node{s.Nodes[0].ID, s.Nodes[0].Addr}
			}
		}
	}
	return owner, other
}

// migrateSlot moves slot from src to dst the way redis-cli does: mark it
// importing and migrating, move the keys one at a time, then assign it. It
// calls halfMoved, with the number of keys moved so far, once the slot is
// marked and after each key it moves, and stops if that returns an error.
// It returns the number of keys it moved.
func migrateSlot(ctx context.Context, cc *redis.ClusterClient, slot int, src, dst node, halfMoved func(moved int) error) (int, error) {
	s := redis.NewClient(&redis.Options{Addr: src.addr})
	d := redis.NewClient(&redis.Options{Addr: dst.addr})
	defer s.Close()
	defer d.Close()
	if err := d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id).Err(); err != nil {
		return 0, fmt.Errorf("importing: %w", err)
	}
	if err := s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id).Err(); err != nil {
		return 0, fmt.Errorf("migrating: %w", err)
	}
	host, port, _ := strings.Cut(dst.addr, ":")
	moved := 0
	for {
		if err := halfMoved(moved); err != nil {
			return moved, err
		}
		keys, err := s.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			return moved, err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := s.Do(ctx, args...).Err(); err != nil {
			return moved, fmt.Errorf("migrate %v: %w", keys, err)
		}
		moved += len(keys)
	}
	for _, c := range []*redis.Client{d, s} {
		if err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.id).Err(); err != nil {
			return moved, fmt.Errorf("assigning: %w", err)
		}
	}
	return moved, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.id).Err()
	})
}
