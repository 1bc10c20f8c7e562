// Package testenv is the one test environment of the project: real
// servers started by the test on loopback, and the ways a test waits for
// them and reads what they report.
//
//   - Kafka: a kfake broker over TCP with the topics a test names, and
//     clients that produce to it and read a topic up to its end.
//   - Redis: real redis-server processes, standalone or a Cluster of
//     three masters, started through internal/redisproc and stopped when
//     the test ends.
//   - Replicas: whole workers started in the test's process through the
//     application's Run, with a bounded stop.
//   - Metrics: a worker's /metrics read with the Prometheus text parser.
//   - Eventually: a wait for a condition with a deadline that fails the
//     test loudly; tests never sleep to let something happen.
//   - Now: the present as tests use it, taken from the real clock, because
//     Redis applies expiries with its own real clock.
//
// The package imports neither the engine nor the application, so that the
// engine's own tests can use it; a test that starts replicas passes the
// application's Run (see RunFunc).
package testenv

import "os"

// Filter is the filter kind the tests run workers and filters with:
// DEDUPE_TEST_FILTER (bloom or fingerprint), bloom when unset. scripts/test
// runs the engine, the fault suite and the application's tests with each.
func Filter() string {
	if k := os.Getenv("DEDUPE_TEST_FILTER"); k != "" {
		return k
	}
	return "bloom"
}
