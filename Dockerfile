# podmutator's pod-side image: `podmutator fetch` (the init container of reference delivery)
# and `podmutator-exec`, the small exec wrapper that fetch copies into the pod (beside it, where
# fetch looks for it). Two static binaries, nothing else. The same image runs `podmutator serve`
# for the in-cluster install (deploy/kubernetes), so its build has the features the Lambda zip
# leaves out (Cargo.toml, [features]).
#
#   docker buildx build --platform linux/arm64,linux/amd64 -t <repo>:<tag> --push .
#
# The build stage runs on the builder's own platform and cross-compiles with zig (no QEMU
# emulation, which makes an arm64 release build ten times slower); musl makes the binary
# static, so the final image needs no libc. It builds with cargo-lambda, pinned as in
# scripts/requirements/venv.txt: the tool that builds the Lambda zip, and the exact command
# scripts/pod-image.sh runs (and checks the result of) without Docker.
ARG RUST_VERSION=1.95

FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-slim-bookworm AS build
ARG TARGETARCH
# cargo-lambda and zig pinned as in scripts/requirements/venv.txt.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && pip3 install --no-cache-dir --break-system-packages cargo-lambda==1.9.2 ziglang==0.17.1 \
    && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
# The commit `podmutator version` names (build.rs): the context holds no Git metadata, so it is
# "unknown" unless given (`--build-arg PODMUTATOR_COMMIT=$(git rev-parse --short=12 HEAD)`, as
# scripts/release.sh does).
ARG PODMUTATOR_COMMIT
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
RUN case "$TARGETARCH" in \
        amd64) target=x86_64-unknown-linux-musl ;; \
        arm64) target=aarch64-unknown-linux-musl ;; \
        *) echo "unsupported TARGETARCH $TARGETARCH (build linux/amd64 or linux/arm64)" >&2; exit 1 ;; \
    esac \
    && cargo lambda build --locked --release --features podmutator/serve,podmutator/tools --bin podmutator --bin podmutator-exec --target "$target" --lambda-dir /out \
    && cp /out/podmutator/bootstrap /podmutator \
    && cp /out/podmutator-exec/bootstrap /podmutator-exec

# distroless/static rather than scratch: it adds the CA bundle (/etc/ssl/certs), which rustls
# reads to verify Secrets Manager's certificate, and the nonroot user (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /podmutator /podmutator
COPY --from=build /podmutator-exec /podmutator-exec
USER 65532:65532
ENTRYPOINT ["/podmutator"]
CMD ["fetch"]
