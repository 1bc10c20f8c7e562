package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"dedupe-worker/config"
)

// options are the flags: the run's, and the internal ones the parent
// hands its children.
type options struct {
	role       string
	n          int
	dup        float64
	batch      int
	linger     time.Duration
	partitions int
	brokers    string
	redis      string
	port       int
	cpuprofile string
	// idFrom and idField choose the worker's ID (DEDUPE_ID_FROM,
	// DEDUPE_ID_FIELD); mode is its DEDUPE_MODE.
	idFrom, idField, mode string
}

// The topics, every one with -partitions partitions.
const (
	inTopic   = "clicks"
	copyTopic = "copy-out"
	outTopic  = "dedupe-out"
	dlqTopic  = "dedupe-dlq"
)

// parseFlags reads the command line.
func parseFlags() options {
	var o options
	flag.StringVar(&o.role, "role", "", "internal: broker, copy or worker")
	flag.IntVar(&o.n, "n", 1_000_000, "click events")
	flag.Float64Var(&o.dup, "dup", 0.07, "share of events that repeat an earlier one")
	flag.IntVar(&o.batch, "batch", 1000, "messages per batch")
	flag.DurationVar(&o.linger, "linger", 100*time.Millisecond, "batch linger")
	flag.IntVar(&o.partitions, "partitions", 8, "partitions of every topic")
	flag.StringVar(&o.brokers, "brokers", "", "internal")
	flag.StringVar(&o.redis, "redis", "", "internal")
	flag.IntVar(&o.port, "port", 0, "internal")
	flag.StringVar(&o.idFrom, "id-from", "json", "where the worker reads the ID: json (the fields of -id-field, the time in ts) or value (a hash of the value, the time from the timestamp)")
	flag.StringVar(&o.idField, "id-field", "click_id", "with -id-from json: the ID field, or several separated by commas (user,click_id)")
	flag.StringVar(&o.mode, "mode", "drop", "the worker's mode: drop, or shadow (every event forwarded, duplicates marked)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write CPU profiles of the copy and the worker to this path + .copy and .worker, and allocation profiles + .copy.allocs and .worker.allocs")
	flag.Parse()
	return o
}

// checkFlags refuses, naming the flag, what the worker could not run
// with: a -mode or -id-from the bench does not offer, and any setting the
// worker's configuration refuses.
func checkFlags(o options) error {
	if o.mode != config.ModeDrop && o.mode != config.ModeShadow {
		return fmt.Errorf("-mode %q: want drop or shadow", o.mode)
	}
	if o.idFrom != "json" && o.idFrom != "value" {
		return fmt.Errorf("-id-from %q: want json or value (the events' keys are not their IDs)", o.idFrom)
	}
	err := workerConfig(o, "127.0.0.1:9092", "127.0.0.1:6379").Validate()
	if ve := (*config.VarError)(nil); errors.As(err, &ve) && flagOf[ve.Var] != "" {
		return fmt.Errorf("%s: %s", flagOf[ve.Var], ve.Msg)
	}
	return err
}

// flagOf names the flag that sets each worker variable.
var flagOf = map[string]string{"ID_FIELD": "-id-field", "BATCH_SIZE": "-batch", "BATCH_LINGER": "-linger"}

// idDesc says where the worker reads the IDs.
func idDesc(o options) string {
	src, err := workerConfig(o, "", "").IDSource()
	if err != nil {
		return err.Error()
	}
	return src.String()
}
