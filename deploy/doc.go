// Package deploy holds no code: its tests check the shipping files
// statically against the code they ship. The Dockerfile, .dockerignore and
// docker-compose.yml at the repository root, the Kubernetes manifests in
// deploy/kubernetes and the Grafana dashboard in deploy/grafana are
// parsed and compared with config.Config, the metrics the worker registers
// and the subcommands of cmd/dedupe-worker. Nothing is built or run with
// Docker or on a cluster.
package deploy
