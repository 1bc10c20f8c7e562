# dedupe-worker image: a static Go binary on distroless, running as the
# numeric non-root user 65532. The binary writes nothing to disk, so the
# container runs with a read-only root filesystem (docker run --read-only,
# Kubernetes readOnlyRootFilesystem: true) and needs no volume.
#
#   docker build -t dedupe-worker .
#   docker build --target clicks -t dedupe-clicks .   (the demo's traffic)
#   docker run --read-only --cap-drop ALL --security-opt no-new-privileges \
#     --env-file config/clicks.env -p 8080:8080 dedupe-worker
#
# The builds need BuildKit (RUN --mount): the default from Docker 23 on;
# with Docker 20.10, set DOCKER_BUILDKIT=1. scripts/image-test builds both
# targets and runs them.

# ---- build ----
FROM golang:1.26 AS build
WORKDIR /src
# The module proxy, for builds that must use their company's own:
#   docker build --build-arg GOPROXY="$(go env GOPROXY)" .
# Empty, the image's default (the public proxy) holds.
ARG GOPROXY

# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .
# TARGETOS and TARGETARCH are set by BuildKit for each --platform; an empty
# value builds for the builder's own platform.
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w" -o /out/dedupe-worker ./cmd/dedupe-worker

# ---- clicks: the demo's traffic, an image of its own ----
# docker build --target clicks: the click generator and counter of the
# docker-compose demo (cmd/clicks). The worker's image below does not hold
# them; BuildKit skips these stages when it builds the worker.
FROM build AS clicks-build
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w" -o /out/clicks ./cmd/clicks

FROM gcr.io/distroless/static-debian12:nonroot AS clicks
COPY --from=clicks-build /out/clicks /clicks
USER 65532:65532
ENTRYPOINT ["/clicks"]

# ---- runtime: the worker (the default target) ----
# static-debian12 holds CA certificates (for DEDUPE_KAFKA_TLS and
# DEDUPE_REDIS_TLS without a CA file), tzdata and /etc/passwd with the
# nonroot user, and no shell or package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dedupe-worker /dedupe-worker
# Numeric, so Kubernetes can check runAsNonRoot without /etc/passwd.
USER 65532:65532
# DEDUPE_HTTP_ADDR defaults to :8080: /metrics, /healthz, /readyz.
EXPOSE 8080
ENTRYPOINT ["/dedupe-worker"]
