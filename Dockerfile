# podmutator's pod-side image: `podmutator fetch` (the init container of reference delivery)
# and `podmutator exec` (copied into the pod by fetch). One static binary, nothing else.
#
#   docker buildx build --platform linux/arm64,linux/amd64 -t <repo>:<tag> --push .
#
# The build stage runs on the builder's own platform and cross-compiles with zig (no QEMU
# emulation, which makes an arm64 release build ten times slower); musl makes the binary
# static, so the final image needs no libc.
ARG RUST_VERSION=1.95

FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-slim-bookworm AS build
ARG TARGETARCH
# zig pinned as in scripts/requirements/venv.txt (cargo-lambda uses the same one).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/* \
    && pip3 install --no-cache-dir --break-system-packages ziglang==0.17.1 cargo-zigbuild==0.24.0 \
    && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN case "$TARGETARCH" in \
        amd64) target=x86_64-unknown-linux-musl ;; \
        arm64) target=aarch64-unknown-linux-musl ;; \
        *) echo "unsupported TARGETARCH $TARGETARCH (build linux/amd64 or linux/arm64)" >&2; exit 1 ;; \
    esac \
    && cargo zigbuild --locked --release --bin podmutator --target "$target" \
    && cp "target/$target/release/podmutator" /podmutator

# distroless/static rather than scratch: it adds the CA bundle (/etc/ssl/certs), which rustls
# reads to verify Secrets Manager's certificate, and the nonroot user (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /podmutator /podmutator
USER 65532:65532
ENTRYPOINT ["/podmutator"]
CMD ["fetch"]
