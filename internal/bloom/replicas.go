package bloom

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrTooFewReplicas wraps (inside ErrRedis) the failure of a call whose
// writes fewer than Config.MinReplicas replicas acknowledged in time. The
// call was applied on the master; calling again gives the same decisions
// and succeeds once the replicas have caught up.
var ErrTooFewReplicas = errors.New("writes not acknowledged by enough replicas")

// syncTTL is how long a shard's sync key lives after its last write.
const syncTTL = time.Minute

// pipeliner is a client whose pipelines run on one connection: a
// *redis.Client, or a node client of a Cluster.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// runReplicated runs the script for one shard and makes its result count
// only once MinReplicas replicas have what it wrote: the script, a write
// of the shard's sync key and WAIT in one pipeline on one connection to
// the master serving the shard, as "Replicas and failover" in the package
// doc describes. On a Cluster a failed call reloads the slot map.
func (f *Filter) runReplicated(ctx context.Context, shard int, sc scriptCall) (string, error) {
	var conn pipeliner = f.client
	cc, _ := f.client.(*redis.ClusterClient)
	if cc != nil {
		node, err := cc.MasterForKey(ctx, f.syncKey(shard))
		if err != nil {
			cc.ReloadState(ctx)
			return "", fmt.Errorf("finding the master of shard %d: %w", shard, err)
		}
		conn = node
	}
	// The pipeline runs WAIT even when the script is refused, so a NOSCRIPT
	// answer costs the WAIT's time and leaves the retry only what remains:
	// until a shard's master is known to hold the script, send its source.
	load := !f.scriptCached[shard].Load()
	res, err := f.evalAndWait(ctx, conn, shard, load, sc)
	if !load && redis.HasErrorPrefix(err, "NOSCRIPT") {
		f.scriptCached[shard].Store(false)
		res, err = f.evalAndWait(ctx, conn, shard, true, sc)
	}
	if err != nil && cc != nil {
		// Asynchronous, and at most one reload every 200 ms however many
		// calls ask: cheap enough to ask on every failure, which also
		// covers a master cut off from its replica after a failover.
		cc.ReloadState(ctx)
	}
	return res, err
}

// evalAndWait sends the script (its source if load, else its hash), the
// sync key write and WAIT in one pipeline on conn.
func (f *Filter) evalAndWait(ctx context.Context, conn pipeliner, shard int, load bool, sc scriptCall) (string, error) {
	// WAIT gets half the time left, so that its own answer (how many
	// replicas acknowledged) arrives before the call's deadline. WAIT 0
	// would block forever: never ask for less than a millisecond.
	wait := time.Millisecond
	if dl, ok := ctx.Deadline(); ok {
		wait = max(wait, (time.Until(dl) / 2).Truncate(time.Millisecond))
	}
	pipe := conn.Pipeline()
	var script *redis.Cmd
	if load {
		script = testAndSetScript.Eval(ctx, pipe, sc.keys, sc.argv...)
	} else {
		script = testAndSetScript.EvalSha(ctx, pipe, sc.keys, sc.argv...)
	}
	mark := pipe.Set(ctx, f.syncKey(shard), "1", syncTTL)
	// Pipeliner lacks Wait; the command is built as cmdable.Wait builds it.
	acks := redis.NewIntCmd(ctx, "wait", f.cfg.MinReplicas, wait.Milliseconds())
	_ = pipe.Process(ctx, acks)
	_, execErr := pipe.Exec(ctx)
	res, err := script.Text()
	if err != nil {
		return "", err
	}
	f.scriptCached[shard].Store(true)
	if err := mark.Err(); err != nil {
		return "", fmt.Errorf("writing %s: %w", f.syncKey(shard), err)
	}
	n, err := acks.Result()
	if err != nil {
		return "", fmt.Errorf("WAIT: %w", err)
	}
	if execErr != nil {
		return "", execErr
	}
	if n < int64(f.cfg.MinReplicas) {
		return "", fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrTooFewReplicas, n, f.cfg.MinReplicas, wait)
	}
	return res, nil
}
