# Build: docker build -t budgetscope .   Run: see docker-compose.yml
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p budgetscope && cp target/release/budgetscope /usr/local/bin/budgetscope

FROM debian:bookworm-slim
RUN useradd --system --home /data budgetscope && mkdir -p /data && chown budgetscope /data
COPY --from=build /usr/local/bin/budgetscope /usr/local/bin/budgetscope
USER budgetscope
WORKDIR /data
EXPOSE 4317 4318 8080
ENV BUDGETSCOPE_OTLP_GRPC_ADDR=0.0.0.0:4317 \
    BUDGETSCOPE_OTLP_HTTP_ADDR=0.0.0.0:4318 \
    BUDGETSCOPE_HTTP_ADDR=0.0.0.0:8080 \
    BUDGETSCOPE_DB=sqlite:///data/budgetscope.db
ENTRYPOINT ["budgetscope"]
CMD ["serve"]
