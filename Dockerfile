# Concord's image: the release build of `concord` and etcdctl 3.5 (for the Helm chart's start
# script, hooks, backups and `helm test`) on a small Debian base, as a non-root user.
#   docker build -t concord:0.1.0 .
# The chart (charts/concord) runs it with a read-only root file system; data lives on the
# volume mounted at /var/lib/concord.

# The toolchain the project is built and tested with.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin concord

# etcdctl from etcd's own release image.
FROM gcr.io/etcd-development/etcd:v3.5.21 AS etcd

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 concord \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/concord --no-create-home concord \
    && mkdir -p /var/lib/concord && chown 10001:10001 /var/lib/concord
COPY --from=build /src/target/release/concord /usr/local/bin/concord
COPY --from=etcd /usr/local/bin/etcdctl /usr/local/bin/etcdctl
USER 10001:10001
WORKDIR /var/lib/concord
VOLUME /var/lib/concord
# Clients, peers, metrics (/metrics, /health, /livez, /readyz).
EXPOSE 2379 2380 2381
ENTRYPOINT ["concord"]
# A single member with etcd's defaults, reachable from outside the container.
CMD ["--data-dir=/var/lib/concord/data", \
     "--listen-client-urls=http://0.0.0.0:2379", "--advertise-client-urls=http://127.0.0.1:2379", \
     "--listen-peer-urls=http://0.0.0.0:2380", "--listen-metrics-urls=http://0.0.0.0:2381"]
