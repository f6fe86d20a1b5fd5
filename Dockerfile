# kipam's container image: a static musl binary on distroless "static", running as the
# unprivileged user 65532. Build from the repository root:
#   docker build -t ghcr.io/kipam/kipam:0.1.0 .

FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
COPY . .
# Static: the runtime image has no C library.
ENV RUSTFLAGS="-C target-feature=+crt-static" CARGO_INCREMENTAL=0
RUN cargo build --release --locked --bin kipam \
 && cp target/release/kipam /kipam \
 && strip /kipam

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /kipam /usr/local/bin/kipam
# The addons and shared templates kipam ships (--addons-dir / --templates-dir in the chart).
COPY addons /usr/share/kipam/addons
COPY templates /usr/share/kipam/templates
USER 65532:65532
WORKDIR /usr/share/kipam
ENTRYPOINT ["/usr/local/bin/kipam"]
CMD ["controller"]
