package bloom

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dedupe-worker/internal/testenv"
)

// Moving a shard's slot to another master while batches run: calls that
// meet MOVED are redirected by the client, calls that meet a half-moved
// slot (ASK, TRYAGAIN) fail whole and are retried, and every ID is still
// first seen exactly once.
func TestClusterSlotMigration(t *testing.T) {
	t0 := realNow()
	cl := sharedCluster(t)
	cc := testenv.ClusterClient(t, cl)
	ctx := context.Background()
	f := newFilter(t, cc, t0, 50_000, 1e-6, func(cfg *Config) {
		cfg.Pipeline = "migrate"
		p, _ := NewPlan(50_000, 1e-6, PlanOptions{MinShards: 2})
		cfg.Plan = p
	})
	slot, err := cc.ClusterKeySlot(ctx, f.FilterKey(0, 0)).Result()
	if err != nil {
		t.Fatal(err)
	}
	src, dst := slotOwner(t, cc, int(slot))

	es := stream(20_000, 4, 4, t0)
	done := make(chan error, 1)
	go func() { done <- migrateSlot(ctx, cc, int(slot), src, dst) }()

	firsts := map[string]int{}
	retries := 0
	seen := map[string]bool{}
	for i := 0; i < len(es); i += 250 {
		batch := es[i : i+250]
		var v []Verdict
		for attempt := 0; ; attempt++ {
			v, err = f.TestAndSet(ctx, batch)
			if err == nil {
				break
			}
			if attempt == 100 {
				t.Fatalf("batch %d still failing: %v", i/250, err)
			}
			retries++
			if msg := err.Error(); !seen[msg] {
				seen[msg] = true
				t.Logf("retrying: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for k, x := range v {
			if x == FirstSeen || x == ReplayedFirstSeen {
				firsts[string(batch[k].ID)]++
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if owner, _ := slotOwner(t, cc, int(slot)); owner.id != dst.id {
		t.Fatalf("slot %d still on %s", slot, owner.addr)
	}
	for _, e := range es {
		if n := firsts[string(e.ID)]; n != 1 {
			t.Fatalf("%s first seen %d times", e.ID, n)
		}
	}
	t.Logf("slot %d moved from %s to %s; %d calls retried", slot, src.addr, dst.addr, retries)
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
// importing and migrating, move the keys a few at a time, then assign it.
func migrateSlot(ctx context.Context, cc *redis.ClusterClient, slot int, src, dst node) error {
	s := redis.NewClient(&redis.Options{Addr: src.addr})
	d := redis.NewClient(&redis.Options{Addr: dst.addr})
	defer s.Close()
	defer d.Close()
	if err := d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id).Err(); err != nil {
		return fmt.Errorf("importing: %w", err)
	}
	if err := s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id).Err(); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	host, port, _ := strings.Cut(dst.addr, ":")
	for {
		time.Sleep(30 * time.Millisecond) // let batches meet the half-moved slot
		keys, err := s.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := s.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("migrate %v: %w", keys, err)
		}
	}
	for _, c := range []*redis.Client{d, s} {
		if err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.id).Err(); err != nil {
			return fmt.Errorf("assigning: %w", err)
		}
	}
	return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.id).Err()
	})
}
